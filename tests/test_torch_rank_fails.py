"""A rank that fails in ``profile``/``apply_plan`` before their cross-rank collectives makes the other
ranks raise, naming it, instead of hanging in the collective (issue 24): 2 CPU processes, gloo, bounded
in time (a hang fails the test at the spawn's timeout)."""
from __future__ import annotations

import pytest

from _dist import run_ranks


@pytest.mark.dist
def test_a_rank_failing_before_the_collective_makes_the_others_raise_not_hang(tmp_path):
    healthy, failing = run_ranks("_torch_rank_fails_worker.py", tmp_path, timeout=120)
    own = {"plan_check": ("ValueError", "'9'"), "profile_check": ("ValueError", "'9'"),
           "profile_step": ("KeyError", "ran dry")}
    for name, (kind, text) in own.items():
        assert failing[name].get("error_type") == kind and text in failing[name]["error_message"], failing[name]
        r = healthy[name]
        assert r.get("error_type") == "RuntimeError", (name, r)
        msg = r["error_message"]
        assert "rank(s) [1]" in msg and "instead of waiting for them" in msg and "Tip: fix the error" in msg, msg
        assert ("apply_plan" if name == "plan_check" else "stateremat.torch.profile") in msg, msg
    for rec in (healthy, failing):  # the group is still in step
        assert rec["in_step"] == {"same": True, "wrapped": True}, rec["in_step"]


@pytest.mark.dist
@pytest.mark.parametrize("engine", ["ddp", "fsdp", "allreduce", "subgroup"])
def test_a_rank_whose_step_raises_in_a_model_with_its_own_collectives_ends_the_others_not_hangs(tmp_path, engine):
    """DDP / FSDP2 (or a plain model whose ``step_fn`` all-reduces its loss, failing in its second
    call): rank 1's ``step_fn`` raises while rank 0 waits in the framework's (the step's) collective. Rank 1
    raises its own error at once (it waited in an all-gather of ours no other rank was in: a hang,
    or gloo's collective-mismatch abort) and, its process ended, rank 0's collective fails, as without
    stateremat: each rank raises within seconds, well before the group's 60 s timeout."""
    import json
    import subprocess
    import sys

    from _dist import TESTS

    env = dict(__import__("os").environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, str(TESTS / "_torch_rank_dies_worker.py"), str(tmp_path), engine],
                   env=env, capture_output=True, text=True, timeout=180)
    failing = json.loads((tmp_path / "rank1.json").read_text())
    assert failing["error_type"] == "KeyError" and "ran dry" in failing["error_message"], failing
    assert failing["seconds"] < 20, failing
    healthy = json.loads((tmp_path / "rank0.json").read_text())  # written: rank 0 did not hang
    assert healthy["error_type"] is not None and healthy["seconds"] < 30, healthy
