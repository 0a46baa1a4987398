"""Nested default segments reaching state they do not read (issue 25, found by an attack).

An inner segment reached the outer module through ``self`` (a method, or a lambda closing over
it) and so its scan reached a BatchNorm the outer segment runs after it. The inner watch's own
fingerprint reads ran under the outer's watched first forward, which took them for the forward's
reads: the first checkpointed step's backward was refused (``ReplayError``: the inner segment
"read" the BatchNorm's batch counter the outer wrote). Our checks' ops are now not the
forward's reads; every step equals eager bit for bit.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from stateremat.torch import StatefulCheckpoint, checkpoint

D = torch.float64


def _block() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Tanh())


class _Model(nn.Module):
    def __init__(self, how: str, preserve: str, early_stop: bool):
        super().__init__()
        self.a, self.b, self.c = _block(), nn.Linear(4, 4), _block()
        self.how, self.kw = how, {"preserve": preserve, "early_stop": early_stop}

    def inner(self, g):
        return self.b(self.a(g))

    def outer(self, h):
        return self.c(checkpoint(self.inner, h, **self.kw))

    def forward(self, x, ck: bool):
        if not ck:
            return self.b(self.a(self.c(x))) if self.how == "inner_last" else self.c(self.b(self.a(x)))
        kw = self.kw
        if self.how == "methods":
            return checkpoint(self.outer, x, **kw)
        if self.how == "lambdas":
            return checkpoint(lambda h: self.c(checkpoint(lambda g: self.b(self.a(g)), h, **kw)), x, **kw)
        if self.how == "inner_last":  # the BatchNorm the inner reaches runs before it
            return checkpoint(lambda h: checkpoint(self.inner, self.c(h), **kw), x, **kw)
        if self.how == "three_levels":
            return checkpoint(lambda h: self.c(checkpoint(lambda g: checkpoint(self.inner, g, **kw), h, **kw)), x, **kw)
        if self.how == "stateful_outer":
            return self._wrapped(x)
        raise AssertionError(self.how)


@pytest.mark.parametrize("how", ["methods", "lambdas", "inner_last", "three_levels", "stateful_outer"])
@pytest.mark.parametrize("preserve", ["region", "whole"])
@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_segments_reaching_unread_state_equal_eager_from_the_first_step(how, preserve, early_stop):
    results = []
    for ck in (False, True):
        torch.manual_seed(0)
        m = _Model(how, preserve, early_stop).to(D)
        if how == "stateful_outer":
            object.__setattr__(m, "_wrapped", StatefulCheckpoint(m.outer, preserve=preserve))
        x = torch.randn(6, 4, dtype=D, generator=torch.Generator().manual_seed(1))
        steps = []
        for step in range(3):
            xi = (x + step).requires_grad_()
            m(xi, ck).pow(2).sum().backward()
            steps.append([xi.grad] + [p.grad.clone() for p in m.parameters()] + [b.clone() for b in m.buffers()])
            m.zero_grad()
        results.append(steps)
    for eager, ours in zip(*results):
        assert all(torch.equal(a, b) for a, b in zip(eager, ours))
