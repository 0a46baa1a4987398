"""``profile`` and ``auto_checkpoint`` leave a DDP or FSDP2 model as it was, FSDP2's own state included
(issue 24, item 4): 2 CPU processes, gloo, loopback, one spawn, float64, bit for bit."""
from __future__ import annotations

import pytest

from _dist import run_ranks


@pytest.mark.dist
def test_profile_and_auto_checkpoint_leave_ddp_and_fsdp2_models_as_they_were(tmp_path):
    records = run_ranks("_torch_profile_leaves_worker.py", tmp_path, timeout=240)
    cells = {f"{e}/{a}/{w}" for e in ("ddp", "fsdp") for a in ("profile", "auto_checkpoint")
             for w in ("fresh", "nograd", "stepped", "nosync")}
    for rank, rec in enumerate(records):
        assert set(rec) == cells, sorted(rec)
        for name, r in rec.items():
            assert "error" not in r, f"rank {rank} {name}:\n{r.get('error')}"
            # every parameter, gradient and buffer bound and valued as before; FSDP2's sharded state, bindings
            # and shards as before (its one-time lazy init, if not yet run, stays); the generator's state too
            assert r["changed"] == [] and r["fsdp_equal"] and r["rng_equal"], (rank, name, r)
            # then 3 SGD steps equal the never-profiled model bit for bit (auto_checkpoint: under its plan)
            assert r["n_tensors"] == 16 and r["equal"] and r["losses_equal"], (rank, name, r)
            assert r["batches"] == [3 + (name.endswith(("nograd", "stepped")))] * 2, (rank, name, r)
            if "auto_checkpoint" in name:  # a plan that checkpoints something
                assert set(r["plan"]) - {"eager"}, (rank, name, r)
