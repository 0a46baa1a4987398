"""StatefulCheckpoint under DistributedDataParallel: 2 CPU processes, gloo, loopback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.dist
def test_ddp_two_processes_match_the_unchecked_model(tmp_path):
    script = Path(__file__).with_name("_torch_ddp_worker.py")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    errors = []
    for attempt in range(2):  # one retry: gloo's loopback set-up/tear-down aborts rarely, outside our code
        out = tmp_path / f"attempt{attempt}"
        out.mkdir()
        proc = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True,
                              text=True, timeout=180)
        if proc.returncode == 0:
            break
        errors.append(proc.stderr[-3000:])
    assert proc.returncode == 0, "\n---\n".join(errors)
    for rank in (0, 1):
        rec = json.loads((out / f"rank{rank}.json").read_text())
        assert rec["n_tensors"] == 16
        assert rec["max_abs_diff"] < 1e-6, rec  # params after 2 SGD steps and BatchNorm buffers
        assert rec["recompute_counts"] == [2, 2]  # one replay per block per backward
        assert rec["num_batches_tracked"] == 2
