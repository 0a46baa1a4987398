"""Issue 28 items 5 and 6: torch API options refused at the call with stateremat's own error: a
``granularity_bytes`` past 64-bit offsets (was a bare OverflowError at the first journaled
write), ``verify``/``debug`` that are not bools (were taken by truth value), and
``StatefulCheckpoint(function, state="buffers")`` (blamed ``state=``, not the block)."""
from __future__ import annotations

import contextlib

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


@pytest.mark.parametrize("value", ["yes", "no", 2, 0, None, 1.0])
@pytest.mark.parametrize("option", ["verify", "debug", "early_stop", "preserve_rng_state"])
def test_switches_must_be_bools(option, value):
    """A switch given by another type is refused (``early_stop="no"`` was taken as True) before
    the segment runs, wherever the switch can be given."""
    x = torch.randn(4, requires_grad=True)
    runs = []
    with pytest.raises(TypeError, match=rf"checkpoint: {option} must be True or False"):
        checkpoint(lambda t: runs.append(1) or (t * 2).sum(), x, **{option: value})
    assert not runs
    if option == "preserve_rng_state":
        with pytest.raises(TypeError, match=r"StatefulCheckpoint: preserve_rng_state must be True or False"):
            StatefulCheckpoint(nn.Linear(4, 4), preserve_rng_state=value)
        with pytest.raises(TypeError, match=r"apply_plan: preserve_rng_state must be True or False"):
            from stateremat.torch import apply_plan
            apply_plan(nn.Sequential(nn.Linear(4, 4)), {"segment_names": ["0"], "options": ["whole"]},
                       preserve_rng_state=value)
    elif option == "verify":
        with pytest.raises(TypeError, match=r"Checkpointer: verify must be True or False"):
            Checkpointer(verify=value)
        with pytest.raises(TypeError, match=r"StatefulCheckpoint: verify must be True or False"):
            StatefulCheckpoint(nn.Linear(4, 4), verify=value)
    else:
        with pytest.raises(TypeError, match=r"checkpoint: debug must be True or False"):
            Checkpointer()(lambda t: (t * 2).sum(), x, debug=value)


def test_bool_switches_still_work():
    x = torch.randn(4, requires_grad=True)
    checkpoint(lambda t: (t * 2).sum(), x, verify=True, debug=False, early_stop=False,
               preserve_rng_state=True).backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


@pytest.mark.parametrize("context_fn, phrase", [
    (3, "context_fn must be a function returning two context managers"),
    (lambda: 3, "context_fn must return two context managers"),
    (lambda: (contextlib.nullcontext(),), "context_fn must return two context managers"),
    (lambda: (contextlib.nullcontext(), 5), "context_fn must return two context managers"),
])
def test_a_bad_context_fn_is_refused_with_a_tip_that_works(context_fn, phrase):
    """Before: torch's bare "'int' object is not callable" / "cannot unpack". The tip's pair of
    contexts then runs and gives eager's gradient."""
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match=phrase + ".*Tip:"):
        checkpoint(lambda t: (t.sin() * 2).sum(), x, context_fn=context_fn)
    checkpoint(lambda t: (t.sin() * 2).sum(), x,
               context_fn=lambda: (contextlib.nullcontext(), contextlib.nullcontext())).backward()
    assert torch.equal(x.grad, 2 * x.detach().cos())


def test_buffers_of_a_block_that_is_not_a_module():
    def f(x):
        return (x * 2).sum()

    with pytest.raises(TypeError, match=r"state='buffers'.*block must be an nn\.Module, got function"):
        StatefulCheckpoint(f, state="buffers")
    x = torch.randn(4, requires_grad=True)
    StatefulCheckpoint(f)(x).backward()  # a plain function with state="auto" still runs
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
