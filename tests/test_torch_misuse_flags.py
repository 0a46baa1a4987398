"""Issue 28 items 5 and 6: torch API options refused at the call with stateremat's own error: a
``granularity_bytes`` past 64-bit offsets (was a bare OverflowError at the first journaled
write), ``verify``/``debug`` that are not bools (were taken by truth value), and
``StatefulCheckpoint(function, state="buffers")`` (blamed ``state=``, not the block)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from stateremat.torch import Checkpointer, StatefulCheckpoint, checkpoint


def _writes(q):
    def f(x):
        q.add_(1.0)  # a journaled write of declared state
        return (x * 2).sum()
    return f


@pytest.mark.parametrize("g", [2**62 + 1, 2**63, 2**70])
def test_a_granularity_past_64_bit_offsets_is_refused_at_the_call(g):
    q, x = torch.zeros(1 << 10), torch.randn(4, requires_grad=True)
    with pytest.raises(ValueError, match=r"granularity_bytes must be at most 2\*\*62.*Tip:"):
        checkpoint(_writes(q), x, state=[q], preserve="region", granularity_bytes=g)
    with pytest.raises(ValueError, match=r"at most 2\*\*62"):
        Checkpointer(granularity_bytes=g)
    with pytest.raises(ValueError, match=r"at most 2\*\*62"):
        StatefulCheckpoint(nn.Linear(2, 2), granularity_bytes=g)
    assert q.sum() == 0  # refused before the segment ran


def test_the_largest_granularity_still_runs():
    q, x = torch.zeros(1 << 10), torch.randn(4, requires_grad=True)
    checkpoint(_writes(q), x, state=[q], preserve="region", granularity_bytes=2**62).backward()
    assert torch.equal(q, torch.ones_like(q))


@pytest.mark.parametrize("value", ["yes", 2, 0, None, 1.0])
@pytest.mark.parametrize("option", ["verify", "debug"])
def test_switches_must_be_bools(option, value):
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(TypeError, match=rf"checkpoint: {option} must be True or False"):
        checkpoint(lambda t: (t * 2).sum(), x, **{option: value})
    if option == "verify":
        with pytest.raises(TypeError, match=r"Checkpointer: verify must be True or False"):
            Checkpointer(verify=value)
        with pytest.raises(TypeError, match=r"StatefulCheckpoint: verify must be True or False"):
            StatefulCheckpoint(nn.Linear(4, 4), verify=value)
    else:
        with pytest.raises(TypeError, match=r"checkpoint: debug must be True or False"):
            Checkpointer()(lambda t: (t * 2).sum(), x, debug=value)


def test_bool_switches_still_work():
    x = torch.randn(4, requires_grad=True)
    checkpoint(lambda t: (t * 2).sum(), x, verify=True, debug=False).backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


def test_buffers_of_a_block_that_is_not_a_module():
    def f(x):
        return (x * 2).sum()

    with pytest.raises(TypeError, match=r"state='buffers'.*block must be an nn\.Module, got function"):
        StatefulCheckpoint(f, state="buffers")
    x = torch.randn(4, requires_grad=True)
    StatefulCheckpoint(f)(x).backward()  # a plain function with state="auto" still runs
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
