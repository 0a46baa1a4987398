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
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        rec = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert rec["n_tensors"] == 16
        assert rec["max_abs_diff"] < 1e-6, rec  # params after 2 SGD steps and BatchNorm buffers
        assert rec["recompute_counts"] == [2, 2]  # one replay per block per backward
        assert rec["num_batches_tracked"] == 2
