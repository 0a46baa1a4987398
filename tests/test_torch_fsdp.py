"""2 CPU processes, gloo, loopback, one spawn: stateremat's checkpoint around FSDP2 units (float64, bit for bit
against the unchecked model) and one plan for every rank (profile agrees; apply_plan refuses differing plans)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.dist
def test_fsdp2_around_units_and_one_plan_for_every_rank(tmp_path):
    script = Path(__file__).with_name("_torch_fsdp_worker.py")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    errors = []
    for attempt in range(2):  # one retry: gloo's loopback set-up/tear-down aborts rarely, outside our code
        out = tmp_path / f"attempt{attempt}"
        out.mkdir()
        proc = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True,
                              text=True, timeout=120)
        if proc.returncode == 0:
            break
        errors.append(proc.stderr[-3000:])
    assert proc.returncode == 0, "\n---\n".join(errors)
    for rank in (0, 1):
        rec = json.loads((out / f"rank{rank}.json").read_text())
        plans, card = rec.pop("plans"), rec.pop("profile")
        assert set(rec) == {f"{c}/{p}" for c in ("around", "sequential", "wrapped") for p in ("whole", "region")}
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
            assert r["replays"] == (3 if cell.startswith("sequential") else 6), (rank, cell, r)
