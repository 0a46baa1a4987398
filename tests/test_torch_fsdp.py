"""2 CPU processes, gloo, loopback, one spawn: stateremat's checkpoint around FSDP2 units (float64, bit for bit
against the unchecked model) and one plan for every rank (profile agrees; apply_plan refuses differing plans)."""
from __future__ import annotations

import pytest

from _dist import run_ranks


@pytest.mark.dist
def test_fsdp2_around_units_and_one_plan_for_every_rank(tmp_path):
    records = run_ranks("_torch_fsdp_worker.py", tmp_path, timeout=120)
    for rank, rec in enumerate(records):
        plans, card = rec.pop("plans"), rec.pop("profile")
        assert set(rec) == {f"{c}/{p}" for c in ("around", "sequential", "wrapped", "spanning") for p in ("whole", "region")}
        assert "error" not in plans and "error" not in card, (plans.get("error"), card.get("error"))
        assert plans["refused"] and "differs across the ranks" in plans["refused"], plans
        assert "ranks [0] vs ranks [1]" in plans["refused"] and "broadcast" in plans["refused"], plans
        assert plans["unwrapped"] and plans["applied"], plans  # refused before wrapping; equal plans applied
        assert card["same"], card  # ranks with different batch sizes hold one card (max over ranks)
        for cell, r in rec.items():
            assert "error" not in r, f"rank {rank} {cell}:\n{r.get('error')}"
            assert r["n_tensors"] == 16, (cell, r)
            assert r["equal"] and r["losses_equal"], (rank, cell, r)  # local shards and buffers, 3 SGD steps
            assert r["batches"] == [3, 3], (rank, cell, r)  # BatchNorm statistics updated once per step
            # one replay per checkpointed segment per backward: two units (checkpoint_sequential: its first chunk)
            assert r["replays"] == (3 if cell.startswith(("sequential", "spanning")) else 6), (rank, cell, r)
