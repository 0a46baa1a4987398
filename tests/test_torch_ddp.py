"""StatefulCheckpoint under DistributedDataParallel: 2 CPU processes, gloo, loopback."""
from __future__ import annotations

import pytest

from _dist import run_ranks


@pytest.mark.dist
def test_ddp_two_processes_match_the_unchecked_model(tmp_path):
    for rec in run_ranks("_torch_ddp_worker.py", tmp_path, timeout=180):
        assert rec["n_tensors"] == 16
        assert rec["max_abs_diff"] < 1e-6, rec  # params after 2 SGD steps and BatchNorm buffers
        assert rec["recompute_counts"] == [2, 2]  # one replay per block per backward
        assert rec["num_batches_tracked"] == 2
