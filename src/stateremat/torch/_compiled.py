"""A ``torch.compile``d block inside a checkpointed segment runs uncompiled: said, once per segment.

Measured with torch 2.13 (issue 24, item 5): ``checkpoint(torch.compile(block), x)`` never runs
the compiled graph, neither in the forward nor in the replay, with ``aot_eager`` and with
inductor, and dynamo records no graph break. The segment runs under the transaction's
saved-tensor hooks (and, on its first step and in the replay, the write watch, a torch dispatch
mode); dynamo's guards on the saved-tensor hooks fail, and the recompile is skipped inside the
library's ``torch.compiler.disable`` (a dispatch mode makes dynamo skip the frame too), so the
block's ops run one by one. ``torch.utils.checkpoint`` runs the compiled graph in both (its hooks
are ones dynamo inlines). The result, state and gradients are then those of the uncompiled block,
exactly; but it is not faster, and a backend that draws its own random numbers (inductor, by
default) draws other dropout masks than the compiled block outside a checkpoint. That was silent:
:func:`warn_compiled` says it with a ``UserWarning`` once per segment, naming the compiled part,
the effect and the fix. Nothing here imports ``torch._dynamo``: without it in ``sys.modules``
nothing can be compiled.
"""
from __future__ import annotations

import functools
import sys
import warnings
import weakref
from typing import Any

from torch import nn

_WARNED: "weakref.WeakSet[Any]" = weakref.WeakSet()
_WARNED_IDS: set[int] = set()  # segments that take no weak reference


def compiled_parts(fn: Any, modules: list[tuple[Any, nn.Module]]) -> list[str]:
    """What ``fn`` runs that ``torch.compile`` compiled: ``fn`` itself (a compiled function or
    module) and every reached module that is a ``torch.compile(module)`` or had
    ``module.compile()`` called; ``modules`` as :attr:`~._scan.Reach.modules` (path, module)."""
    if "torch._dynamo" not in sys.modules:
        return []
    optimized = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", ())
    out = []
    while isinstance(fn, functools.partial):
        fn = fn.func
    orig = getattr(fn, "_torchdynamo_orig_callable", None)
    if orig is not None and not isinstance(fn, nn.Module):
        out.append(f"function {getattr(orig, '__qualname__', type(orig).__name__)!r} (torch.compile(fn))")
    for path, m in modules:
        if isinstance(m, optimized):
            out.append(f"module {path or type(m._orig_mod).__name__!r} (torch.compile(module))")
        elif m.__dict__.get("_compiled_call_impl") is not None:
            out.append(f"module {path or type(m).__name__!r} (module.compile())")
    return out


def warn_compiled(fn: Any, modules: list[tuple[Any, nn.Module]], name: str, key: Any) -> None:
    """Warn once per segment ``key`` (its module or function) if it runs something compiled."""
    if "torch._dynamo" not in sys.modules:
        return
    try:
        if key in _WARNED:
            return
    except TypeError:  # no weak reference to it
        if id(key) in _WARNED_IDS:
            return
    parts = compiled_parts(fn, modules)
    if not parts:
        return
    try:
        _WARNED.add(key)
    except TypeError:
        _WARNED_IDS.add(id(key))
    warnings.warn(
        f"stateremat.torch.checkpoint: segment {name!r} runs {', '.join(parts[:3])}"
        f"{' ...' if len(parts) > 3 else ''}, compiled with torch.compile, but inside a stateremat checkpoint "
        "it runs uncompiled, eagerly, in the forward and in the replay (torch.compile does not run under the "
        "segment's state transaction: its saved-tensor hooks and write watch make dynamo skip the compiled "
        "frame). Results, state (BatchNorm statistics, counters) and gradients are those of the uncompiled "
        "block, exactly, but it is not faster, and with a backend that draws its own random numbers (inductor, "
        "by default) the dropout masks and the generator's state differ from the compiled block's outside a "
        "checkpoint. Tip: checkpoint the uncompiled module (checkpoint(compiled._orig_mod, x); this warning "
        "then goes away), or compile the whole model instead, with the checkpoint inside its forward "
        "(torch.compile(model): the segment runs eagerly at one graph break, the rest compiled; README "
        "'Distributed and compiled training').", UserWarning, stacklevel=5)
