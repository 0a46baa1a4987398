"""Iterators and generators a segment advances (issue 25): replayed as eager, or refused, never wrong.

The kind: a segment that calls ``next()`` on an iterator or generator that existed before it
(``x * next(g)``). Before, its replay called ``next()`` again and read the next value: silently
wrong gradients from the first step, and the iterator one step ahead of eager (torch's checkpoint
does the same). Now the forward is watched (``stateremat.torch._iterators``): under
``state="auto"`` a forward that advances one keeps its activations (exact, as eager), strict mode
refuses it naming the iterator, and a replay that advances one its forward did not raises
``ReplayError``. Each case is compared bit for bit with no checkpointing in float64 over three
steps (outputs, gradients, and the value the iterator yields next), over both preservers,
``checkpoint`` / ``StatefulCheckpoint`` / nested checkpoints, the default and strict mode, and
every place the scan finds an iterator (closure cell, global, default argument, module
attribute, list, dict, plain object).
"""
from __future__ import annotations

import cProfile
import itertools
import sys

import pytest
import torch
from torch import nn

from stateremat.torch import (
    ReplayError,
    StatefulCheckpoint,
    UndeclaredStateWarning,
    UnsupportedError,
    checkpoint,
    is_replaying,
)

D = torch.float64
PRESERVERS = ["whole", "region"]
MODES = ["plain", "plain-no-early-stop", "nested", "stateful"]
STEPS = 3


def _full(k) -> torch.Tensor:
    return torch.full((4,), float(k), dtype=D)


def _counting_generator():
    t = torch.zeros(4, dtype=D)
    while True:
        t = t + 1
        yield t


def _repeating_generator():
    # resumed at the same yield with the same local (the same tensor object) on its first two
    # steps: only a resume hook tells the second next() happened (frame and locals look unchanged)
    a, b = _full(1), _full(2)
    for t in (a, a, b, b, _full(3), _full(3), _full(4)):
        yield t


def _delegating_generator():
    yield from _counting_generator()


#: kind -> a fresh iterator whose values (tensors or numbers) differ from step to step.
KINDS = {
    "generator": _counting_generator,
    "generator, repeated values": _repeating_generator,
    "generator, yield from": _delegating_generator,
    "generator expression": lambda: (_full(k) for k in range(1, 20)),
    "iter(list)": lambda: iter([_full(k) for k in range(1, 20)]),
    "iter(tuple)": lambda: iter(tuple(_full(k) for k in range(1, 20))),
    "reversed(list)": lambda: reversed([_full(k) for k in range(1, 20)]),
    "iter(range)": lambda: iter(range(1, 20)),
    "iter(dict.values())": lambda: iter({k: _full(k) for k in range(1, 20)}.values()),
    "iter(set)": lambda: iter({1.5, 2.5, 3.5, 4.5, 5.5, 6.5}),
    "enumerate": lambda: (t * (i + 1) for i, t in enumerate([_full(1)] * 20)),
    "itertools.count": lambda: itertools.count(1),
    "itertools.cycle": lambda: itertools.cycle([_full(1), _full(2), _full(3), _full(5)]),
    "zip": lambda: zip([_full(k) for k in range(1, 20)], range(20)),
}


def _value(v):
    return v[0] if isinstance(v, tuple) else v


class _Wrap(nn.Module):
    """A module whose forward calls a plain function (StatefulCheckpoint wraps modules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class _Holder(nn.Module):
    """An iterator as a module attribute."""

    def __init__(self, lin, it):
        super().__init__()
        self.lin = lin
        self.it = it

    def forward(self, x):
        return self.lin(x * _value(next(self.it)))


class _Box:
    def __init__(self, it):
        self.it = it


_IT = None


def _global_fn_factory(lin):
    def fn(x):
        return lin(x * _value(next(_IT)))  # a global the segment's code loads
    return fn


def _build(kind: str, holder: str):
    """``(linear, fn, iterator)``: ``fn(x)`` advances the iterator, found where ``holder`` says."""
    global _IT
    lin = nn.Linear(4, 4).to(D)
    it = KINDS[kind]()
    if holder == "closure cell":
        return lin, lambda x: lin(x * _value(next(it))), it
    if holder == "global":
        _IT = it
        return lin, _global_fn_factory(lin), it
    if holder == "default argument":
        def fn(x, it=it):
            return lin(x * _value(next(it)))
        return lin, fn, it
    if holder == "module attribute":
        return lin, _Holder(lin, it), it
    if holder == "list":
        held = [it]
        return lin, lambda x: lin(x * _value(next(held[0]))), it
    if holder == "dict":
        held = {"it": it}
        return lin, lambda x: lin(x * _value(next(held["it"]))), it
    if holder == "plain object":
        box = _Box(it)
        return lin, lambda x: lin(x * _value(next(box.it))), it
    raise AssertionError(holder)


HOLDERS = ["closure cell", "global", "default argument", "module attribute", "list", "dict", "plain object"]


def _run(kind: str, holder: str, mode: str, preserve: str = "region", state="auto"):
    """``STEPS`` training steps: outputs and gradients of each, then the iterator's next value."""
    torch.manual_seed(0)
    lin, fn, it = _build(kind, holder)
    wrapped = StatefulCheckpoint(_Wrap(fn), state=state, preserve=preserve) if mode == "stateful" else None
    kw = dict(state=state, preserve=preserve)
    out = []
    for step in range(STEPS):
        lin.zero_grad()
        x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
        if mode == "eager":
            y = fn(x)
        elif mode == "stateful":
            y = wrapped(x)
        elif mode == "nested":
            y = checkpoint(lambda z: checkpoint(fn, z, **kw) * 1.0, x, **kw)
        else:
            y = checkpoint(fn, x, early_stop=mode == "plain", **kw)
        y.pow(2).sum().backward()
        out.append((y.detach().clone(), lin.weight.grad.clone()))
    return out, torch.as_tensor(_value(next(it)), dtype=D)


def _assert_eager(kind, holder, mode, preserve="region", state="auto"):
    (want, want_next), (got, got_next) = _run(kind, holder, "eager"), _run(kind, holder, mode, preserve, state)
    for step, (w, g) in enumerate(zip(want, got)):
        for what, a, b in zip(("output", "gradient"), w, g):
            assert torch.equal(a, b), f"step {step}: {what} differs from eager"
    assert torch.equal(want_next, got_next), "the iterator does not stand where eager leaves it"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_forward_that_advances_an_iterator_runs_as_eager_under_auto(kind, preserve, mode):
    """``state="auto"``: a forward that calls next() on a reached iterator or generator keeps its
    activations (no replay): outputs, gradients and the iterator's position as eager's, each step."""
    _assert_eager(kind, "closure cell", mode, preserve)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_strict_mode_refuses_a_forward_that_advances_an_iterator(kind, mode):
    """Strict mode (``state=None``): the forward is refused naming the iterator (what, where, why)
    with the tip to pass the value in."""
    with pytest.raises(UnsupportedError) as e:
        _run(kind, "closure cell", mode, state=None)
    msg = str(e.value)
    assert "captured variable 'it'" in msg and "which existed before the segment" in msg, msg
    assert "Tip: call next() outside the segment and pass the value as an argument" in msg, msg
    if kind.startswith("generator") and kind != "generator expression":
        assert "generator '" in msg and "resumed by next()" in msg, msg


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_place_the_scan_finds_an_iterator(kind, holder, state):
    """A closure cell, a global, a default argument, a module attribute, a list, a dict, a plain
    object: the default runs the forward as eager, strict mode refuses it."""
    if state is None:
        with pytest.raises(UnsupportedError, match="which existed before the segment"):
            _run(kind, holder, "plain", state=None)
        return
    _assert_eager(kind, holder, "plain")
    _assert_eager(kind, holder, "stateful", "whole")


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_tip_passes_the_value_as_an_argument(kind, state):
    """Following the refusal's tip (``checkpoint(f, x, next(it))``) replays exactly in both modes:
    the segment reads its value as an input, and the replay reads that same tensor."""
    def run(ckpt: bool):
        torch.manual_seed(0)
        lin, it = nn.Linear(4, 4).to(D), KINDS[kind]()

        def f(x, v):
            return lin(x) * v
        out = []
        for step in range(STEPS):
            lin.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
            v = _value(next(it))
            y = checkpoint(f, x, v, state=state) if ckpt else f(x, v)
            y.pow(2).sum().backward()
            out += [y.detach().clone(), lin.weight.grad.clone()]
        return out + [torch.as_tensor(_value(next(it)), dtype=D)]
    for a, b in zip(run(False), run(True)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("kind", ["generator", "iter(list)", "iter(dict.values())", "itertools.count"])
def test_a_replay_that_advances_an_iterator_its_forward_did_not_is_refused(kind, state):
    """A path taken only at the replay (``is_replaying()``) that calls next(): ``ReplayError`` at the
    backward, naming the iterator (before, the replay read a value the forward never read)."""
    lin, it = nn.Linear(4, 4).to(D), KINDS[kind]()
    const = _full(7)

    def f(x):
        v = _value(next(it)) if is_replaying() else const
        return lin(x) * v
    y = checkpoint(f, torch.ones(3, 4, dtype=D), state=state)
    with pytest.raises(ReplayError, match="its replay advanced .*captured variable 'it'.*its forward did not"):
        y.pow(2).sum().backward()


def test_a_reached_iterator_the_forward_does_not_advance_still_replays():
    """Reaching a live generator costs no activations: a forward that leaves it alone replays (and
    exactly), and one that advances it runs as eager that step."""
    lin, g = nn.Linear(4, 4).to(D), _counting_generator()
    use = [False]

    def f(x):
        return lin(x) * (_value(next(g)) if use[0] else 2.0)
    block = StatefulCheckpoint(_Wrap(f))
    x = torch.ones(3, 4, dtype=D)
    block(x).sum().backward()
    assert block.recompute_count == 1
    use[0] = True
    block(x).sum().backward()
    assert block.recompute_count == 1  # kept its activations
    assert torch.equal(next(g), _full(2))


def test_a_python_profile_function_keeps_its_events_and_is_put_back():
    """The resume hook calls on the profile function already installed and restores it."""
    events = []

    def prof(frame, event, arg):
        events.append(event)
    g = _counting_generator()
    lin = nn.Linear(4, 4).to(D)
    sys.setprofile(prof)
    try:
        y = checkpoint(lambda x: lin(x) * next(g), torch.ones(3, 4, dtype=D))
        assert sys.getprofile() is prof
        n = len(events)
        y.sum().backward()
    finally:
        sys.setprofile(None)
    assert "call" in events[:n] and "c_call" in events[:n] and len(events) > n
    assert torch.equal(lin.weight.grad, torch.full((4, 4), 3.0, dtype=D))  # x = 1, v = 1, three rows


def test_under_a_c_level_profiler_a_reached_generator_counts_as_advanced():
    """cProfile holds the thread's profile hook (its C callback cannot be chained): a live generator
    the segment reaches counts as advanced, so the default runs that forward as eager (exact), strict
    mode refuses it, and cProfile's hook is left in place."""
    want, _ = _run("generator", "closure cell", "eager")
    p = cProfile.Profile()
    p.enable()
    try:
        got, _ = _run("generator", "closure cell", "plain")
        hook = sys.getprofile()
        with pytest.raises(UnsupportedError, match="its resumes cannot be seen"):
            _run("generator", "closure cell", "plain", state=None)
    finally:
        p.disable()
    assert hook is p
    for w, g in zip(want, got):
        assert all(torch.equal(a, b) for a, b in zip(w, g))


@pytest.mark.parametrize("kind", ["generator", "iter(list)", "itertools.count"])
def test_an_iterator_passed_as_an_argument(kind):
    """An iterator passed to the segment (``checkpoint(f, x, it)``): the default runs the forward as
    eager (exact over three steps), strict mode refuses it naming the argument."""
    def run(how: str):
        torch.manual_seed(0)
        lin, it = nn.Linear(4, 4).to(D), KINDS[kind]()

        def f(x, it):
            return lin(x * _value(next(it)))
        out = []
        for step in range(STEPS):
            lin.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
            y = f(x, it) if how == "eager" else checkpoint(f, x, it, state="auto" if how == "auto" else None)
            y.pow(2).sum().backward()
            out += [y.detach().clone(), lin.weight.grad.clone()]
        return out + [torch.as_tensor(_value(next(it)), dtype=D)]
    for a, b in zip(run("eager"), run("auto")):
        assert torch.equal(a, b)
    with pytest.raises(UnsupportedError, match=r"\(argument 1: "):
        run("strict")


def test_an_opaque_iterator_counts_as_advanced_even_when_left_alone():
    """``itertools.cycle`` shows no position: a forward that reaches one keeps its activations under
    the default (it cannot tell), and strict mode refuses it saying why."""
    lin, c = nn.Linear(4, 4).to(D), itertools.cycle([_full(1), _full(2)])

    def f(x):
        _ = c  # reached, never advanced
        return lin(x)
    block = StatefulCheckpoint(_Wrap(f))
    block(torch.ones(3, 4, dtype=D)).sum().backward()
    assert block.recompute_count == 0
    with pytest.raises(UnsupportedError, match="itertools.cycle object .*its position cannot be read"):
        checkpoint(f, torch.ones(3, 4, dtype=D), state=None)


def test_on_undeclared_warn_warns_at_the_forward_and_the_replay():
    """Strict mode's ``on_undeclared="warn"``: the forward's advance and the replay's second advance
    are warned about (the replay reads the next value, as the warning says)."""
    lin, g = nn.Linear(4, 4).to(D), _counting_generator()
    with pytest.warns(UndeclaredStateWarning, match="advanced generator '_counting_generator'"):
        y = checkpoint(lambda x: lin(x * next(g)), torch.ones(3, 4, dtype=D), state=None, on_undeclared="warn")
    with pytest.warns(UndeclaredStateWarning, match="its replay advanced generator"):
        y.sum().backward()
    assert torch.equal(next(g), _full(3))  # advanced twice: what warn accepts


@pytest.mark.parametrize("advance", ["first", "second", "neither"])
def test_two_generators_of_one_function(advance):
    """Two live generators of one generator function (one code object): the one the forward resumes
    is named, the other is not blamed; neither advanced, the segment replays."""
    lin, g1, g2 = nn.Linear(4, 4).to(D), _counting_generator(), _counting_generator()
    next(g2)

    def f(x):
        g = {"first": g1, "second": g2}.get(advance)
        return lin(x * (next(g) if g is not None else 1.0))
    if advance == "neither":
        block = StatefulCheckpoint(_Wrap(f), state=None)
        block(torch.ones(3, 4, dtype=D)).sum().backward()
        assert block.recompute_count == 1
        return
    with pytest.raises(UnsupportedError) as e:
        checkpoint(f, torch.ones(3, 4, dtype=D), state=None)
    named, other = ("'g1'", "'g2'") if advance == "first" else ("'g2'", "'g1'")
    assert f"captured variable {named}" in str(e.value) and f"variable {other}" not in str(e.value)
