"""Coroutines and async generators a segment advances (issue 25): replayed as eager, or refused.

The kind: a forward that drives a coroutine or async generator that existed before it
(``coro.send(None)``, ``agen.asend(None).send(None)``, a ``types.coroutine`` generator's
``send(None)``). Before, the scan did not watch them: the replay advanced it again and read the
next value (silently wrong gradients from the first step, and the coroutine one step ahead of
eager; strict mode did not refuse it). Now they are watched like generators (the profile hook of
``stateremat.torch._iterators`` sees each resume of their frames): under ``state="auto"`` the
forward keeps its activations, strict mode refuses it naming the coroutine, with a tip a test
follows. Each case is compared bit for bit with no checkpointing in float64 over three steps
(outputs, gradients, and the coroutine's next value) over both preservers, ``checkpoint`` with
and without early stop, nested checkpoints and ``StatefulCheckpoint``.
"""
from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from stateremat.torch import ReplayError, StatefulCheckpoint, UnsupportedError, checkpoint, is_replaying

D = torch.float64
PRESERVERS = ["whole", "region"]
MODES = ["plain", "plain-no-early-stop", "nested", "stateful"]
STEPS = 3


@types.coroutine
def _suspend(v):
    return (yield v)


async def _counting_coroutine():
    t = torch.zeros(4, dtype=D)
    while True:
        t = t + 1
        await _suspend(t)


async def _awaiting_coroutine():
    await _counting_coroutine()  # (the inner coroutine's resumes go through this one's frame)


async def _counting_async_generator():
    t = torch.zeros(4, dtype=D)
    while True:
        t = t + 1
        yield t


@types.coroutine
def _generator_coroutine():
    t = torch.zeros(4, dtype=D)
    while True:
        t = t + 1
        yield t


def _asend(agen):
    """One step of an async generator without an event loop: its value, from ``StopIteration``."""
    try:
        agen.asend(None).send(None)
    except StopIteration as e:
        return e.value
    raise AssertionError("an async generator step that did not finish")


def _send(coro):
    return coro.send(None)


#: kind -> (a fresh one, how one step advances it and reads its value)
KINDS = {
    "coroutine": (_counting_coroutine, _send),
    "coroutine awaiting a coroutine": (_awaiting_coroutine, _send),
    "async generator": (_counting_async_generator, _asend),
    "types.coroutine generator": (_generator_coroutine, _send),
}
_WHAT = {"coroutine": "coroutine '_counting_coroutine'",
         "coroutine awaiting a coroutine": "coroutine '_awaiting_coroutine'",
         "async generator": "async generator '_counting_async_generator'",
         "types.coroutine generator": "generator '_generator_coroutine'"}


class _Wrap(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _run(kind: str, mode: str, preserve: str = "region", **kw):
    """``STEPS`` steps of ``sin(lin(x) * step(c))``: outputs and gradients, then ``c``'s next value."""
    torch.manual_seed(0)
    make, step = KINDS[kind]
    lin, c = nn.Linear(4, 4).to(D), make()

    def fn(x):
        return torch.sin(lin(x) * step(c))
    kw = dict(preserve=preserve, **kw)
    wrapped = StatefulCheckpoint(_Wrap(fn), **kw) if mode == "stateful" else None
    out = []
    for s in range(STEPS):
        lin.zero_grad()
        x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(s))
        if mode == "eager":
            y = fn(x)
        elif mode == "stateful":
            y = wrapped(x)
        elif mode == "nested":
            y = checkpoint(lambda z: checkpoint(fn, z, **kw) * 1.0, x, **kw)
        else:
            y = checkpoint(fn, x, early_stop=mode == "plain", **kw)
        y.pow(2).sum().backward()
        out += [y.detach().clone(), lin.weight.grad.clone()]
    return out + [step(c)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_forward_that_advances_a_coroutine_runs_as_eager_under_auto(kind, preserve, mode):
    """``state="auto"``: eager's outputs, gradients and the coroutine's next value, bit for bit."""
    want, got = _run(kind, "eager"), _run(kind, mode, preserve)
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), f"entry {i} differs from eager"


@pytest.mark.parametrize("strict", [dict(state=None), dict(state=[], on_undeclared="raise")], ids=["None", "raise"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_strict_mode_refuses_a_forward_that_advances_a_coroutine(kind, mode, strict):
    """Strict mode: refused naming it (what, where, how seen), with the tip for a coroutine."""
    with pytest.raises(UnsupportedError) as e:
        _run(kind, mode, **strict)
    msg = str(e.value)
    assert f"advanced {_WHAT[kind]} (captured variable 'c': resumed by" in msg, msg
    assert "a coroutine: v = coro.send(None) outside it, then checkpoint(f, x, v)" in msg, msg


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_tip_advances_it_outside_and_passes_the_value(kind, state):
    """The tip followed (``v = coro.send(None)`` outside, ``checkpoint(f, x, v)``): eager's results."""
    def run(ckpt: bool):
        torch.manual_seed(0)
        make, step = KINDS[kind]
        lin, c = nn.Linear(4, 4).to(D), make()

        def f(x, v):
            return torch.sin(lin(x) * v)
        out = []
        for s in range(STEPS):
            lin.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(s))
            v = step(c)
            y = checkpoint(f, x, v, state=state) if ckpt else f(x, v)
            y.pow(2).sum().backward()
            out += [y.detach().clone(), lin.weight.grad.clone()]
        return out + [step(c)]
    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_replay_that_advances_a_coroutine_its_forward_did_not_is_refused(kind, state):
    """Only the replay advances it (``is_replaying()``): ``ReplayError`` at the backward, naming it."""
    make, step = KINDS[kind]
    lin, c = nn.Linear(4, 4).to(D), make()
    step(c)  # (started: a live frame)
    const = torch.full((4,), 7.0, dtype=D)

    def f(x):
        return torch.sin(lin(x) * (step(c) if is_replaying() else const))
    y = checkpoint(f, torch.ones(3, 4, dtype=D), state=state)
    with pytest.raises(ReplayError, match=f"its replay advanced {_WHAT[kind]} \\(captured variable 'c'"):
        y.pow(2).sum().backward()


def test_a_reached_coroutine_left_alone_still_replays():
    """Reaching a live coroutine costs no activations: a forward that leaves it alone replays."""
    lin, c = nn.Linear(4, 4).to(D), _counting_coroutine()
    _send(c)
    use = [False]

    def f(x):
        return lin(x) * (_send(c) if use[0] else 2.0)
    block = StatefulCheckpoint(_Wrap(f))
    block(torch.ones(3, 4, dtype=D)).sum().backward()
    assert block.recompute_count == 1
    use[0] = True
    block(torch.ones(3, 4, dtype=D)).sum().backward()
    assert block.recompute_count == 1  # kept its activations
    assert torch.equal(_send(c), torch.full((4,), 3.0, dtype=D))


_CORO = None


class _HoldsCoroutine(nn.Module):
    def __init__(self, lin, c):
        super().__init__()
        self.lin, self.c = lin, c

    def forward(self, x):
        return torch.sin(self.lin(x) * _send(self.c))


def _global_coroutine_fn(lin):
    def fn(x):
        return torch.sin(lin(x) * _send(_CORO))  # a global the segment's code loads
    return fn


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("holder", ["global", "module attribute", "dict"])
def test_every_place_the_scan_finds_a_coroutine(holder, state):
    """A global, a module attribute, a dict: the default runs the forward as eager (exact over three
    steps, the coroutine where eager leaves it), strict mode refuses it."""
    global _CORO

    def run(ckpt: bool):
        global _CORO
        torch.manual_seed(0)
        lin, c = nn.Linear(4, 4).to(D), _counting_coroutine()
        if holder == "global":
            _CORO = c
            fn = _global_coroutine_fn(lin)
        elif holder == "module attribute":
            fn = _HoldsCoroutine(lin, c)
        else:
            held = {"c": c}

            def fn(x):
                return torch.sin(lin(x) * _send(held["c"]))
        out = []
        for s in range(STEPS):
            lin.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(s))
            y = checkpoint(fn, x, state=state) if ckpt else fn(x)
            y.pow(2).sum().backward()
            out += [y.detach().clone(), lin.weight.grad.clone()]
        return out + [_send(c)]
    try:
        if state is None:
            with pytest.raises(UnsupportedError, match="advanced coroutine '_counting_coroutine'"):
                run(True)
            return
        assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))
    finally:
        _CORO = None
