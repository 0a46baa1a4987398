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
