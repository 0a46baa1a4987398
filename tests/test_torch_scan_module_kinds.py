"""State behind another Python module's attribute, and a bound method's ``self`` (issue 25).

Kind 1: a forward that reads and changes state a user's Python module holds (``next(gmod.G)``,
``gmod.counter["n"] += 1``, ``gmod.buf.add_(1)``, ``gmod.state.v = gmod.state.v * 0.5 + h``, a
tensor or scalar attribute rebound) where ``gmod`` is a ``types.ModuleType`` the code names as a
global, a closure captures (``import mod`` inside a function), a nested function loads, a package
holds (``gpkg.sub.G``), an ``nn.Module`` holds as an attribute (``self.gm.G``), a callable
object's ``__call__`` loads, or whose own function does it (``helpers.run(h)``). Before, the scan did
not follow module objects: the replay advanced the generator again, or read the rebound value
(silently wrong gradients from the first step). Now a module is followed through the attribute
names its code loads (``_scan._add_python_module``), so each kind replays as eager or is refused
as its plain-global twin is.

Kind 2: a bound method captured by a function a module holds as an attribute: its ``self`` was one
level past the scan's depth, so rebinding ``self.v`` replayed on the new value.

Each case is compared bit for bit with no checkpointing in float64 over three steps (outputs,
gradients, and the module's state afterwards), over both preservers, ``checkpoint`` with and
without early stop, nested checkpoints, ``StatefulCheckpoint``, the default and strict mode.
"""
from __future__ import annotations

import math
import sys
import textwrap
import types

import pytest
import torch
from torch import nn

from stateremat.torch import StatefulCheckpoint, UndeclaredStateError, UnsupportedError, checkpoint
from stateremat.torch._scan import reach

D = torch.float64
PRESERVERS = ["whole", "region"]
MODES = ["plain", "plain-no-early-stop", "nested", "stateful"]
STEPS = 3
MOD, PKG = "scanmod_kinds_user", "scanmod_kinds_pkg"

#: kind -> the body of ``k(h)`` (``h``: the Linear's output, (3, 4) float64), naming the module ``gmod``.
KINDS = {  # (the sin saves its input: a replay that reads another value gives another gradient)
    "generator": "return torch.sin(h * next(gmod.G))",
    "dict entry": 'gmod.counter["n"] += 1\nreturn torch.sin(h * gmod.counter["n"])',
    "tensor written in place": "gmod.buf.add_(1)\nreturn torch.sin(h * gmod.buf)",
    "object attribute rebound": "gmod.state.v = gmod.state.v * 0.5 + h.detach()[0]\nreturn torch.sin(h * gmod.state.v)",
    "tensor attribute rebound": "gmod.t = gmod.t * 2\nreturn torch.sin(h * gmod.t)",
    "scalar attribute rebound": "gmod.step += 1\nreturn torch.sin(h * gmod.step)",
}
#: kinds strict mode refuses (as it refuses them through a plain global), with the refusal's words
REFUSED = {
    "generator": (UnsupportedError,
                  r"advanced generator '_gen' \((module attribute scanmod_kinds_user.G|global 'G'): resumed by next\(\)"),
    "tensor written in place": (UndeclaredStateError,
                                r"wrote in place to (module attribute scanmod_kinds_user.buf|global 'buf'), "),
}


@pytest.fixture(autouse=True)
def _forget_the_modules():
    """The run-time modules leave ``sys.modules`` after each test."""
    yield
    for name in (MOD, PKG):
        sys.modules.pop(name, None)


def _gen():
    t = torch.zeros(4, dtype=D)
    while True:
        t = t + 1
        yield t


def _fresh_module() -> types.ModuleType:
    """A user module (made at run time, in ``sys.modules``) holding one state of each kind."""
    m = types.ModuleType(MOD)
    m.G, m.counter, m.buf = _gen(), {"n": 0}, torch.zeros(4, dtype=D)
    m.state, m.t, m.step = types.SimpleNamespace(v=torch.zeros(4, dtype=D)), torch.ones(4, dtype=D), 0
    m.other = torch.zeros(4, dtype=D)  # named by no code: not followed
    m.torch = torch  # (for its own function, "the module's own function")
    sys.modules[MOD] = m
    pkg = types.ModuleType(PKG)
    pkg.sub = m
    sys.modules[PKG] = pkg
    return m


def _final(m: types.ModuleType) -> torch.Tensor:
    """The module's state after the steps: where each kind leaves it (and the generator's next value)."""
    return torch.cat([next(m.G), torch.tensor([float(m.counter["n"]), float(m.step)], dtype=D), m.buf,
                      m.state.v, m.t])


def _indent(body: str, n: int) -> str:
    return textwrap.indent(body, " " * n)


def _segment_fn(kind: str, holder: str, m: types.ModuleType):
    """``k(h)`` doing ``kind`` on ``m``, which its code reaches as ``holder`` says."""
    body = KINDS[kind]
    ns = {"__name__": "scanmod_kinds_caller", "gmod": m, "gpkg": sys.modules[PKG], "torch": torch}
    if holder == "global":
        src = f"def k(h):\n{_indent(body, 4)}\n"
    elif holder == "nested function":
        src = f"def k(h):\n    def inner(h):\n{_indent(body, 8)}\n    return inner(h)\n"
    elif holder == "package attribute":
        src = f"def k(h):\n{_indent(body.replace('gmod.', 'gpkg.sub.'), 4)}\n"
    elif holder == "closure (import inside a function)":
        src = (f"def make():\n    import {MOD} as gmod\n    def k(h):\n{_indent(body, 8)}\n    return k\n"
               "k = make()\n")
        del ns["gmod"]
    elif holder == "from pkg import mod, in a closure":
        src = (f"def make():\n    from {PKG} import sub as gmod\n    def k(h):\n{_indent(body, 8)}\n"
               "    return k\nk = make()\n")
        del ns["gmod"]
    elif holder == "the module's own function":
        # (its globals are the module's: ``helpers.run(h)`` where run advances the module's G)
        own = "global G, counter, buf, state, t, step\n" + body.replace("gmod.", "")
        exec(f"def run(h):\n{_indent(own, 4)}\n", m.__dict__)
        src = "def k(h):\n    return gmod.run(h)\n"
    elif holder == "nn.Module attribute":
        src = ("class K(torch.nn.Module):\n    def __init__(self, m):\n        super().__init__()\n"
               f"        self.gm = m\n\n    def forward(self, h):\n{_indent(body.replace('gmod.', 'self.gm.'), 8)}\n"
               "k = K(gmod)\n")
    elif holder in ("a callable object's __call__", "a callable object as a global"):
        src = f"class C:\n    def __call__(self, h):\n{_indent(body, 8)}\n"
        if holder == "a callable object as a global":
            src += "c = C()\ndef k(h):\n    return c(h)\n"
        else:
            src += "def make():\n    c = C()\n    def k(h):\n        return c(h)\n    return k\nk = make()\n"
    else:
        raise AssertionError(holder)
    exec(src, ns)
    return ns["k"]


HOLDERS = ["global", "nested function", "package attribute", "closure (import inside a function)",
           "from pkg import mod, in a closure", "the module's own function", "nn.Module attribute",
           "a callable object's __call__", "a callable object as a global"]


class _Wrap(nn.Module):
    """``k(lin(x))`` as a module (StatefulCheckpoint wraps modules), ``k`` a module attribute."""

    def __init__(self, lin, k):
        super().__init__()
        self.lin, self.k = lin, k

    def forward(self, x):
        return self.k(self.lin(x))


def _run(kind: str, holder: str, mode: str, preserve: str = "region", **kw):
    """``STEPS`` training steps: outputs and gradients of each, then the module's state."""
    torch.manual_seed(0)
    m = _fresh_module()
    lin = nn.Linear(4, 4).to(D)
    k = _segment_fn(kind, holder, m)

    def fn(x):
        return k(lin(x))
    kw = dict(preserve=preserve, **kw)
    wrapped = StatefulCheckpoint(_Wrap(lin, k), **kw) if mode == "stateful" else None
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
        out += [y.detach().clone(), lin.weight.grad.clone()]
    return out + [_final(m)]


def _assert_eager(kind, holder, mode, preserve="region", **kw):
    want, got = _run(kind, holder, "eager"), _run(kind, holder, mode, preserve, **kw)
    assert len(want) == len(got)
    for i, (a, b) in enumerate(zip(want, got)):
        last = i == len(want) - 1
        what = "the module's state afterwards" if last else f"step {i // 2} {('output', 'gradient')[i % 2]}"
        assert torch.equal(a, b), f"{what} differs from eager"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_state_behind_a_module_global_replays_as_eager(kind, preserve, mode):
    """``state="auto"``: each kind through a module the segment names as a global gives eager's
    outputs, gradients and module state, bit for bit, on every neighbour."""
    _assert_eager(kind, "global", mode, preserve)


@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_way_code_names_a_module(kind, holder):
    """A nested function, a package's attribute, ``import``/``from pkg import mod`` captured by a
    closure, the module's own function: eager's results under the default, plain and stateful."""
    _assert_eager(kind, holder, "plain")
    _assert_eager(kind, holder, "stateful", "whole")


@pytest.mark.parametrize("holder", ["global", "closure (import inside a function)", "the module's own function"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("strict", [dict(state=None), dict(state=[], on_undeclared="raise")])
def test_strict_mode_replays_or_refuses_as_for_a_plain_global(kind, holder, strict):
    """Strict mode: a rebound binding replays as of the forward (eager's results), an advanced
    generator and an in-place write are refused by name, as through a plain global."""
    if kind not in REFUSED:
        _assert_eager(kind, holder, "plain", **strict)
        return
    err, words = REFUSED[kind]
    with pytest.raises(err, match=words):
        _run(kind, holder, "plain", **strict)


@pytest.mark.parametrize("mode", ["plain", "stateful"])
def test_strict_tip_for_a_module_tensor_declares_it(mode):
    """The in-place refusal's tip, ``state=[tensor]``, run through: eager's results in strict mode."""
    want = _run("tensor written in place", "global", "eager")
    m = _fresh_module()
    buf = m.buf
    torch.manual_seed(0)
    lin = nn.Linear(4, 4).to(D)
    k = _segment_fn("tensor written in place", "global", m)

    def fn(x):
        return k(lin(x))
    wrapped = StatefulCheckpoint(_Wrap(lin, k), state=[buf], on_undeclared="raise")
    got = []
    for step in range(STEPS):
        lin.zero_grad()
        x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
        y = wrapped(x) if mode == "stateful" else checkpoint(fn, x, state=[buf], on_undeclared="raise")
        y.pow(2).sum().backward()
        got += [y.detach().clone(), lin.weight.grad.clone()]
    got.append(_final(m))
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_strict_tip_for_a_module_generator_passes_the_value_in():
    """The generator refusal's tip (``checkpoint(f, x, next(gmod.G))``) in strict mode: eager's results."""
    def run(ckpt: bool):
        torch.manual_seed(0)
        m = _fresh_module()
        lin = nn.Linear(4, 4).to(D)

        def f(x, v):
            return lin(x) * v
        out = []
        for step in range(STEPS):
            lin.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
            v = next(m.G)
            y = checkpoint(f, x, v, state=None) if ckpt else f(x, v)
            y.pow(2).sum().backward()
            out += [y.detach().clone(), lin.weight.grad.clone()]
        return out + [_final(m)]
    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))


def test_only_the_attributes_the_code_loads_are_followed():
    """The scan follows ``gmod.buf`` (named by the code), not ``gmod.other`` (in the module, named
    by no code), and walks no library or standard-library module (``torch.nn.functional``, ``math``)."""
    m = _fresh_module()
    ns = {"__name__": "scanmod_kinds_caller", "gmod": m, "F": torch.nn.functional, "math": math}
    exec("def k(h):\n    return F.relu(h) * gmod.buf * math.pi\n", ns)
    r = reach(ns["k"], (torch.ones(4, dtype=D),), {})
    found = {id(t) for _, t in r.tensors.values()}
    assert id(m.buf) in found and id(m.other) not in found
    followed = {key for key in r.module_names}
    assert followed == {(id(m.__dict__), "buf")}, followed


# -- kind 2: a bound method's self, captured by a function a module holds ------------------------

class _Acc:
    def __init__(self):
        self.v = torch.zeros(4, dtype=D)
        self.n = 0

    def step(self, h):
        self.v = self.v * 0.5 + h.detach()  # rebinding through self: replayed as of the forward
        self.n += 1
        return torch.sin(h * self.v * self.n)


def _calls(method):
    def fn(h):
        return method(h)
    return fn


class _HoldsAFunction(nn.Module):
    """Holds ``fn`` (a function capturing ``_Acc().step``) as an attribute; the ``_Acc`` only there."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).to(D)
        self.fn = _calls(_Acc().step)

    def forward(self, x):
        h = self.lin(x)
        return h * self.fn(h[0])


def _run_bound(mode: str, preserve: str = "region", **kw):
    torch.manual_seed(0)
    m = _HoldsAFunction()
    kw = dict(preserve=preserve, **kw)
    wrapped = StatefulCheckpoint(m, **kw) if mode == "stateful" else None
    out = []
    for step in range(STEPS):
        m.zero_grad()
        x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
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
    acc = m.fn.__closure__[0].cell_contents.__self__
    return out + [acc.v.clone(), torch.tensor(float(acc.n), dtype=D)]


@pytest.mark.parametrize("strict", [{}, dict(state=None), dict(state=[], on_undeclared="raise")],
                         ids=["auto", "strict", "strict-raise"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_bound_methods_self_held_through_a_module_function(preserve, mode, strict):
    """``self.v`` and ``self.n`` rebound through the ``self`` of a bound method a module's function
    captures replay as of the forward: eager's outputs, gradients and ``self`` afterwards."""
    want, got = _run_bound("eager"), _run_bound(mode, preserve, **strict)
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), f"entry {i} differs from eager"


# -- an iterator at the scan's last level (a leaf, seen as a tensor there is) -----------------------

@pytest.mark.parametrize("state", ["auto", None])
def test_a_generator_at_the_scans_last_level_is_watched(state):
    """A generator four containers deep (``held[0][0][0][0]``, the level where the scan stops
    following containers but still sees tensors): the default runs the forward as eager (exact over
    three steps, and the generator stands where eager leaves it), strict mode refuses it by name."""
    def run(ckpt: bool):
        torch.manual_seed(0)
        lin, g = nn.Linear(4, 4).to(D), _gen()
        held = [[[[g]]]]

        def f(x):
            return torch.sin(lin(x) * next(held[0][0][0][0]))
        out = []
        for step in range(STEPS):
            lin.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
            y = checkpoint(f, x, state=state) if ckpt else f(x)
            y.pow(2).sum().backward()
            out += [y.detach().clone(), lin.weight.grad.clone()]
        return out + [next(g)]
    if state is None:
        where = r"captured variable 'held'\[0\]\[0\]\[0\]\[0\]"
        with pytest.raises(UnsupportedError, match=r"advanced generator '_gen' \(" + where):
            run(True)
        return
    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))
