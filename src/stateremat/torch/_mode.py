"""Interception of in-place writes: journaling (forward), replay capture, undeclared writes.

A ``TorchDispatchMode`` sees every ATen op below autograd. An op writes an argument when
its schema marks it ``(a!)`` (``alias_info.is_write``). A few kernels write buffers their
schema does not mark (``native_batch_norm`` updates running statistics in training) and are
listed in :data:`HIDDEN_WRITES`.

Danger:
    Writes that bypass the dispatcher (``tensor.data`` tricks on another object, raw
    pointers, other threads or streams) are invisible here.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _journal
from ._context import LOCAL
from ._journal import gather
from ._stats import COUNTERS
from ._storage import round_runs, storage_key, write_runs

_aten = torch.ops.aten

#: Kernels that write arguments their schema does not mark as written:
#: op -> (written argument positions, position of the ``training`` flag).
HIDDEN_WRITES: dict[Any, tuple[tuple[int, ...], int]] = {
    _aten.native_batch_norm.default: ((3, 4), 5),
}
for _name in ("cudnn_batch_norm", "miopen_batch_norm"):
    if hasattr(_aten, _name):
        HIDDEN_WRITES[getattr(_aten, _name).default] = ((3, 4), 5)

_WRITE_ARGS: dict[Any, tuple[tuple[int, str, bool], ...]] = {}


def _write_args(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """Positions, names and list-ness of the arguments ``func``'s schema says it writes."""
    spec = _WRITE_ARGS.get(func)
    if spec is None:
        spec = tuple(
            (i, a.name, isinstance(a.type, torch.ListType))
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        _WRITE_ARGS[func] = spec
    return spec


def written_tensors(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensors ``func(*args, **kwargs)`` writes in place (schema-marked plus hidden writes)."""
    out: list[torch.Tensor] = []
    hidden = HIDDEN_WRITES.get(func)
    if hidden is not None:
        positions, training = hidden
        if len(args) > training and args[training]:
            out.extend(args[p] for p in positions if len(args) > p and isinstance(args[p], torch.Tensor))
    for i, name, is_list in _write_args(func):
        v = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif is_list and v is not None:
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return [t for t in out if t.layout == torch.strided and t.device.type != "meta" and t.numel() > 0]


class StateMode(TorchDispatchMode):
    """Journal writes to declared storages (forward) or capture them for reinstatement (replay)."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role  # "forward" | "replay"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable or func in HIDDEN_WRITES:
            for w in written_tensors(func, args, kwargs):
                if self.role == "forward":
                    _before_forward_write(func, args, kwargs, w)
                else:
                    _before_replay_write(func, args, kwargs, w)
        return func(*args, **kwargs)


def _before_forward_write(func: Any, args: tuple, kwargs: dict, w: torch.Tensor) -> None:
    key = storage_key(w)
    for seg in reversed(LOCAL.forward):  # innermost segment first (R7)
        if key in seg.txn.items:
            break  # declared here; the enclosing segments adopt the declaration
        if seg.candidate_keys is not None and key in seg.candidate_keys:
            seg.undeclared_before_write(key, seg.candidate_keys[key], func)
    tr = _journal.TRACKERS.get(key)
    if tr is not None and tr.consumers:
        owner = LOCAL.forward[-1] if LOCAL.forward else None
        n = tr.journal(write_runs(func, args, kwargs, w), id(owner) if owner is not None else 0)
        if owner is not None:
            owner.txn.journal_bytes += n
        COUNTERS.touch()


def _before_replay_write(func: Any, args: tuple, kwargs: dict, w: torch.Tensor) -> None:
    if not LOCAL.replay:
        return
    log = LOCAL.replay[-1]
    key = storage_key(w)
    item = log.keys.get(key)
    if item is None:
        return
    log.copy_aliases(key)  # saved tensors that alias these bytes keep their replayed version
    tr = item.tracker
    runs = round_runs(write_runs(func, args, kwargs, w), tr.granularity_bytes, tr.nbytes)
    if runs.shape[0]:
        with torch.no_grad():
            log.writes.append((tr, runs, gather(tr.flat, runs)))


def warn_undeclared(msg: str) -> None:
    """Emit the ``on_undeclared="warn"`` warning."""
    warnings.warn(msg, UndeclaredStateWarning, stacklevel=4)


class UndeclaredStateWarning(UserWarning):
    """An undeclared in-place write inside a checkpointed segment (``on_undeclared="warn"``, R7)."""
