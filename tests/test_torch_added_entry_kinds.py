"""Entries a forward adds or rebinds in dicts, sets, weak mappings and plain objects (issue 25).

The contract, in every mode (strict mode too: it refuses undeclared in-place tensor writes and
advanced iterators, and replays Python bindings): the replay reads each binding the segment
reaches as its forward read it — a key the forward adds is absent, a set's members are the
forward's start members. Strict mode treats sets and weak mappings as it treats dicts: replayed
as of the forward, not refused.

The kind fixed here: a key the forward added holding an *object* (neither a tensor nor a Python
scalar: ``table[len(table)] = obj``, a ``WeakValueDictionary`` entry, which holds only objects,
``box.a3 = obj``), an entry rebound from ``None`` to an object, and an entry rebound from one
object to another (``box["s"] = State(box["s"].v * 0.5 + h)``) were present, or rebound, during
the replay: silently wrong gradients in every mode. Each case is compared bit for bit with no
checkpointing in float64 over three steps (outputs, gradients and the container afterwards) over
both preservers, ``checkpoint`` with and without early stop, nested checkpoints and
``StatefulCheckpoint``, the default and strict mode.
"""
from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from stateremat.torch import StatefulCheckpoint, checkpoint

D = torch.float64
PRESERVERS = ["whole", "region"]
MODES = ["plain", "plain-no-early-stop", "nested", "stateful"]
STEPS = 3
STRICT = {"auto": {}, "strict": dict(state=None), "strict-raise": dict(state=[], on_undeclared="raise")}


class _Obj:
    """A weak-referenceable object (a key, a value)."""


class _State:
    def __init__(self, v):
        self.v = v


def _full(v) -> torch.Tensor:
    return torch.full((4,), float(v), dtype=D)


# each kind: (make the held state, step(held, h) -> a (4,) factor, what the held state reads as afterwards)
def _dict_tensor(d, h):
    d["t"] = d["t"] * 0.5 + h.detach()[0] if "t" in d else h.detach()[0] * 2
    return d["t"]


def _dict_scalar(d, h):
    d["n"] = d.get("n", 0) + 1
    return _full(d["n"])


def _table_object(t, h):  # (a dict's or a WeakValueDictionary's new key holds an object)
    table, pool = t
    table[len(table)] = pool[len(table)]
    return _full(len(table))


def _dict_none_to_object(d, h):  # (lazily made: the first forward reads 1, later ones the cache)
    if d["cache"] is None:
        d["cache"] = _State(_full(3))
        return _full(1)
    d["cache"].v = d["cache"].v + 1
    return d["cache"].v


def _dict_object_to_object(d, h):
    d["s"] = _State(d["s"].v * 0.5 + h.detach()[0])
    return d["s"].v


def _object_attribute_added(t, h):
    box, pool = t
    n = len(vars(box))
    setattr(box, f"a{n}", pool[n])
    return _full(n + 1)


def _set_member(s, h):
    s.add(len(s))
    return _full(len(s))


def _weakset_member(t, h):
    ws, pool = t
    ws.add(pool[len(ws)])
    return _full(len(ws))


def _weakkey_entry(t, h):
    wk, key = t
    wk[key] = wk.get(key, 0) + 1
    return _full(wk[key])


def _pool():
    return [_Obj() for _ in range(40)]


def _count(t):
    return _full(len(t[0]) if isinstance(t, tuple) else len(t))


KINDS = {
    "dict: tensor entry added": (dict, _dict_tensor, lambda d: d["t"]),
    "dict: scalar entry added": (dict, _dict_scalar, lambda d: _full(d["n"])),
    "dict: object entry added": (lambda: ({}, _pool()), _table_object, _count),
    "dict: None rebound to an object": (lambda: {"cache": None}, _dict_none_to_object, lambda d: d["cache"].v),
    "dict: object rebound to an object": (lambda: {"s": _State(torch.zeros(4, dtype=D))}, _dict_object_to_object,
                                          lambda d: d["s"].v),
    "plain object: object attribute added": (lambda: (_Obj(), _pool()), _object_attribute_added,
                                             lambda t: _full(len(vars(t[0])))),
    "set: member added": (set, _set_member, _count),
    "WeakSet: member added": (lambda: (weakref.WeakSet(), _pool()), _weakset_member, _count),
    "WeakKeyDictionary: entry added": (lambda: (weakref.WeakKeyDictionary(), _Obj()), _weakkey_entry,
                                       lambda t: _full(t[0][t[1]])),
    "WeakValueDictionary: entry added": (lambda: (weakref.WeakValueDictionary(), _pool()), _table_object, _count),
}
#: kinds the replay got wrong before (the others guard the contract strict mode keeps)
FIXED = ["dict: object entry added", "dict: None rebound to an object", "dict: object rebound to an object",
         "plain object: object attribute added", "WeakValueDictionary: entry added"]


class _Wrap(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _run(kind: str, mode: str, preserve: str = "region", **kw):
    torch.manual_seed(0)
    make, step, after = KINDS[kind]
    lin, held = nn.Linear(4, 4).to(D), make()

    def fn(x):
        h = lin(x)
        return torch.sin(h * step(held, h))  # (sin saves its input: another factor, another gradient)
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
    return out + [after(held)]


def _assert_eager(kind, mode, preserve="region", **kw):
    want, got = _run(kind, "eager"), _run(kind, mode, preserve, **kw)
    for i, (a, b) in enumerate(zip(want, got)):
        what = "the held state afterwards" if i == len(want) - 1 else f"step {i // 2} {('output', 'gradient')[i % 2]}"
        assert torch.equal(a, b), f"{what} differs from eager"


@pytest.mark.parametrize("strict", list(STRICT))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_added_or_rebound_entry_replays_as_of_the_forward(kind, mode, strict):
    """Every kind, every neighbour, the default and strict mode: eager's results bit for bit."""
    _assert_eager(kind, mode, **STRICT[strict])


@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", FIXED)
def test_the_fixed_kinds_under_both_preservers(kind, preserve):
    _assert_eager(kind, "plain", preserve)
    _assert_eager(kind, "stateful", preserve, state=[], on_undeclared="raise")


# -- a module's own attribute bound to an object ------------------------------------------------

class _Rebinds(nn.Module):
    """``self.state = State(self.state.v * 0.5 + h)``: a module attribute rebound to a new object."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).to(D)
        self.state = _State(torch.zeros(4, dtype=D))

    def forward(self, x):
        h = self.lin(x)
        self.state = _State(self.state.v * 0.5 + h.detach()[0])
        return torch.sin(h * self.state.v)


class _LazyCache(nn.Module):
    """``if self.cache is None: self.cache = State(...)``: made by the first forward, which reads 1."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).to(D)
        self.cache = None

    def forward(self, x):
        h = self.lin(x)
        if self.cache is None:
            self.cache = _State(_full(3))
            return torch.sin(h)
        self.cache.v = self.cache.v + 1
        return torch.sin(h * self.cache.v)


class _LazyAttribute(_LazyCache):
    """``if not hasattr(self, "extra"): self.extra = State(...)``: an attribute the forward adds."""

    def forward(self, x):
        h = self.lin(x)
        if not hasattr(self, "extra"):
            self.extra = _State(_full(3))
            return torch.sin(h)
        return torch.sin(h * self.extra.v)


MODULE_KINDS = {"attribute rebound to an object": _Rebinds, "None rebound to a lazily made object": _LazyCache,
                "object attribute added": _LazyAttribute}


def _run_module(kind: str, mode: str, preserve: str = "region", **kw):
    torch.manual_seed(0)
    m = MODULE_KINDS[kind]()
    kw = dict(preserve=preserve, **kw)
    wrapped = StatefulCheckpoint(m, **kw) if mode == "stateful" else None
    out = []
    for s in range(STEPS):
        m.zero_grad()
        x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(s))
        if mode == "eager":
            y = m(x)
        elif mode == "stateful":
            y = wrapped(x)
        elif mode == "nested":
            y = checkpoint(lambda z: checkpoint(m, z, **kw) * 1.0, x, **kw)
        else:
            y = checkpoint(m, x, early_stop=mode == "plain", **kw)
        y.pow(2).sum().backward()
        out += [y.detach().clone(), m.lin.weight.grad.clone()]
    held = getattr(m, "state", None) or getattr(m, "extra", None) or m.cache
    return out + [held.v]


@pytest.mark.parametrize("strict", list(STRICT))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(MODULE_KINDS))
def test_a_modules_object_attribute_replays_as_of_the_forward(kind, preserve, mode, strict):
    """A module attribute rebound to, or added as, an object: eager's results bit for bit (before,
    the replay read the forward's new object). A hook's handle made the same way replays as the
    forward ended, as its hook does (``tests/test_torch_hook_kinds.py``)."""
    want, got = _run_module(kind, "eager"), _run_module(kind, mode, preserve, **STRICT[strict])
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), f"entry {i} differs from eager"
