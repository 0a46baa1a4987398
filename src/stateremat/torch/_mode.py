"""Interception of in-place writes at the ATen level: which op writes what, and what follows.

An op writes an argument when its schema marks it ``(a!)`` (``alias_info.is_write``). A few
kernels write buffers their schema does not mark (``native_batch_norm`` updates running
statistics in training) and are listed in :data:`HIDDEN_WRITES`.

Two dispatch modes route writes to declared storages to :func:`on_write`:

* :class:`WriteMode` — pushed by a marked tensor's handler (``_mark``) for one call; it knows
  the declared storages that call touches. This is the normal path: ops that touch no
  declared state never reach Python.
* :class:`StrictMode` — pushed around a whole forward or replay when every op must be seen:
  ``on_undeclared="declare"`` (snapshot a reachable tensor before its first write) and
  declared tensors whose class cannot be marked. In a replay it also refuses, before it
  happens, every write to a storage that is neither declared nor allocated during the
  replay (R7).

Danger:
    Writes that bypass the dispatcher (raw pointers, other processes, other streams) are
    invisible here.
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, Iterator

import torch

from stateremat.contract import rule

from ._compat import PLAIN_TENSOR_TYPES, TorchDispatchMode, dtensor_local, has_storage, in_foreign_recompute, \
    in_library_ops
from ._errors import ReplayError
from ._framework import framework_op
from ._preserve import PRESERVERS, Preserver
from ._runtime import DeclaredStorage, Runtime, runtime
from ._storage import storage_key

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


_OUT_ARGS: dict[Any, tuple[tuple[int, str], ...]] = {}


def _out_args(func: Any) -> tuple[tuple[int, str], ...]:
    """Positions and names of ``func``'s ``out=`` arguments (the kernel may resize them)."""
    spec = _OUT_ARGS.get(func)
    if spec is None:
        spec = _OUT_ARGS[func] = tuple((i, a.name) for i, a in enumerate(func._schema.arguments) if a.is_out)
    return spec


def watch_resized_outs(func: Any, args: tuple, kwargs: dict, storages: dict) -> list:
    """The ``out=`` arguments of ``func`` on declared storages (``storages``: key ->
    DeclaredStorage), empty ones included, with their geometry before the call (see
    :func:`note_resized_outs`); empty for ops without ``out=`` arguments (the common case)."""
    spec = _out_args(func)
    if not spec:
        return []
    watched = []
    for i, name in spec:
        v = args[i] if i < len(args) else kwargs.get(name)
        for w in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(w, torch.Tensor) and has_storage(w):
                st = storages.get(storage_key(w))
                if st is not None:
                    watched.append((st, w, w.shape, w.stride(), w.storage_offset()))
    return watched


def note_resized_outs(func: Any, watched: list) -> None:
    """An ``out=`` argument the kernel resized within its storage had bytes written past the
    view the journal recorded (``torch.add(a, b, out=q[0:2])`` with 8 results writes ``q[0:8]``):
    those writes were not journaled, so a region replay of an earlier segment is refused (R8)."""
    for st, w, shape, stride, offset in watched:
        if w.shape != shape or w.stride() != stride or w.storage_offset() != offset:
            st.note_gap(f"{st.name()!r} was written past the bytes journaled for it by {func} (an out= argument "
                        f"of shape {tuple(shape)} resized to {tuple(w.shape)} by the kernel)")


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
    if "torch.distributed.tensor" in sys.modules:
        out = [_shard(t) for t in out]
    return [t for t in out if has_storage(t) and t.numel() > 0]


def _shard(t: torch.Tensor) -> torch.Tensor:
    """``t``, or the local shard a written ``DTensor`` (view) writes: a mode sees the DTensor-level
    op, and the DTensor's dispatch then runs it on the shard, out of any mode's and handler's sight."""
    if type(t) in PLAIN_TENSOR_TYPES:  # (not a DTensor: the common case, without the lookup)
        return t
    local = dtensor_local(t)
    return t if local is None else local


#: Calls whose writes are known at the ``__torch_function__`` level: ``Tensor`` methods that write
#: exactly ``self`` (every element of it), with the ATen op named in messages and journal runs.
_SELF_WRITERS = {
    "add_": _aten.add_.Tensor, "sub_": _aten.sub_.Tensor, "mul_": _aten.mul_.Tensor, "div_": _aten.div_.Tensor,
    "copy_": _aten.copy_.default, "zero_": _aten.zero_.default, "fill_": _aten.fill_.Scalar,
    "lerp_": _aten.lerp_.Scalar, "addcmul_": _aten.addcmul_.default, "addcdiv_": _aten.addcdiv_.default,
    "clamp_": _aten.clamp_.default,
}
_DIRECT: dict[Any, Any] = {getattr(torch.Tensor, n): op for n, op in _SELF_WRITERS.items()}
_BN = torch.nn.functional.batch_norm


def direct_writes(func: Any, args: tuple, kwargs: dict) -> tuple[Any, list[torch.Tensor]] | None:
    """``(ATen op, tensors written)`` of a ``__torch_function__``-level call whose writes are
    known without dispatching it under :class:`WriteMode`; None: dispatch it to find out.

    Known: ``Tensor`` methods that write exactly ``self`` (:data:`_SELF_WRITERS`) and
    ``F.batch_norm`` (in training it writes ``running_mean`` and ``running_var``). The writes are
    recorded before the call runs, so only calls that surely write take this path; the others go
    the dispatch way, where a write is seen only when the kernel is reached: a written tensor
    that requires grad or is an inference tensor (autograd's own checks come first), and a
    batch norm that writes nothing or raises before its kernel (an empty batch, one value per
    channel, ``eps <= 0``, a missing statistic, an input of fewer than two dimensions).
    """
    op = _DIRECT.get(func)
    if op is not None:
        w = args[0] if args else None
        if not isinstance(w, torch.Tensor) or w.requires_grad or w.is_inference():
            return None
        return op, [w]
    if func is _BN:
        return _batch_norm_writes(args, kwargs)
    return None


def _batch_norm_writes(args: tuple, kwargs: dict) -> tuple[Any, list[torch.Tensor]] | None:
    """:func:`direct_writes` of ``F.batch_norm(input, running_mean, running_var, weight, bias,
    training, momentum, eps)``: nothing in evaluation; both statistics in training when the call
    surely reaches its kernel (mirrors ``F.batch_norm``'s own checks); else None."""
    def arg(i: int, name: str, default: Any) -> Any:
        return args[i] if len(args) > i else kwargs.get(name, default)

    if not arg(5, "training", False):
        return _aten.native_batch_norm.default, []
    x, eps, momentum = arg(0, "input", None), arg(7, "eps", 1e-5), arg(6, "momentum", 0.1)
    stats = [arg(1, "running_mean", None), arg(2, "running_var", None)]
    affine = [t for t in (arg(3, "weight", None), arg(4, "bias", None)) if t is not None]
    reaches_kernel = (
        isinstance(x, torch.Tensor) and x.dim() >= 2 and x.numel() > 0
        and x.numel() // x.shape[1] > 1  # more than one value per channel (else ValueError)
        and type(eps) in (float, int) and eps > 0 and type(momentum) in (float, int)
        and x.is_floating_point()
        and all(isinstance(t, torch.Tensor) and not t.requires_grad and not t.is_inference()
                and t.numel() == x.shape[1] for t in stats)
        and all(isinstance(t, torch.Tensor) and t.numel() == x.shape[1] for t in affine))  # else a size error
    return (_aten.native_batch_norm.default, stats) if reaches_kernel else None


def run_direct(known: dict, op: Any, written: list[torch.Tensor], func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` whose writes ``written`` are known (:func:`direct_writes`): route each write to a
    declared storage of ``known`` to :func:`on_write`, call it, then settle the version bumps."""
    hit = []
    for w in written:
        if not has_storage(w) or w.numel() == 0:
            continue
        st = known.get(storage_key(w))
        if st is not None:
            on_write(st, op, (w,), {}, w)
            hit.append(st)
    out = func(*args, **kwargs)
    for st in hit:
        st.observe(journaled=True)
    return out


_BEFORE_WRITES: list = []


def _before_writes() -> list:
    """``(option, before_write)`` of the preserver kinds that keep something per write (the
    region journal); ``whole`` keeps nothing per write. Found once, at the first write."""
    if not _BEFORE_WRITES:
        _BEFORE_WRITES.extend((name, cls.before_write) for name, cls in PRESERVERS.items()
                              if cls.before_write.__func__ is not Preserver.before_write.__func__)
    return _BEFORE_WRITES


def on_write(st: DeclaredStorage, func: Any, args: tuple, kwargs: dict, w: torch.Tensor) -> None:
    """``func`` is about to write ``w``, a tensor on declared storage ``st``.

    In a replay: the replay log keeps the old bytes (or refuses an undeclared write, R7).
    Otherwise: a forward segment on this thread that reaches but does not declare ``st`` is
    told (R7), then every preserver kind keeps what it needs (the region journal, R6).

    Raises:
        ReplayError: ``torch.utils.checkpoint`` is recomputing a segment that writes declared
            state (its replay would write it a second time, outside any transaction).
    """
    rt = runtime()
    st.observe(journaled=False)  # a change since the last seen write is a gap (R8)
    if rt.replay:
        rt.replay[-1].on_write(st, func, args, kwargs, w)
        return
    if in_foreign_recompute():
        raise ReplayError(
            f"stateremat.torch: declared state {st.name()!r} is written by {func} while "
            "torch.utils.checkpoint recomputes a segment (expected writes to declared state to be replayed "
            f"only inside stateremat's transaction, got a second write during backward; {rule('R5')}). Tip: "
            "checkpoint that part with stateremat.torch.checkpoint or StatefulCheckpoint instead of "
            "torch.utils.checkpoint; they nest."
        )
    for seg in reversed(rt.forward):  # innermost segment first (R7)
        if seg.txn.preserver(st.key) is not None:
            break
        seg.check_write(st.key, func)
    owner = rt.forward[-1] if rt.forward else None
    for option, before_write in _before_writes():
        n = before_write(st, func, args, kwargs, w)
        if n and owner is not None and owner.txn.runtime is st.rt:
            owner.txn.credit(option, n)


class WriteMode(TorchDispatchMode):
    """Route writes to the declared storages ``known`` (key -> DeclaredStorage) to :func:`on_write`."""

    def __init__(self, known: dict) -> None:
        super().__init__()
        self.known = known
        self.hit: list[DeclaredStorage] = []  # written storages: their version bumps come after dispatch

    def _settle(self) -> None:
        for st in self.hit:  # an earlier op's version bumps are done: seen writes, not gaps
            st.observe(journaled=True)
        self.hit = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.hit:  # one call making several writes (fill_diagonal_ with wrap, instance_norm)
            self._settle()
        writes = _WRITES.get(func)
        if writes is None:
            writes = _writes(func)
        if not writes:
            return func(*args, **kwargs)
        for w in written_tensors(func, args, kwargs):
            st = self.known.get(storage_key(w))
            if st is not None:
                on_write(st, func, args, kwargs, w)
                self.hit.append(st)
                st.bumps_due += 1
        watched = watch_resized_outs(func, args, kwargs, self.known)
        out = func(*args, **kwargs)
        note_resized_outs(func, watched)
        return out

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._settle()  # the call is complete: its version bumps were seen writes
        return out


def _touch(touched: set, args: tuple, kwargs: dict) -> None:
    """Note the storages of an op's tensor arguments (one level of lists: ``cat``, ``stack``)."""
    for a in (*args, *kwargs.values()):
        for t in (a if type(a) in (list, tuple) else (a,)):
            if isinstance(t, torch.Tensor) and has_storage(t):
                touched.add(storage_key(t))


class StrictMode(TorchDispatchMode):
    """See every op of a forward (``role="forward"``) or replay (``role="replay"``) on this thread.

    Args:
        rt: the segment's runtime (declared storages by key).
        role: ``"forward"`` or ``"replay"``.
        segment: the replaying segment (``role="replay"``): names refused writes, decides R7.
    """

    def __init__(self, rt: Runtime, role: str, segment: Any = None) -> None:
        super().__init__()
        self.rt = rt
        self.role = role
        self.segment = segment
        self.created: set[int] = set()  # addresses of storages allocated during this replay
        self.pending: list[DeclaredStorage] = []  # written by the last op; its version bump follows dispatch

    def _settle(self) -> None:
        for st in self.pending:
            st.observe(journaled=True)
        self.pending = []

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._settle()
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.pending:
            self._settle()
        if self.rt.touched is not None and self.role == "forward" and not in_library_ops():
            _touch(self.rt.touched, args, kwargs)  # (what the forward reads, not our own checks' ops)
        writes = _WRITES.get(func)
        if writes is None:
            writes = _writes(func)
        hit = self.pending
        if writes:
            declared_now: set = set()  # storages this call declared: their handler came too late for it
            for w in written_tensors(func, args, kwargs):
                key = storage_key(w)
                st = self.rt.storages.get(key)
                if st is not None and st.marks and not st.unmarkable and key not in declared_now:
                    continue  # the marked tensors' handler sees this write
                if st is not None:
                    on_write(st, func, args, kwargs, w)
                    hit.append(st)
                    st.bumps_due += 1
                elif self.role == "forward":
                    for seg in reversed(self.rt.forward):
                        seg.check_write(key, func)
                    st = self.rt.storages.get(key)
                    if st is not None:  # declared just now (on_undeclared="declare", state="auto"):
                        declared_now.add(key)
                        on_write(st, func, args, kwargs, w)  # a journal keeps this first write too
                        hit.append(st)
                        st.bumps_due += 1
                    elif self.rt.forward and w.untyped_storage().data_ptr() not in self.created and not framework_op(func):
                        self.rt.forward[-1].unreached_write(w)  # pre-existing, yet no scan reached it
                elif w.untyped_storage().data_ptr() not in self.created and self.segment is not None \
                        and not framework_op(func):
                    self.segment.undeclared_at_replay(w, func, "a storage that is not declared")
        watched = watch_resized_outs(func, args, kwargs, self.rt.storages) if writes else []
        out = func(*args, **kwargs)
        note_resized_outs(func, watched)
        if self.role == "replay" or self.rt.forward:  # (a watched forward: what it creates is no state)
            fresh = _FRESH.get(func)
            if fresh is None:
                fresh = _fresh(func)
            outs = out if type(out) is tuple or type(out) is list else (out,)
            for i in fresh:
                if i < len(outs) and isinstance(outs[i], torch.Tensor):
                    self._record_one(outs[i], () if func in _LIFT else args)
        return out

    def _record_one(self, t: torch.Tensor, args: tuple) -> None:
        # Keys are raw storage addresses (host and device allocations do not share addresses).
        dist = "torch.distributed.tensor" in sys.modules
        if dist:  # a DTensor made in the replay: its shard is new
            t = _shard(t)
        if not has_storage(t):
            return
        try:
            ptr = t.untyped_storage().data_ptr()
        except RuntimeError:  # a wrapper subclass's storage has no data: nothing to record
            return
        if ptr and ptr not in self.created:
            # Some ops (``_unsafe_view``, ``unsafe_split``) return an unannotated alias of an argument.
            for a in args:
                if not isinstance(a, torch.Tensor):
                    continue
                if dist:
                    a = _shard(a)
                if has_storage(a) and a.untyped_storage().data_ptr() == ptr:
                    return
            self.created.add(ptr)


def warn_undeclared(msg: str) -> None:
    """Emit the ``on_undeclared="warn"`` warning."""
    warnings.warn(msg, UndeclaredStateWarning, stacklevel=4)


class UndeclaredStateWarning(UserWarning):
    """An undeclared in-place write inside a checkpointed segment (``on_undeclared="warn"``, R7)."""


@contextlib.contextmanager
def strict_forward(rt: Runtime) -> Iterator[None]:
    """Watch every op on this thread as a forward (:class:`StrictMode`), counted in
    ``rt.strict_depth`` so nested callers push it once."""
    rt.strict_depth += 1
    try:
        with StrictMode(rt, "forward"):
            yield
    finally:
        rt.strict_depth -= 1
