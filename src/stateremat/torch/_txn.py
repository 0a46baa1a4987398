"""The replay transaction of one segment: preserve declared state, restore it, reinstate it.

Per declared storage a segment holds one :class:`~._preserve.Preserver` of the segment's
option (``whole`` or ``region``). At recomputation :meth:`Transaction.replay` restores ``B0``
(R2), lets the segment re-run, undoes the replay's own writes, then reinstates the visible
bytes and version counters exactly (R5). Module attributes rebound during the forward
(``self.m = self.m + 1``, ``self.m.data = ...``) are rebound to their forward-start tensors
for the replay and back afterwards.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from . import _mark
from ._compat import DisableTorchFunctionSubclass, has_storage, library_ops, reset_versions
from ._errors import ReplayError, UnsupportedError
from ._framework import framework_swap
from stateremat.contract import rule
from ._preserve import PRESERVERS, Preserver, Restored, WholePreserver
from ._runtime import DeclaredStorage, Runtime, runtime
from ._scan import tensor_slots
from ._storage import StorageKey, gather, runs_within, scatter, storage_key, write_runs


#: Storages up to this size are kept by a whole snapshot even under ``region``: copying 16 KiB
#: costs less than journaling one write (about a microsecond per clone of a few KiB against tens
#: of microseconds of Python per journaled write, sampled on a ResNet-18 block; the end-to-end
#: effect is printed by ``benchmarks/bench_journal.py``), and a whole snapshot needs no write to be seen, so the
#: statistics a kernel updates without a version bump (batch norm's, run past the write handler
#: by a tensor subclass whose own ``__torch_function__`` takes the call first) and writes through
#: aliases the journal does not see are replayed right instead of refused. Larger storages, where
#: region exists to save memory, are journaled.
SMALL_STORAGE_BYTES = 1 << 14


class ReplayLog:
    """Pre-write bytes of writes made during a replay (undone to reinstate, R5).

    Args:
        segment: the replaying segment.
        items: every declared storage of the segment (key -> preserver).
    """

    def __init__(self, segment: Any, items: dict[StorageKey, Preserver]) -> None:
        self.segment = segment
        self.items = items
        self.writes: list[tuple[DeclaredStorage, np.ndarray, torch.Tensor]] = []
        # Recomputed saved tensors that alias a region-journaled storage, not yet copied:
        # (key, copy-and-store callback). Copied lazily, before bytes under them change (R1).
        self.aliases: list[tuple[StorageKey, Callable[[], int]]] = []
        self.alias_bytes = 0  # bytes of saved-tensor aliases copied at pack time (whole items)
        # key -> runs the restore set aside and reinstates after the replay: a replay write
        # inside them needs no undo (the reinstatement overwrites it)
        self.covered: dict[StorageKey, np.ndarray] = {}

    def on_write(self, st: DeclaredStorage, func: Any, args: tuple, kwargs: dict, w: torch.Tensor) -> None:
        """A write to declared storage ``st`` during this replay."""
        p = self.items.get(st.key)
        if p is None:
            self.segment.undeclared_at_replay(w, func, "declared state of another segment")
            return
        if not p.captures_replay_writes:
            return  # the visible bytes set aside cover every byte of the storage
        self.copy_aliases(st.key)
        runs = write_runs(func, args, kwargs, w)
        cover = self.covered.get(st.key)
        if cover is not None and runs_within(runs, cover):
            return
        if runs.shape[0]:
            with library_ops():
                self.writes.append((st, runs, gather(st.flat, runs)))

    def copy_aliases(self, key: StorageKey) -> int:
        """Copy the pending aliases of ``key`` (called before their bytes change); return bytes copied."""
        keep, copied = [], 0
        for k, copy in self.aliases:
            if k == key:
                copied += copy()
            else:
                keep.append((k, copy))
        self.aliases = keep
        return copied


def _slot_get(m: nn.Module, d: str, k: str) -> Any:
    return getattr(m, d).get(k, None)


def put_binding(table: dict, key: str, present: bool, value: Any) -> None:
    """Bind ``key`` in a module's table (``_parameters``, ``_buffers``, ``__dict__``,
    ``_modules``) to ``value``, or remove it when ``present`` is false."""
    if present:
        table[key] = value
    else:
        table.pop(key, None)


def _slot_set(m: nn.Module, d: str, k: str, v: Any) -> None:
    """Set (``v`` a tensor) or remove (``v`` None) a module's parameter/buffer/attribute slot."""
    put_binding(getattr(m, d), k, v is not None, v)


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr() if has_storage(t) else None
    except RuntimeError:  # a wrapper subclass's storage has no data
        return None


def view_records(tensors: Any) -> list[tuple]:
    """Each tensor's view of its storage: ``(tensor, offset, size, stride, dtype, storage address)``;
    tensors with an autograd history are left out (a segment's inputs, saved separately; holding
    them would tie the graph to the segment)."""
    out = []
    with DisableTorchFunctionSubclass():
        for t in tensors:
            ptr = _storage_ptr(t) if t.grad_fn is None else None
            if ptr is not None:
                out.append((t, t.storage_offset(), t.size(), t.stride(), t.dtype, ptr))
    return out


def moved_views(records: list[tuple]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The recorded tensors whose view of the *same* storage changed since (``t_()``,
    ``as_strided_()``, ``.data = t.view(dtype)``), each with a tensor of the recorded view (a
    storage rebinding is not a view change: the replay refuses it for declared state)."""
    out = []
    with DisableTorchFunctionSubclass():
        for t, off, size, stride, dtype, ptr in records:
            if (t.storage_offset() != off or t.size() != size or t.stride() != stride or t.dtype != dtype) \
                    and _storage_ptr(t) == ptr:
                with library_ops():
                    out.append((t, torch.empty(0, dtype=dtype, device=t.device).set_(
                        t.untyped_storage(), off, size, stride)))
    return out


@contextlib.contextmanager
def views_as_of(swaps: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """Give each tensor of ``swaps`` the paired view (``.data``) for the block, its own after."""
    if not swaps:
        yield
        return
    with library_ops():
        now = [(t, t.detach()) for t, _ in swaps]
    with torch.no_grad():
        for t, orig in swaps:
            t.data = orig
    try:
        yield
    finally:
        with torch.no_grad():
            for t, v in now:
                t.data = v


class Bindings:
    """Which tensor each declared module attribute names, and which storage each declared tensor uses.

    A forward that rebinds (``self.m = self.m + 1``, ``register_buffer("m", ...)``) or swaps
    storage (``self.m.data = ...``) changes what the replay would read; the replay runs with the
    forward-start bindings, which are reinstated afterwards.
    """

    def __init__(self, modules: list[tuple[str, nn.Module]], tensors: list[torch.Tensor],
                 slots: list[tuple[nn.Module, str, str, Any]] = ()) -> None:
        self.mods = list({id(m): m for _, mod in modules for m in mod.modules()}.values())
        self.slots = [(m, d, k, v) for m in self.mods for (d, k), v in tensor_slots(m).items()] + list(slots)
        with DisableTorchFunctionSubclass():  # where each declared tensor's bytes live now
            self.data = [(t, st, t.storage_offset(), t.size(), t.stride(), t.data_ptr(), st.data_ptr(), t.dtype)
                         for t in tensors if has_storage(t) for st in (t.untyped_storage(),)]
        self.rebound: list[tuple[nn.Module, str, str, Any]] = []
        self.swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.geometry: list[tuple] = []  # view_records of the declared tensors after the forward

    def settle(self, now: dict[int, dict] | None = None) -> None:
        """After the forward: note what changed (nothing kept when nothing did).

        Args:
            now: ``id(module) -> tensor_slots(module)`` already taken after the forward, if any.
        """
        now = now or {}
        self.rebound = [(m, d, k, v) for m, d, k, v in self.slots
                        if _slot_get(m, d, k) is not v and not framework_swap(d, v, _slot_get(m, d, k))]
        start = {(id(m), d, k) for m, d, k, _ in self.slots}
        self.rebound += [(m, d, k, None) for m in self.mods
                         for (d, k) in (now[id(m)] if id(m) in now else tensor_slots(m))
                         if (id(m), d, k) not in start]  # created by the forward (a lazy buffer)
        with DisableTorchFunctionSubclass():
            moved = [e for e in self.data if e[0].data_ptr() != e[5] or e[0].untyped_storage().data_ptr()
                     != e[1].data_ptr() or e[0].size() != e[3] or e[0].stride() != e[4] or e[0].dtype != e[7]]
            # the same storage object, reallocated: resize_ grew it inside the forward; its bytes
            # before the forward are gone with the old allocation, so no replay can start from them
            # (a view moved within the same allocation — as_strided_, set_ — is swapped back below)
            grown = [e for e in moved if e[0].untyped_storage().data_ptr() == e[1].data_ptr() != e[6]]
        if grown:
            t = grown[0][0]
            raise UnsupportedError(
                f"stateremat.torch.checkpoint: a declared tensor (now shape {tuple(t.shape)}, {t.dtype}) was "
                "resized inside the segment's forward (resize_ grew its storage), so the bytes the replay "
                "must start from are gone (expected declared state to keep its storage within a segment; "
                "torch.ao observers grow their buffers on their first call). Tip: run one step without "
                "checkpointing first (the buffer then has its final size), or allocate it at full size.")
        with library_ops():
            self.swapped = [(t, torch.empty(0, dtype=dtype, device=t.device).set_(st, off, size, stride))
                            for t, st, off, size, stride, _, _, dtype in moved]
        # the others' geometry: an in-place metadata change after the forward (t_(), transpose_(),
        # as_strided_() on the same bytes) must not reach the replay either
        ids = {id(e[0]) for e in moved}
        self.geometry = [(t, off, size, stride, dtype, sptr) for t, _, off, size, stride, _, sptr, dtype in self.data
                         if id(t) not in ids]
        self.slots, self.data = [], []

    @contextlib.contextmanager
    def as_of_forward_start(self) -> Iterator[None]:
        regeometried = moved_views(self.geometry) if self.geometry else []
        if not (self.rebound or self.swapped or regeometried):
            yield
            return
        now_slots = [(m, d, k, _slot_get(m, d, k)) for m, d, k, _ in self.rebound]
        for m, d, k, v in self.rebound:
            _slot_set(m, d, k, v)
        try:
            with views_as_of(self.swapped + regeometried):
                yield
        finally:
            for m, d, k, v in now_slots:
                _slot_set(m, d, k, v)


class Transaction:
    """Declared state of one segment and its preservation.

    Args:
        rt: the runtime the segment runs in.
        segment_id: unique id of the segment.
        declared: ``(name, tensor, group)`` triples (the group names the declaring module).
        preserve: an option name with a preserver (``"whole"`` or ``"region"``).
        granularity_bytes: region journal chunk size in bytes.
    """

    def __init__(self, rt: Runtime, segment_id: int, declared: list[tuple[str, torch.Tensor, int]],
                 preserve: str, granularity_bytes: int | None) -> None:
        self.runtime = rt
        self.segment_id = segment_id
        self.preserve = preserve
        self.granularity_bytes = granularity_bytes
        self.items: dict[StorageKey, Preserver] = {}
        self.journal_bytes = 0  # bytes journaled by this segment's own forward writes
        self._declared = declared
        self._released = False
        #: storages a kernel writes without a version bump (running statistics of normalization
        #: layers in training, or a buffer they are views of), and those layers' batch counters:
        #: kept by a whole snapshot even under ``region``, since a journal relies on seeing every
        #: write (a tensor subclass whose own ``__torch_function__`` runs the norm hides it) and the
        #: kernel rewrites all their bytes. (Storages of at most SMALL_STORAGE_BYTES are kept whole
        #: in ``begin`` whatever their keys.)
        self.whole_keys: set[StorageKey] = set()

    # -- forward -------------------------------------------------------------------------
    def begin(self) -> None:
        """Preserve ``B0`` of every declared storage (called as the forward begins).

        Raises:
            UnsupportedError: a declared tensor has no dense strided storage.
        """
        by_key: dict[StorageKey, list[tuple[str, torch.Tensor]]] = {}
        for name, t, _group in self._declared:
            if t.is_inference():
                raise UnsupportedError(
                    f"stateremat.torch.checkpoint: declared state {name!r} is an inference tensor (made under "
                    "torch.inference_mode), which has no version counter, so its writes cannot be tracked and "
                    "autograd refuses to save it (expected a normal tensor). Tip: make it outside inference mode, "
                    "or replace it once with a normal copy (e.g. module.register_buffer(name, t.clone()) outside "
                    "torch.inference_mode()).")
            if not has_storage(t):
                raise UnsupportedError(
                    f"stateremat.torch.checkpoint: declared state {name!r} must be a dense strided "
                    f"tensor with storage, got {type(t).__name__} layout={t.layout}, device={t.device}. "
                    "Tip: declare the dense buffers that hold the state."
                )
            with DisableTorchFunctionSubclass():
                by_key.setdefault(storage_key(t), []).append((name, t))
        cls = PRESERVERS[self.preserve]
        with library_ops():  # once for every storage's snapshot
            for key, members in by_key.items():
                st = self.runtime.acquire(key, members[0][1])
                for name, t in members:  # every declared tensor on the storage watches its version (R8)
                    if st.add_witness(t, name) and not _mark.mark_tensor(t, st):
                        st.unmarkable = True  # writes to it reach on_write from now on, or via StrictMode
                whole = key in self.whole_keys or st.nbytes <= SMALL_STORAGE_BYTES
                self._add(key, st, [n for n, _ in members], WholePreserver if whole else cls)

    def _add(self, key: StorageKey, st: DeclaredStorage, names: list[str], cls: type[Preserver]) -> Preserver:
        p = cls(st, self.segment_id, self.granularity_bytes)
        p.names = names
        p.begin()
        self.items[key] = p
        return p

    def promote(self, name: str, t: torch.Tensor) -> None:
        """Declare ``t`` now, before its first write, with a whole snapshot (``on_undeclared="declare"``)."""
        key = storage_key(t)
        st = self.runtime.acquire(key, t)
        if st.add_witness(t, name) and not _mark.mark_tensor(t, st):
            st.unmarkable = True
        self._add(key, st, [name], WholePreserver)

    def adopt(self, inner: "Transaction") -> None:
        """Take over the items of a nested segment this segment encloses (its ``B0`` is ours too)."""
        for key, p in inner.items.items():
            if key in self.items:
                continue
            p.storage.users += 1
            self.items[key] = p.adopt(self.segment_id)

    def credit(self, key: StorageKey, n: int) -> None:
        """``n`` journal bytes were kept for a write this segment's forward made to ``key``."""
        self.journal_bytes += n
        p = self.items.get(key)
        if p is not None and hasattr(p, "own_bytes"):
            p.own_bytes += n

    def has_unmarkable(self) -> bool:
        """True if a journaled storage's tensors cannot be marked (every op must be watched)."""
        return any(p.storage.unmarkable for p in self.items.values())

    @property
    def snapshot_bytes(self) -> int:
        """Whole-snapshot bytes this segment owns."""
        return sum(p.retained_bytes for p in self.items.values() if p.name == "whole")

    def release(self) -> None:
        """Free snapshots and stop consuming journals (the segment can no longer replay)."""
        if self._released:
            return
        self._released = True
        for p in self.items.values():
            p.release()
            p.storage.rt.release(p.storage)
        self.items.clear()

    # -- recomputation -------------------------------------------------------------------
    @contextlib.contextmanager
    def replay(self, segment: Any) -> Iterator[ReplayLog]:
        """Restore ``B0`` of every item, yield for the re-run, then reinstate (R2, R5).

        Raises:
            ReplayError: a region journal has a gap since the segment's forward (R8).
        """
        rt_exec = runtime()
        log = ReplayLog(segment, dict(self.items))
        if not self.items:
            rt_exec.replay.append(log)
            try:
                yield log
            finally:
                rt_exec.replay.pop()
            return
        witnesses = {id(w): w for p in self.items.values() for w in p.storage.witnesses.values()}
        with DisableTorchFunctionSubclass():
            moved = [(p.storage.names.get(i, "a declared tensor"), p) for p in self.items.values()
                     for i, w in p.storage.witnesses.items() if has_storage(w) and storage_key(w) != p.storage.key]
        if moved:
            raise ReplayError(
                f"stateremat.torch.checkpoint: cannot replay segment {segment.name!r}: declared state "
                f"{moved[0][0]!r} now uses another storage (set_ or .data = after the segment's forward), so "
                f"restoring its bytes would not restore what the replay reads (expected the storage the "
                f"forward used; {rule('R8')}). Tip: write new values in place (t.copy_(new)) instead of "
                "rebinding the tensor's storage between forward and backward.")
        for p in self.items.values():  # an unseen change before this replay is a gap for other
            p.storage.observe(journaled=False)  # consumers; the replay's own writes are synced after
        restored: list[tuple[Preserver, Restored]] = []
        with library_ops():
            for p in self.items.values():
                r = p.restore(segment.name)
                if r is not None:
                    restored.append((p, r))
                    log.covered[p.storage.key] = r.runs
        versions = [(w, w._version) for w in witnesses.values()]
        temp = sum(r.visible.numel() for _, r in restored)
        rt_exec.replay.append(log)
        try:
            yield log
        finally:
            rt_exec.replay.pop()
            changing = {p.storage.key for p, _ in restored} | {st.key for st, _, _ in log.writes}
            for key in changing:
                temp += log.copy_aliases(key)
            log.aliases.clear()  # the rest alias bytes that reinstatement leaves unchanged
            temp += sum(d.numel() for _, _, d in log.writes) + log.alias_bytes
            c = self.runtime.counters
            c.peak_temporary = max(c.peak_temporary, temp)
            with library_ops():
                for st, runs, old in reversed(log.writes):  # back to B0 ...
                    scatter(st.flat, runs, old)
                for p, r in restored:  # ... then to the visible bytes
                    p.reinstate(r)
            if versions:
                reset_versions(tuple(w for w, _ in versions), tuple(v for _, v in versions))
            for p in self.items.values():
                p.storage.observe(journaled=True)
