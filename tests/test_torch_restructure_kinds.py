"""A checkpointed forward that changes module structure or hook registrations (issue 25, _structure).

Each kind below changes, inside the forward, what a replay cannot see as the forward saw it: a
one-time set-up behind a flag (a tensor hook, a full backward hook, a parametrization, a
forward pre-hook, a global module hook, a child, a parameter, a buffer), a one-shot hook that
removes itself, a ``ModuleList`` grown, a submodule or a callable attribute swapped after its
use. Under the default ``state="auto"`` every step must be bit for bit eager's (float64, three
steps: output, input gradient, every parameter gradient, buffers) and every hook table must hold
as many hooks as eager's after each step (nothing registered twice). Strict mode refuses the
replay that runs the set-up again, and the tip it gives (guard with ``is_replaying()``) is exact.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.utils.parametrize as P
from torch.nn.modules import module as _module

from stateremat.torch import StatefulCheckpoint, checkpoint, is_replaying
from stateremat.torch._errors import ReplayError, UnsupportedError

D = torch.float64
_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


class _Sym(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).T


class _Model(nn.Module):
    """Two Linear+tanh layers and a head list; ``kind`` picks what the forward changes."""

    def __init__(self, kind: str, guard: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.l = nn.Linear(4, 4, dtype=D)
        self.l2 = nn.Linear(4, 4, dtype=D)
        self.heads = nn.ModuleList()
        self.act = nn.Tanh()
        self.fn = torch.tanh
        self.kind, self.guard, self.ready, self.handles = kind, guard, False, []
        if kind == "one_shot_hook":
            box = {}

            def once(mod, inp, out):
                box["h"].remove()
                return out * 5

            box["h"] = self.l.register_forward_hook(once)

    def _setup(self, x):
        k = self.kind
        if k == "param_hook":
            self.l.weight.register_hook(lambda g: g * 2)
        elif k == "full_backward_hook":
            self.l2.register_full_backward_hook(lambda m, gi, go: (gi[0] * 2,))
        elif k == "parametrization":
            P.register_parametrization(self.l2, "weight", _Sym())
        elif k == "forward_pre_hook":
            self.handles.append(self.l.register_forward_pre_hook(lambda m, a: (a[0] * 2,)))
        elif k == "global_hook":
            self.handles.append(_module.register_module_forward_hook(
                lambda m, i, o: o * 2 if isinstance(m, nn.Linear) else None))
        elif k == "child":
            self.proj = nn.Linear(4, 4, dtype=D)
        elif k == "parameter":
            self.scale = nn.Parameter(torch.full((4,), 1.5, dtype=D))
        elif k == "buffer":
            self.register_buffer("ema", x.detach().mean(0).clone())

    def forward(self, x):
        if not self.ready and not (self.guard and is_replaying()):
            self.ready = True
            self._setup(x)
        if self.kind == "modulelist" and len(self.heads) < 2 and not (self.guard and is_replaying()):
            self.heads.append(nn.Linear(4, 4, dtype=D))
        h = torch.tanh(self.l(x))
        if self.kind == "submodule_swap":
            a = self.act
            self.act = nn.Sigmoid() if isinstance(a, nn.Tanh) else nn.Tanh()
            h = a(h)
        if self.kind == "callable_swap":
            f = self.fn
            self.fn = torch.sigmoid if f is torch.tanh else torch.tanh
            h = f(h)
        if hasattr(self, "proj"):
            h = torch.tanh(self.proj(h))
        if hasattr(self, "scale"):
            h = h * self.scale
        if hasattr(self, "ema"):
            h = h * self.ema.clone()
            with torch.no_grad():
                self.ema.mul_(0.9).add_(0.1 * x.detach().mean(0))
        y = torch.tanh(self.l2(h))
        return y + sum(torch.tanh(hd(h)) for hd in self.heads) if len(self.heads) else y


KINDS = ["param_hook", "full_backward_hook", "parametrization", "forward_pre_hook", "global_hook",
         "one_shot_hook", "modulelist", "submodule_swap", "callable_swap", "child", "parameter", "buffer"]


def _hook_sizes(m: nn.Module) -> list:
    """How many hooks every table of ``m``'s modules and parameters holds, and torch's global ones."""
    out = [len(getattr(_module, f"_global{n}")) for n in _TABLES]
    for name, sub in m.named_modules():
        out.append((name, type(sub).__name__, *(len(getattr(sub, n)) for n in _TABLES)))
    for name, p in m.named_parameters():
        out.append((name, len(p._backward_hooks or {}), len(p._post_accumulate_grad_hooks or {})))
    return out


def _steps(kind: str, run, steps: int = 3, guard: bool = False) -> list:
    m = _Model(kind, guard)
    call = run(m)
    torch.manual_seed(1)
    x = torch.randn(3, 4, dtype=D)
    rec = []
    try:
        for s in range(steps):
            xi = (x + s).requires_grad_()
            y = call(xi)
            (y * 1.5).pow(2).sum().backward()
            rec.append([("step", s), y.detach().clone(), xi.grad.clone(),
                        *[(n, None if p.grad is None else p.grad.clone()) for n, p in m.named_parameters()],
                        *[(n, b.clone()) for n, b in m.named_buffers()], _hook_sizes(m)])
            for p in m.parameters():
                p.grad = None
    finally:
        for h in m.handles:
            h.remove()
    return rec


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return a == b


def _assert_eager(kind: str, run, guard: bool = False) -> None:
    want = _steps(kind, lambda m: m, guard=guard)
    got = _steps(kind, run, guard=guard)
    for s, (w, g) in enumerate(zip(want, got)):
        assert len(w) == len(g), f"step {s}: {len(g)} records, eager {len(w)}"
        for i, (a, b) in enumerate(zip(w, g)):
            assert _same(a, b), f"step {s}: record {i} ({a[0] if isinstance(a, tuple) else i}) differs from eager"


def _plain(preserve):
    return lambda m: (lambda x: checkpoint(m, x, preserve=preserve))


def _no_early_stop(preserve):
    return lambda m: (lambda x: checkpoint(m, x, preserve=preserve, early_stop=False))


def _nested(preserve):
    return lambda m: (lambda x: checkpoint(lambda z: checkpoint(m, z, preserve=preserve) * 1.0, x, preserve=preserve))


def _wrapper(preserve):
    return lambda m: StatefulCheckpoint(m, preserve=preserve)


MODES = {"checkpoint": _plain, "early_stop_false": _no_early_stop, "nested": _nested, "stateful": _wrapper}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("preserve", ["region", "whole"])
@pytest.mark.parametrize("kind", KINDS)
def test_default_is_eager_exact(kind, preserve, mode):
    _assert_eager(kind, MODES[mode](preserve))


def test_unchanged_structure_still_replays():
    """Once set up, a step replays (the eager step is the changing one only)."""
    from stateremat.torch._runtime import runtime

    m = _Model("param_hook")
    x = torch.randn(3, 4, dtype=D)
    counts = []
    for s in range(3):
        before = runtime().counters.recompute_count
        checkpoint(m, (x + s).requires_grad_()).sum().backward()
        counts.append(runtime().counters.recompute_count - before)
    assert counts == [0, 1, 1]


@pytest.mark.parametrize("kind", ["param_hook", "forward_pre_hook", "full_backward_hook"])
def test_strict_refuses_a_replay_that_runs_the_setup_again(kind):
    m = _Model(kind)
    x = torch.randn(3, 4, dtype=D, requires_grad=True)
    y = checkpoint(m, x, state=[], on_undeclared="raise")
    with pytest.raises(ReplayError, match="its replay left .*otherwise than its forward did.*is_replaying"):
        y.sum().backward()
    for h in m.handles:
        h.remove()


def test_strict_refuses_a_forward_that_removes_a_hook():
    """A one-shot hook gone at the forward's end cannot run in the replay: refused at once."""
    m = _Model("one_shot_hook")
    with pytest.raises(UnsupportedError, match="removed a hook in its forward.*module 'l'.*Tip: remove the hook outside"):
        checkpoint(m, torch.randn(3, 4, dtype=D, requires_grad=True), state=[], on_undeclared="raise")


def test_strict_replays_a_buffer_a_declared_module_registers():
    """A buffer registered on the first forward of a declared module: the replay registers it again as
    the forward did (its bindings replay as of the start), so it ends as the forward ended: exact."""
    _assert_eager("buffer", lambda m: (lambda x: checkpoint(m, x, state="buffers", on_undeclared="raise")))


@pytest.mark.parametrize("kind", ["param_hook", "forward_pre_hook", "full_backward_hook", "modulelist"])
def test_strict_tip_is_replaying_guard_is_exact(kind):
    """The refusal's tip: the set-up guarded with ``is_replaying()`` replays bit for bit as eager."""
    _assert_eager(kind, lambda m: (lambda x: checkpoint(m, x, state=[], on_undeclared="raise")), guard=True)
