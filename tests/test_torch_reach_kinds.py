"""Rebinding forms the scan reaches (issue 25, still-open kinds): each replays as of the forward.

The kind: a tensor bound where the scan did not look — an attribute of a class the segment
captures or loads (``K.acc = K.acc + x.sum()``), an attribute of a function it calls
(``fn.acc = fn.acc + 1``), an object reached through a weak reference, a tensor or object held
in a ``WeakValueDictionary`` / ``WeakKeyDictionary``. Before, the replay read
the advanced tensor: silently wrong gradients and state from the second step. Each case is
compared bit for bit with no checkpointing in float64 over several steps, over both preservers,
``checkpoint`` / ``StatefulCheckpoint`` / nested checkpoints, the default and strict mode.
"""
from __future__ import annotations

import types
import weakref

import pytest
import torch
from torch import nn

from stateremat.torch import StatefulCheckpoint, UndeclaredStateError, checkpoint

D = torch.float64
PRESERVERS = ["whole", "region"]
MODES = ["plain", "plain-no-early-stop", "nested", "stateful"]
STEPS = 3


class _Wrap(nn.Module):
    """A module whose forward calls a plain function (StatefulCheckpoint wraps modules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _run(build, mode: str, preserve: str = "region", state="auto"):
    """``STEPS`` training steps of ``build()``'s ``(linear, fn, state getter)``: outputs, gradients
    and the state after each step, eager (``mode="eager"``) or checkpointed."""
    torch.manual_seed(0)
    lin, fn, now = build()
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
        out.append((y.detach().clone(), lin.weight.grad.clone(), now().clone()))
    return out


def _assert_eager(build, mode, preserve, state):
    want, got = _run(build, "eager"), _run(build, mode, preserve, state)
    for step, (w, g) in enumerate(zip(want, got)):
        for what, a, b in zip(("output", "gradient", "state"), w, g):
            assert torch.equal(a, b), f"step {step}: {what} differs from eager"


# -- kind 1: an attribute of a class the segment captures or loads ------------------------------

class GlobalAcc:
    """A class at module level whose attribute the segment rebinds."""

    acc = None


def _class_captured():
    lin = nn.Linear(4, 4).to(D)

    class K:
        acc = torch.zeros(4, dtype=D)

    def fn(x):
        y = lin(x) * K.acc  # the replay must read the tensor the forward read
        K.acc = K.acc + x.sum(0)
        return y
    return lin, fn, lambda: K.acc


def _class_global():
    lin = nn.Linear(4, 4).to(D)
    GlobalAcc.acc = torch.zeros(4, dtype=D)

    def fn(x):
        GlobalAcc.acc = GlobalAcc.acc + x.sum(0)  # rebound before its use
        return lin(x) * GlobalAcc.acc
    return lin, fn, lambda: GlobalAcc.acc


def _class_of_object():
    lin = nn.Linear(4, 4).to(D)

    class Box:
        acc = torch.zeros(4, dtype=D)

        def step(self, y, x):
            out = y * type(self).acc
            type(self).acc = type(self).acc + x.sum(0)
            return out
    box = Box()
    return lin, lambda x: box.step(lin(x), x), lambda: Box.acc


def _class_in_forward():
    lin = nn.Linear(4, 4).to(D)

    class K:
        acc = torch.zeros(4, dtype=D)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            y = self.lin(x) * K.acc
            K.acc = K.acc * 0.5 + x.sum(0)
            return y
    return lin, Block(), lambda: K.acc


CLASS_KINDS = {"captured": _class_captured, "global": _class_global, "object's class": _class_of_object,
               "module forward": _class_in_forward}


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(CLASS_KINDS))
def test_a_class_attribute_rebinding_replays_as_of_the_forward(kind, preserve, mode, state):
    """``K.acc = K.acc + x.sum(0)`` on a class captured from an enclosing scope, loaded as a global,
    an object's class (``type(self).acc``) or captured by a module's forward: the replay reads the
    tensor the forward read, then the class holds the forward's result again."""
    _assert_eager(CLASS_KINDS[kind], mode, preserve, state)


# -- kind 2: an attribute of a function the segment calls ---------------------------------------

def global_helper(y, x):
    """A module-level helper that keeps a running sum on itself."""
    out = y * global_helper.acc
    global_helper.acc = global_helper.acc + x.sum(0)
    return out


def _function_global():
    lin = nn.Linear(4, 4).to(D)
    global_helper.acc = torch.zeros(4, dtype=D)
    return lin, lambda x: global_helper(lin(x), x), lambda: global_helper.acc


def _function_captured():
    lin = nn.Linear(4, 4).to(D)

    def helper(y, x):
        helper.acc = helper.acc * 0.5 + x.sum(0)  # rebound before its use
        return y * helper.acc
    helper.acc = torch.zeros(4, dtype=D)
    return lin, lambda x: helper(lin(x), x), lambda: helper.acc


def _function_itself():
    lin = nn.Linear(4, 4).to(D)

    def fn(x):  # the segment's own function
        y = lin(x) * fn.acc
        fn.acc = fn.acc + x.sum(0)
        return y
    fn.acc = torch.zeros(4, dtype=D)
    return lin, fn, lambda: fn.acc


FUNCTION_KINDS = {"global helper": _function_global, "captured helper": _function_captured,
                  "the segment's function": _function_itself}


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(FUNCTION_KINDS))
def test_a_function_attribute_rebinding_replays_as_of_the_forward(kind, preserve, mode, state):
    """``fn.acc = fn.acc + x.sum(0)`` on a helper the segment loads as a global, a helper it captures,
    or the segment's own function: the replay reads the tensor the forward read, then the function
    holds the forward's result again (before, the replay read the advanced tensor: silently wrong
    gradients from the first step, and state from the second)."""
    _assert_eager(FUNCTION_KINDS[kind], mode, preserve, state)


# -- kind 3: what a weak reference the segment holds refers to ----------------------------------

def _weakref_object():
    lin = nn.Linear(4, 4).to(D)

    class Stats:  # rebound through the reference
        def __init__(self):
            self.acc = torch.zeros(4, dtype=D)
    stats = Stats()
    ref = weakref.ref(stats)

    def fn(x):
        y = lin(x) * ref().acc
        ref().acc = ref().acc + x.sum(0)
        return y
    return lin, fn, lambda: stats.acc  # (the getter keeps it alive; the segment reaches it through ``ref``)


def _weakref_tensor():
    lin = nn.Linear(4, 4).to(D)
    buf = torch.zeros(4, dtype=D)
    ref = weakref.ref(buf)

    def fn(x):
        y = lin(x) * ref().clone()
        ref().add_(x.sum(0))  # written in place through the reference
        return y
    return lin, fn, lambda: buf


WEAKREF_KINDS = {"object": _weakref_object, "tensor": _weakref_tensor}


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(WEAKREF_KINDS))
def test_state_reached_through_a_weak_reference_replays_as_of_the_forward(kind, preserve, mode, state):
    """A ``weakref.ref`` the segment captures: an attribute of its referent rebound, or a referent
    tensor written in place, replays as of the forward (the scan follows the live referent)."""
    if kind == "tensor" and state is None:  # strict mode: an undeclared in-place write is refused
        with pytest.raises(UndeclaredStateError, match="not declared state"):
            _assert_eager(WEAKREF_KINDS[kind], mode, preserve, state)
        return
    _assert_eager(WEAKREF_KINDS[kind], mode, preserve, state)


# -- kind 4: what the weakref module's containers hold -------------------------------------------

def _weak_value_object():
    lin = nn.Linear(4, 4).to(D)

    class Stats:  # held weakly by value; its attribute rebound through the container
        def __init__(self):
            self.acc = torch.zeros(4, dtype=D)
    stats = Stats()
    table = weakref.WeakValueDictionary({"k": stats})

    def fn(x):
        y = lin(x) * table["k"].acc
        table["k"].acc = table["k"].acc + x.sum(0)
        return y
    return lin, fn, lambda: stats.acc  # (the getter keeps it alive; the segment reaches it through ``table``)


def _weak_value_tensor():
    lin = nn.Linear(4, 4).to(D)
    buf = torch.zeros(4, dtype=D)
    table = weakref.WeakValueDictionary({"k": buf})

    def fn(x):
        y = lin(x) * table["k"].clone()
        table["k"].add_(x.sum(0))  # written in place through the container
        return y
    return lin, fn, lambda: buf


def _weak_key_rebound():
    lin = nn.Linear(4, 4).to(D)
    table = weakref.WeakKeyDictionary()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            y = self.lin(x) * table[self]
            table[self] = table[self] * 0.5 + x.sum(0)  # the entry rebound to a new tensor
            return y
    block = Block()
    table[block] = torch.zeros(4, dtype=D)
    return lin, block, lambda: table[block]


def _weak_key_tensor():
    lin = nn.Linear(4, 4).to(D)

    class Key:
        pass
    key = Key()
    table = weakref.WeakKeyDictionary({key: torch.zeros(4, dtype=D)})

    def fn(x):
        y = lin(x) * table[key].clone()
        table[key].add_(x.sum(0))  # written in place through the container
        return y
    return lin, fn, lambda: table[key]


WEAK_CONTAINER_KINDS = {"value dict, object": _weak_value_object, "value dict, tensor": _weak_value_tensor,
                        "key dict, rebound": _weak_key_rebound, "key dict, tensor": _weak_key_tensor}


@pytest.mark.parametrize("state", ["auto", None])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(WEAK_CONTAINER_KINDS))
def test_state_in_a_weak_container_replays_as_of_the_forward(kind, preserve, mode, state):
    """A ``weakref.WeakValueDictionary`` or ``WeakKeyDictionary`` the segment reaches: a value
    tensor written in place, an entry rebound, or an attribute of a value object rebound, replays
    as of the forward (the scan follows the live values, and an entry is a binding slot like a
    dict's)."""
    if kind.endswith("tensor") and state is None:  # strict mode: an undeclared in-place write is refused
        with pytest.raises(UndeclaredStateError, match="not declared state"):
            _assert_eager(WEAK_CONTAINER_KINDS[kind], mode, preserve, state)
        return
    _assert_eager(WEAK_CONTAINER_KINDS[kind], mode, preserve, state)


def test_a_profiling_snapshot_puts_a_weak_container_back():
    """What a profiling run rebinds in a weak mapping the model reaches is put back by its snapshot
    (the mapping is followed like a dict: before, the entry kept the profiling run's tensor)."""
    from stateremat.torch._snapshot import ModelSnapshot

    _, block, now = _weak_key_rebound()
    start = now()
    snap = ModelSnapshot(block)
    block(torch.ones(3, 4, dtype=D))  # rebinds ``table[block]``
    assert now() is not start
    snap.restore()
    assert now() is start and torch.equal(start, torch.zeros(4, dtype=D))
