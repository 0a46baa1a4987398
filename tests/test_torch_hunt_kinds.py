"""Kinds a user hunt found wrong, each checked bit for bit against eager over 3 float64 SGD steps.

``parametrize.cached()`` around a forward that calls one parametrized module in two segments:
the second segment's forward reads the tensor the first computed (from the cache), so its
replay must too; before, the replay ran outside the cache, recomputed the parametrization (a
spectral norm's power iteration: more saved tensors) and backward raised a metadata mismatch
whose tip ("declare the state") could not help. Likewise a backward run inside a ``cached()``
block must not read that block's cache when the forward read none.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm

from stateremat.torch import StatefulCheckpoint, checkpoint

D = 6


class Sym(nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Module()
    lin = nn.Linear(D, D, dtype=torch.float64)
    m.l = spectral_norm(lin) if kind == "spectral" else parametrize.register_parametrization(lin, "weight", Sym())
    return m


def _runner(how: str, preserve: str, strict: bool):
    wrappers: dict[int, StatefulCheckpoint] = {}

    def run(mod, x):
        if how == "eager":
            return mod(x)
        state = {"checkpoint": "buffers", "stateful": "buffers", "nested": [mod]}[how] if strict else "auto"
        if how == "checkpoint":
            return checkpoint(mod, x, preserve=preserve, state=state)
        if how == "stateful":
            w = wrappers.setdefault(id(mod), StatefulCheckpoint(mod, state=state, preserve=preserve))
            return w(x)
        return checkpoint(lambda t: checkpoint(mod, t, preserve=preserve, state=state), x,
                          preserve=preserve, state=state)
    return run


def _two_segments(m, x, run):
    with parametrize.cached():  # the module is used twice: its weight is computed once
        h = F.dropout(torch.tanh(run(m.l, x)), 0.3)
        return run(m.l, h).pow(2).sum()


def _backward_in_cache(m, x, run):
    loss = run(m.l, x).pow(2).sum()  # forward without a cache ...
    with parametrize.cached():
        extra = m.l(x).sum()  # ... the block's cache now holds the weight
        return loss, extra


def _train(kind: str, body, run) -> list:
    m = _model(kind)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    torch.manual_seed(1)
    record = []
    for step in range(3):
        x = torch.randn(4, D, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
        opt.zero_grad(set_to_none=True)
        if body is _backward_in_cache:
            loss, extra = body(m, x, run)
            with parametrize.cached():
                m.l(x)  # fills this block's cache before the backward replays
                (loss + extra).backward()
        else:
            loss = body(m, x, run)
            loss.backward()
        record.append((loss.detach().clone(), {n: p.grad.clone() for n, p in m.named_parameters()},
                       {k: v.clone() for k, v in m.state_dict().items()}, torch.get_rng_state()))
        opt.step()
    record.append({k: v.clone() for k, v in m.state_dict().items()})
    return record


def _assert_same(ref: list, got: list) -> None:
    for (l0, g0, s0, r0), (l1, g1, s1, r1) in zip(ref[:-1], got[:-1]):
        assert torch.equal(l0, l1)
        assert g0.keys() == g1.keys() and all(torch.equal(g0[k], g1[k]) for k in g0)
        assert s0.keys() == s1.keys() and all(torch.equal(s0[k], s1[k]) for k in s0)
        assert torch.equal(r0, r1)
    assert all(torch.equal(ref[-1][k], got[-1][k]) for k in ref[-1])


@pytest.mark.parametrize("strict", [False, True], ids=["auto", "strict"])
@pytest.mark.parametrize("preserve", ["region", "whole"])
@pytest.mark.parametrize("how", ["checkpoint", "stateful", "nested"])
@pytest.mark.parametrize("kind", ["spectral", "symmetric"])
def test_cached_parametrization_in_two_segments_is_eager(kind, how, preserve, strict):
    ref = _train(kind, _two_segments, _runner("eager", preserve, strict))
    _assert_same(ref, _train(kind, _two_segments, _runner(how, preserve, strict)))


@pytest.mark.parametrize("preserve", ["region", "whole"])
@pytest.mark.parametrize("how", ["checkpoint", "stateful", "nested"])
def test_backward_inside_cached_replays_without_its_cache(how, preserve):
    ref = _train("spectral", _backward_in_cache, _runner("eager", preserve, False))
    _assert_same(ref, _train("spectral", _backward_in_cache, _runner(how, preserve, False)))


def test_replay_leaves_the_callers_cache_as_it_was():
    m = _model("spectral")
    x = torch.randn(4, D, dtype=torch.float64)
    loss = checkpoint(m.l, x).pow(2).sum()
    with parametrize.cached():
        w = m.l.weight  # cached now
        loss.backward()
        assert parametrize._cache_enabled == 1 and m.l.weight is w
    assert parametrize._cache_enabled == 0 and parametrize._cache == {}
