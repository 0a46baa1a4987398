"""``whole`` copies each byte of a storage once per step of the transaction (issue 26, item 2).

Counted by patching ``Tensor.copy_`` and ``Tensor.clone`` (calls made by library frames only):
per segment, one copy each for the snapshot (forward begins), the visible bytes set aside and
``B0`` put back (replay begins), and the visible bytes put back (reinstatement). Large CPU
storages copy into reused buffers, so a steady-state step allocates no buffer of the storage's
size (a fresh one is pages the copy faults in). Sharing a snapshot with an enclosing segment
(adoption) keeps the buffer out of reuse until both are done: bytes and gradients equal eager's.
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys

import pytest
import torch
from torch import nn

import stateremat
from stateremat.torch import checkpoint
from stateremat.torch._preserve import whole

LIB = os.path.dirname(os.path.abspath(stateremat.__file__)) + os.sep
N = 1 << 18  # float32: a 1 MiB buffer, above whole.POOL_MIN_BYTES


@contextlib.contextmanager
def counting(*names):
    """Count calls of ``torch.Tensor.<name>``/``torch.<name>`` made by library frames, by name."""
    counts: collections.Counter = collections.Counter()
    saved = []

    def wrap(name, orig):
        def f(*a, **k):
            if sys._getframe(1).f_code.co_filename.startswith(LIB):
                counts[name] += 1
            return orig(*a, **k)
        return f
    for n in names:
        owner = torch if n.startswith("torch.") else torch.Tensor
        attr = n.split(".")[-1]
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, wrap(n, getattr(owner, attr)))
    try:
        yield counts
    finally:
        for owner, attr, v in reversed(saved):
            setattr(owner, attr, v)


class _Big(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("q", torch.zeros(N))

    def forward(self, x):
        self.q[: x.numel()].add_(x.detach().reshape(-1))
        return self.lin(x) * self.q[:16].sum()


def _step(m, x):
    checkpoint(m, x, state="buffers", preserve="whole").square().sum().backward()


def test_a_whole_segment_copies_its_storage_four_times_into_reused_buffers():
    torch.manual_seed(0)
    m = _Big()
    for _ in range(3):
        _step(m, torch.randn(4, 16, requires_grad=True))
    with counting("copy_", "clone", "torch.empty_like") as c:
        _step(m, torch.randn(4, 16, requires_grad=True))
    # snapshot, visible set aside, B0 put back, visible put back: each one copy of the storage
    assert c["copy_"] + c["clone"] == 4, dict(c)
    assert c["clone"] == 0 and c["torch.empty_like"] == 0, dict(c)  # reused buffers in steady state


def _eager_and_ours(make, steps=3, retain=False):
    torch.manual_seed(0)
    ref, ours = make(), make()
    ours.load_state_dict(ref.state_dict())
    for i in range(steps):
        x = torch.randn(4, 16)
        y_ref = ref(x).square().sum()
        y = ours.run(x).square().sum()
        y_ref.backward(retain_graph=retain)
        y.backward(retain_graph=retain)
        if retain:  # a second backward replays again, from the same snapshot
            y_ref.backward()
            y.backward()
        assert torch.equal(ref.a.q, ours.a.q) and torch.equal(ref.b.q, ours.b.q)
        for p, q in zip(ref.parameters(), ours.parameters()):
            assert torch.equal(p.grad, q.grad), i


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Big(), _Big()

    def forward(self, x):
        return self.b(self.a(x))

    def run(self, x):
        def outer(x):
            return self.b(checkpoint(self.a, x, state="buffers", preserve="whole"))
        return checkpoint(outer, x, state=[self.b], preserve="whole")


@pytest.mark.parametrize("retain", [False, True])
def test_adopted_snapshots_in_reused_buffers_replay_as_eager(retain):
    _eager_and_ours(_Nested, retain=retain)
    # every spare buffer left in the pool is free: none is a live snapshot's
    assert all(len(v) <= whole._POOL_SPARES for v in whole._POOL.spare.values())
