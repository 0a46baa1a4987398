"""Interception of in-place writes: journaling (forward), replay capture, undeclared writes.

A ``TorchDispatchMode`` sees every ATen op below autograd. An op writes an argument when
its schema marks it ``(a!)`` (``alias_info.is_write``). A few kernels write buffers their
schema does not mark (``native_batch_norm`` updates running statistics in training) and are
listed in :data:`HIDDEN_WRITES`.

During a replay the mode also refuses, before it happens, every write to a storage that is
neither declared nor allocated during the replay (R7): such a write would happen a second
time, whatever path (unregistered attribute, container, plain object) reached the tensor.

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
#: Per op: does it (maybe) write an argument? ``func._schema.is_mutable`` is a C++ call.
_WRITES: dict[Any, bool] = {}
#: Per op: positions of its returns that own fresh storage (no alias annotation).
_FRESH: dict[Any, tuple[int, ...]] = {}
#: Ops whose aliasing return is a tensor made from Python data (``torch.tensor``): fresh.
_LIFT = {_aten.lift_fresh.default}
if hasattr(_aten, "lift_fresh_copy"):
    _LIFT.add(_aten.lift_fresh_copy.default)


def _writes(func: Any) -> bool:
    w = _WRITES.get(func)
    if w is None:
        w = _WRITES[func] = bool(func._schema.is_mutable or func in HIDDEN_WRITES)
    return w


def _fresh(func: Any) -> tuple[int, ...]:
    f = _FRESH.get(func)
    if f is None:
        rets = func._schema.returns
        f = _FRESH[func] = tuple(i for i, r in enumerate(rets) if func in _LIFT or r.alias_info is None)
    return f


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
    """Journal writes to declared storages (forward) or capture them for reinstatement (replay).

    Args:
        role: ``"forward"`` (journal writes to region-declared storages, catch undeclared writes
            to reachable tensors) or ``"replay"``.
        segment: the replaying segment (role ``"replay"``); its ``on_undeclared`` decides what
            a write to pre-existing undeclared state does, and it names the tensor.
    """

    def __init__(self, role: str, segment: Any = None) -> None:
        super().__init__()
        self.role = role  # "forward" | "replay"
        self.segment = segment
        self.created: set[int] = set()  # addresses of storages allocated during this replay

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        writes = _WRITES.get(func)
        if writes is None:
            writes = _writes(func)
        if writes:
            for w in written_tensors(func, args, kwargs):
                if self.role == "forward":
                    _before_forward_write(func, args, kwargs, w)
                else:
                    self._before_replay_write(func, args, kwargs, w)
        out = func(*args, **kwargs)
        if self.role == "replay":
            fresh = _FRESH.get(func)
            if fresh is None:
                fresh = _fresh(func)
            if fresh == (0,) and type(out) is torch.Tensor:  # the common case
                self._record_one(out, () if func in _LIFT else args)
            elif fresh:
                outs = out if type(out) is tuple or type(out) is list else (out,)
                for i in fresh:
                    if i < len(outs) and isinstance(outs[i], torch.Tensor):
                        self._record_one(outs[i], () if func in _LIFT else args)
        return out

    def _record_one(self, t: torch.Tensor, args: tuple) -> None:
        # Keys are raw storage addresses (cheaper than storage_key; host and device
        # allocations do not share addresses). 0 is a meta or empty storage.
        if t.layout != torch.strided:
            return
        ptr = t.untyped_storage().data_ptr()
        if ptr and ptr not in self.created:
            # Some ops (``_unsafe_view``, ``unsafe_split``) return an unannotated alias of an argument.
            for a in args:
                if isinstance(a, torch.Tensor) and a.layout == torch.strided and a.untyped_storage().data_ptr() == ptr:
                    return
            self.created.add(ptr)

    def _before_replay_write(self, func: Any, args: tuple, kwargs: dict, w: torch.Tensor) -> None:
        key = storage_key(w)
        log = LOCAL.replay[-1] if LOCAL.replay else None
        item = log.items.get(key) if log is not None else None
        seg = self.segment
        if item is None:
            if w.untyped_storage().data_ptr() not in self.created and seg is not None \
                    and seg.on_undeclared != "warn":
                seg.undeclared_at_replay(w, func, "a storage that is not declared")
            return
        if item.kind == "whole":
            return  # the snapshot holds every byte of the storage: reinstatement restores it
        log.copy_aliases(key)  # saved tensors that alias these bytes keep their replayed version
        tr = item.tracker
        runs = round_runs(write_runs(func, args, kwargs, w), tr.granularity_bytes, tr.nbytes)
        if runs.shape[0]:
            with torch.no_grad():
                log.writes.append((tr, runs, gather(tr.flat, runs)))


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
        n = tr.journal(write_runs(func, args, kwargs, w))
        if owner is not None:
            owner.txn.journal_bytes += n
        COUNTERS.touch()


def warn_undeclared(msg: str) -> None:
    """Emit the ``on_undeclared="warn"`` warning."""
    warnings.warn(msg, UndeclaredStateWarning, stacklevel=4)


class UndeclaredStateWarning(UserWarning):
    """An undeclared in-place write inside a checkpointed segment (``on_undeclared="warn"``, R7)."""
