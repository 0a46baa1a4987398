"""Names of declared state and of tensors a segment can reach (undeclared-write detection, R7).

A segment can reach: the parameters, buffers and plain tensor attributes of the module it
runs (``fn`` itself, a bound method's ``self``, modules captured in its closure or named as
globals), tensors in its arguments, and tensors captured in its closure or named as globals,
including one level into captured lists, tuples, dicts and plain objects' attributes. Their
version counters are read before and after the forward; a change on one that is not
declared is an undeclared in-place write.

Danger:
    Tensors reachable only through deeper object graphs are not scanned in the forward, and
    writes that do not bump version counters (``native_batch_norm``'s running statistics) are
    seen in the forward only while the dispatch mode is active (region journaling or
    ``on_undeclared="declare"``); both are refused at recomputation by the replay mode.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten


def root_module(fn: Callable) -> nn.Module | None:
    """The module ``fn`` runs: ``fn`` itself, a bound method's ``self`` or either inside a
    ``functools.partial``; else ``None``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, nn.Module):
        return fn
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _module_path(m: nn.Module, root: nn.Module | None) -> str:
    if root is not None:
        if m is root:
            return ""
        for path, sub in root.named_modules():
            if sub is m:
                return path
    return type(m).__name__


def resolve_state(state: Any, root: nn.Module | None, prefix: str = "") -> list[tuple[str, torch.Tensor, int]]:
    """Flatten ``state=`` into ``(name, tensor, group)``; a module contributes all its buffers.

    Raises:
        TypeError: if an entry is neither a tensor nor a module.
    """
    out: list[tuple[str, torch.Tensor, int]] = []

    def add(obj: Any, where: str) -> None:
        if obj is None:
            return
        if isinstance(obj, torch.Tensor):
            out.append((where, obj, id(obj)))
        elif isinstance(obj, nn.Module):
            path = _module_path(obj, root)
            base = ".".join(p for p in (prefix, path) if p)
            for bname, b in obj.named_buffers():
                out.append((f"{base}.{bname}" if base else bname, b, id(obj)))
        elif isinstance(obj, (list, tuple)):
            for i, x in enumerate(obj):
                add(x, f"state[{i}]")
        else:
            raise TypeError(
                f"stateremat.torch.checkpoint: state= expects tensors and/or nn.Modules (all their "
                f"buffers), got {type(obj).__name__} at {where}. Tip: pass e.g. "
                "state=[model.queue, model.bn]."
            )

    add(state, "state")
    return out


def describe(name: Any) -> str:
    """Human-readable name of a reachable tensor (names are formatted only when reported)."""
    if not isinstance(name, tuple):
        return name
    kind, path, attr = name
    full = f"{path}.{attr}" if path else attr
    return f"{kind} {full!r}" + (" (not a registered buffer)" if kind == "tensor attribute" else "")


def _add_module(out: dict[int, tuple[Any, torch.Tensor]], m: nn.Module, prefix: str) -> None:
    # One pass over the module tree; __dict__ holds unregistered tensor attributes
    # (s.count = torch.zeros(1)), which replay would otherwise write twice.
    for path, sub in m.named_modules(prefix=prefix):
        for kind, d in (("parameter", sub._parameters), ("buffer", sub._buffers), ("tensor attribute", sub.__dict__)):
            for k, v in d.items():
                if isinstance(v, torch.Tensor) and id(v) not in out:
                    out[id(v)] = ((kind, path, k), v)


def _add_callable(out: dict[int, tuple[str, torch.Tensor]], fn: Any, prefix: str, depth: int = 0) -> None:
    if depth > 2:
        return
    if isinstance(fn, functools.partial):
        _add_callable(out, fn.func, prefix, depth + 1)
        _add_values(out, list(fn.args) + list(fn.keywords.values()), "partial argument", prefix)
        return
    root = root_module(fn)
    if root is not None:
        _add_module(out, root, prefix)
        fn = getattr(type(root), "forward", None) if fn is root else getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    cells = getattr(fn, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, cells):
        try:
            v = cell.cell_contents
        except ValueError:  # empty cell
            continue
        _add_value(out, v, f"captured variable {name!r}", name)
    glb = getattr(fn, "__globals__", {})
    for name in code.co_names:
        v = glb.get(name)
        if isinstance(v, (torch.Tensor, nn.Module)):
            _add_value(out, v, f"global {name!r}", name)


def _add_value(out: dict[int, tuple[str, torch.Tensor]], v: Any, what: str, prefix: str,
               depth: int = 0) -> None:
    if isinstance(v, torch.Tensor):
        out.setdefault(id(v), (what, v))
    elif isinstance(v, nn.Module):
        _add_module(out, v, prefix)
    elif depth > 0:
        return
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _add_value(out, x, f"{what}[{i}]", prefix, 1)
    elif isinstance(v, dict):
        for k, x in v.items():
            _add_value(out, x, f"{what}[{k!r}]", prefix, 1)
    elif not isinstance(v, (type, types.ModuleType)) and isinstance(getattr(v, "__dict__", None), dict) and not callable(v):
        for k, x in vars(v).items():  # attributes of a plain object, one level
            _add_value(out, x, f"{what}.{k}", prefix, 1)


def _add_values(out: dict[int, tuple[str, torch.Tensor]], values: list[Any], what: str, prefix: str) -> None:
    for i, v in enumerate(values):
        _add_value(out, v, f"{what} {i}", prefix)


def reachable(fn: Callable, args: tuple, kwargs: dict, module_prefix: str = "") -> list[tuple[Any, torch.Tensor]]:
    """Pre-existing tensors the segment can reach, each with a name for :func:`describe`."""
    out: dict[int, tuple[str, torch.Tensor]] = {}
    _add_callable(out, fn, module_prefix)
    for i, a in enumerate(args):
        if isinstance(a, nn.Module):
            _add_module(out, a, f"argument{i}")
        else:
            for leaf in tree_flatten(a)[0]:
                if isinstance(leaf, torch.Tensor):
                    out.setdefault(id(leaf), (f"argument {i}", leaf))
    for k, a in kwargs.items():
        for leaf in tree_flatten(a)[0]:
            if isinstance(leaf, torch.Tensor):
                out.setdefault(id(leaf), (f"keyword argument {k!r}", leaf))
    return [v for v in out.values() if v[1].layout == torch.strided and not v[1].is_meta]
