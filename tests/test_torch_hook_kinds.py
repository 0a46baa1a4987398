"""Forward hooks changed between a segment's forward and its backward replay as the forward ran.

The kind: a hook registered around the forward and removed before backward (a temporary
pre-hook scaling the input, a debugging tool's global hook), or one added after the forward.
Before, the replay ran with the hooks present at backward: from the first replayed step the
gradients were silently wrong (``torch.utils.checkpoint`` has the same bug). Each case is compared
bit for bit with no checkpointing in float64 over several steps, over both preservers,
``checkpoint`` (with and without early stop), nested checkpoints and ``StatefulCheckpoint``, the
default and strict mode; the hooks registered after the test are gone.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import module as _module

from stateremat.torch import StatefulCheckpoint, checkpoint

D = torch.float64
STEPS = 3
PRESERVERS = ["whole", "region"]
MODES = ["plain", "plain-no-early-stop", "nested", "stateful"]


def _scale_input(mod, args):
    # (Linear only: a global hook also sees StatefulCheckpoint's wrapper module, eager has none)
    return (args[0] * 2.0,) if isinstance(mod, nn.Linear) else None


def _scale_output(mod, args, out):
    return out * 1.5 if isinstance(mod, nn.Linear) else None


def _scale_input_kwargs(mod, args, kwargs):
    return (args[0] * 0.5,), kwargs


#: kind -> (register(model) -> handle, when): "around" registers before the forward and removes
#: the hook before backward; "after" registers after the forward (removed after backward).
KINDS = {
    "module pre-hook around the forward": (lambda m: m[0].register_forward_pre_hook(_scale_input), "around"),
    "module forward hook around the forward": (lambda m: m[0].register_forward_hook(_scale_output), "around"),
    "module pre-hook with kwargs around the forward": (
        lambda m: m[2].register_forward_pre_hook(_scale_input_kwargs, with_kwargs=True), "around"),
    "global forward hook around the forward": (lambda m: _module.register_module_forward_hook(_scale_output), "around"),
    "global pre-hook around the forward": (lambda m: _module.register_module_forward_pre_hook(_scale_input), "around"),
    "module hook added after the forward": (lambda m: m[2].register_forward_hook(_scale_output), "after"),
    "global hook added after the forward": (lambda m: _module.register_module_forward_hook(_scale_output), "after"),
}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)).to(D)


def _run(kind: str, mode: str, preserve: str = "region", strict: bool = False):
    """``STEPS`` steps: outputs and gradients after each, eager (``mode="eager"``) or checkpointed."""
    register, when = KINDS[kind]
    m = _model()
    kw = dict(preserve=preserve, **({"state": [], "on_undeclared": "raise"} if strict else {}))
    wrapped = StatefulCheckpoint(m, **kw) if mode == "stateful" else None
    out = []
    for step in range(STEPS):
        m.zero_grad()
        x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
        handle = register(m) if when == "around" else None
        try:
            if mode == "eager":
                y = m(x)
            elif mode == "stateful":
                y = wrapped(x)
            elif mode == "nested":
                y = checkpoint(lambda z: checkpoint(m, z, **kw) * 1.0, x, **kw)
            else:
                y = checkpoint(m, x, early_stop=mode == "plain", **kw)
        finally:
            if handle is not None:
                handle.remove()
        handle = register(m) if when == "after" else None
        try:
            y.pow(2).sum().backward()
        finally:
            if handle is not None:
                handle.remove()
        out.append((y.detach().clone(), *(p.grad.clone() for p in m.parameters())))
    return out


@pytest.mark.parametrize("strict", [False, True], ids=["auto", "strict"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_hook_changed_between_forward_and_backward_replays_as_the_forward_ran(kind, preserve, mode, strict):
    want, got = _run(kind, "eager"), _run(kind, mode, preserve, strict)
    for step, (w, g) in enumerate(zip(want, got)):
        for i, (a, b) in enumerate(zip(w, g)):
            assert torch.equal(a, b), f"step {step}: {'output' if i == 0 else f'gradient {i}'} differs from eager"
    assert not _module._global_forward_hooks and not _module._global_forward_pre_hooks


def test_hooks_present_before_the_replay_are_back_after_it():
    """A hook added after the forward is not run by the replay but is there afterwards, and a hook
    the replayed forward registers itself is the forward's only: no second copy is left."""
    m = _model()
    calls = []
    x = torch.randn(3, 4, dtype=D)

    def fn(z):
        if not hasattr(m, "_once"):
            m._once = m[0].register_forward_hook(lambda *a: calls.append("inner") or None)
        return m(z)

    y = checkpoint(fn, x, state=[], on_undeclared="raise")
    late = m[2].register_forward_hook(lambda *a: calls.append("late") or None)
    calls.clear()
    y.sum().backward()
    assert calls == ["inner"]  # the replay ran the forward's hook, not the late one
    assert list(m[2]._forward_hooks) == [late.id] and list(m[0]._forward_hooks) == [m._once.id]
    late.remove()
    m._once.remove()
