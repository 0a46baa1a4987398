"""One focused test per kind of deliberate bug the suite used to miss (issue 27, item 5).

Each test here was checked against its bug: the bug put into the source on purpose, the test
run and seen to fail, the source restored and the test seen to pass (the commit that added the
test names the bug). Storages are above ``SMALL_STORAGE_BYTES`` (or the threshold is lowered
for the test) wherever the region journal is what is under test: a smaller storage is kept by a
whole snapshot under ``region`` and never builds a journal.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _journal import JournalSpy
from stateremat.torch import UndeclaredStateError, checkpoint, is_replaying, preservation_stats
from stateremat.torch._txn import SMALL_STORAGE_BYTES

D = torch.float64
#: float64 elements of a storage journaled under region (above SMALL_STORAGE_BYTES)
BIG = SMALL_STORAGE_BYTES // 8 + 64
SIZES = {"small": 64, "journaled": BIG}


def _same(got, want) -> bool:
    return all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(got, want))


# --- the replay's bindings and a changed dtype ------------------------------------------------

@pytest.mark.parametrize("mode", ["whole", "region"])
@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("when", ["in_forward", "before_backward"])
@pytest.mark.parametrize("declared", [True, False])
def test_a_tensor_reviewed_as_another_dtype_is_replayed_through_the_forwards_dtype(declared, when, size, mode):
    """``q.data = q.data.view(torch.int64)`` (same bytes, offset, size and stride: only the dtype
    differs) in the forward or before the backward: the replay must read ``q`` as float64."""
    def run(ckpt):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(SIZES[size], dtype=D, generator=g)
        x = torch.randn(SIZES[size], dtype=D, generator=g, requires_grad=True)

        def seg(x):
            y = (x * q.clone()).sin().sum()
            if when == "in_forward":
                q.data = q.data.view(torch.int64)
            return y

        y = seg(x) if ckpt is None else checkpoint(seg, x, state=[q] if declared else [], preserve=ckpt)
        if when == "before_backward":
            q.data = q.data.view(torch.int64)
        y.backward()
        return x.grad, q.dtype, q.view(D).clone()

    assert _same(run(mode), run(None))
