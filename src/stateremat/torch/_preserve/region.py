"""``region``: a journal of the written regions of a declared storage (R6, paper §3.1).

One journal per declared storage, shared by every segment that preserves it by region. Every
in-place write to the storage — inside a segment's forward, in an eager part of the model, in
an optimizer step — appends an entry holding the *old* bytes of the written runs, stamped with
a sequence number. Writes are seen because the declared tensors (and their views) are
*marked* while the journal lives (:mod:`stateremat.torch._mark`): only calls that touch them
reach Python (``whole`` storages are marked too, which is how writes by a foreign recomputation
are refused). A segment that started at sequence ``s0`` reconstructs ``B0`` from the entries
with ``seq >= s0`` (its own writes and later writes that destroy state it needs), replays,
then the visible bytes are reinstated.

Writes the journal never saw (through a path that bypasses the marks) change version counters
and are recorded as a *gap*; a segment that started before a gap is refused (R8).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._compat import library_ops
from .._errors import ReplayError
from .._runtime import DeclaredStorage
from .._storage import ElementWrite, chunk_runs, common_chunk, element_write, first_chunks, first_cover, gather, \
    gather_chunks, host_readable, merge_close, merge_runs, round_runs, scatter, scatter_chunks, write_runs
from stateremat.contract import rule
from ._base import Preserver, Restored


#: Automatic granularity: runs closer than this are merged (a run costs 16 bytes of metadata).
MERGE_GAP_BYTES = 16
#: Overlapping entries are restored chunk by chunk (:meth:`Journal._restore_chunks`) while their
#: runs hold at most this many common-size chunks each on average (one sort of the chunk ids;
#: longer runs of a finer grid take :func:`first_cover`, whose cost is per run).
CHUNKS_PER_RUN = 8


@dataclass
class _Entry:
    seq: int
    runs: np.ndarray  # (n, 2) int64 byte runs, sorted and disjoint
    old: torch.Tensor  # uint8: the old bytes of runs, concatenated
    elements: ElementWrite | None = None  # a device-indexed write: ``old`` holds its elements' old bytes


_NO_RUNS = np.zeros((0, 2), dtype=np.int64)


def _cat(olds: list[torch.Tensor]) -> torch.Tensor:
    """Entries' old bytes concatenated (through NumPy on the host: ~10x less per tensor than ``torch.cat``)."""
    if host_readable(olds[0]):
        return torch.from_numpy(np.concatenate([o.numpy() for o in olds]))
    return torch.cat(olds)


class _Undone(Restored):
    """Restored by undoing the entries newest first (some are :class:`ElementWrite` entries, whose
    bytes are not known on the host); ``redo``: per undone entry, newest first, the values it
    held before its undo, put back oldest first to reinstate."""


class Journal:
    """The write log of one declared storage.

    Args:
        storage: the declared storage.
        granularity_bytes: ``None`` (default): keep exactly the written bytes, merging runs
            closer than :data:`MERGE_GAP_BYTES`; an int: round every write out to multiples of
            it (the first region declaration's setting wins).

    Attributes:
        bytes: old bytes kept (device memory).
        meta_bytes: bytes of the run tables (host memory, 16 per run).
    """

    def __init__(self, storage: DeclaredStorage, granularity_bytes: int | None) -> None:
        self.storage = storage
        self.granularity_bytes = granularity_bytes
        self.entries: list[_Entry] = []
        self.bytes = 0
        self.meta_bytes = 0

    def record(self, runs: np.ndarray) -> int:
        """Keep the old bytes of ``runs`` (exact written runs) before a write; return bytes kept."""
        st = self.storage
        g = self.granularity_bytes
        runs = merge_close(runs, MERGE_GAP_BYTES) if g is None else round_runs(runs, g, st.nbytes)
        if runs.shape[0] == 0:
            return 0
        with library_ops():
            old = gather(st.flat, runs)
        self.entries.append(_Entry(st.rt.next_seq(), runs, old))
        self._grow(old.numel(), runs.nbytes)
        return old.numel()

    def record_elements(self, w: ElementWrite) -> int:
        """Keep the old values of the elements a device-indexed write changes; return bytes kept."""
        st = self.storage
        with library_ops():
            old = w.read(st.flat)
        old = old.reshape(-1).view(torch.uint8)
        self.entries.append(_Entry(st.rt.next_seq(), _NO_RUNS, old, w))
        self._grow(old.numel() + w.bytes, 0)  # (the index copies are device memory too)
        return old.numel() + w.bytes

    def _grow(self, n: int, meta: int) -> None:
        self.bytes += n
        self.meta_bytes += meta
        self.storage.rt.counters.hold(RegionPreserver.name, n)  # a journal is charged to its option

    def restore(self, start_seq: int) -> Restored | None:
        """Put back the bytes the storage had at ``start_seq``; return what was visible.

        Each byte takes its old value from the *first* entry covering it since ``start_seq``
        (its ``B0``), found for all entries at once: a replay copies each written byte once,
        whatever the number of later writes, in a handful of tensor ops. Entries of short runs
        (rows, scattered elements: at most :data:`CHUNKS_PER_RUN` common chunks a run) go chunk
        by chunk (:meth:`_restore_chunks`, one sort of chunk ids); long runs by pieces
        (:func:`first_cover`, whose cost is per run) or, disjoint, straight back.
        """
        entries = [e for e in self.entries if e.seq >= start_seq]
        if not entries:
            return None
        flat = self.storage.flat
        if any(e.elements is not None for e in entries):
            return self._undo(flat, entries)
        if len(entries) == 1:
            e = entries[0]
            with library_ops():
                visible = gather(flat, e.runs)
                scatter(flat, e.runs, e.old)
            return Restored(e.runs, visible)
        runs = np.concatenate([e.runs for e in entries])
        c = common_chunk(runs)
        if int((runs[:, 1] - runs[:, 0]).sum()) // c <= CHUNKS_PER_RUN * runs.shape[0]:
            return self._restore_chunks(flat, entries, runs, c)
        order = np.argsort(runs[:, 0], kind="stable")
        by_start = runs[order]
        if (by_start[1:, 0] >= by_start[:-1, 1]).all():  # disjoint entries (a ring buffer's windows): B0
            with library_ops():  # of each byte is in the one entry that covers it
                visible = gather(flat, by_start)
                scatter(flat, runs, _cat([e.old for e in entries]))
            return Restored(by_start, visible)
        counts = np.array([e.runs.shape[0] for e in entries])
        entry = np.repeat(np.arange(len(entries)), counts)
        lengths = runs[:, 1] - runs[:, 0]
        in_entry = np.cumsum(lengths) - lengths  # offset of each run in the concatenated old bytes
        pieces, owner = first_cover(runs, entry)
        src = in_entry[owner] + (pieces[:, 0] - runs[owner, 0])
        src_runs = np.stack([src, src + (pieces[:, 1] - pieces[:, 0])], axis=1)
        union = merge_runs(pieces[:, 0], pieces[:, 1])
        with library_ops():
            visible = gather(flat, union)
            if sum(e.old.numel() for e in entries) <= 2 * visible.numel():
                scatter(flat, pieces, gather(torch.cat([e.old for e in entries]), src_runs))
            else:  # much overlap: no temporary of every entry's bytes, one copy per owning entry
                base = np.concatenate([[0], np.cumsum([e.old.numel() for e in entries])[:-1]])
                who = entry[owner]
                for k in np.unique(who):
                    sel = who == k
                    scatter(flat, pieces[sel], gather(entries[k].old, src_runs[sel] - base[k]))
        return Restored(union, visible)

    @staticmethod
    def _restore_chunks(flat: torch.Tensor, entries: list[_Entry], runs: np.ndarray, c: int) -> Restored:
        """``entries`` (oldest first; ``runs``: their runs concatenated, every bound a multiple of
        ``c`` bytes) whose runs are short: each ``c``-byte chunk of their union takes the old bytes
        of the first entry covering it (its ``B0``). One sort of the chunk ids and one indexed copy
        per direction: the cost is in the union's chunks, not in entries times runs (a replay of
        the random or strided rows written by 64 segments)."""
        ids, uniq, first = first_chunks(runs, c)
        sizes = np.array([e.old.numel() // c for e in entries], dtype=np.int64)
        with library_ops():
            visible = gather_chunks(flat, uniq, c)
            if uniq.size == ids.size:  # disjoint entries: every entry's bytes go where they came from
                scatter_chunks(flat, ids, c, _cat([e.old for e in entries]))
            elif int(sizes.sum()) <= 2 * uniq.size:  # little overlap: one copy from all entries' bytes
                scatter_chunks(flat, uniq, c, gather_chunks(_cat([e.old for e in entries]), first, c))
            else:  # much overlap: no temporary of every entry's bytes, one copy per owning entry
                order = np.argsort(first, kind="stable")
                first, dest = first[order], uniq[order]
                ends = np.cumsum(sizes)
                cut = np.searchsorted(first, ends)
                for k in np.flatnonzero(np.diff(np.concatenate([[0], cut]))):
                    a, b = (int(cut[k - 1]) if k else 0), int(cut[k])
                    src = first[a:b] - (ends[k] - sizes[k])
                    scatter_chunks(flat, dest[a:b], c, gather_chunks(entries[k].old, src, c))
        return Restored(chunk_runs(uniq, c), visible)

    @staticmethod
    def _undo(flat: torch.Tensor, entries: list[_Entry]) -> "_Undone":
        """Undo ``entries`` newest first, each byte ending at its oldest entry's old value (``B0``),
        with device ops only; the values each undo overwrote are kept to redo them (R5)."""
        redo = []
        with library_ops():
            for e in reversed(entries):
                w = e.elements
                if w is None:
                    redo.append((e, gather(flat, e.runs)))
                    scatter(flat, e.runs, e.old)
                else:
                    now = w.read(flat)
                    redo.append((e, now))
                    w.write(flat, e.old.view(now.dtype).view(now.shape))
        out = _Undone(_NO_RUNS, flat.new_empty(0))  # (nothing the replay writes is known to be covered)
        out.redo = redo
        return out

    @staticmethod
    def redo(flat: torch.Tensor, restored: "_Undone") -> None:
        """Reinstate what :meth:`_undo` undid: each entry's overwritten values, oldest first."""
        with library_ops():
            for e, now in reversed(restored.redo):
                if e.elements is None:
                    scatter(flat, e.runs, now)
                else:
                    e.elements.write(flat, now)

    def prune(self, oldest: int | None) -> None:
        """Drop entries no consumer can need (older than ``oldest``, all when None)."""
        if self.entries and (oldest is None or self.entries[0].seq < oldest):
            self.entries = [] if oldest is None else [e for e in self.entries if e.seq >= oldest]
            self._grow(sum(e.old.numel() + (e.elements.bytes if e.elements is not None else 0)
                           for e in self.entries) - self.bytes,
                       sum(e.runs.nbytes for e in self.entries) - self.meta_bytes)


class RegionPreserver(Preserver):
    """Region journal of one declared storage (paper Table 1, "region journal")."""

    name = "region"
    captures_replay_writes = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.start_seq = 0

    def begin(self) -> None:
        st = self.storage
        if st.journal is None:
            st.journal = Journal(st, self.granularity_bytes)
        st.observe(journaled=False)  # writes before now are B0 for this segment, not a gap
        self.start_seq = st.rt.next_seq()
        st.consumers[self.segment_id] = self.start_seq

    @classmethod
    def before_write(cls, storage: DeclaredStorage, func: Any, args: tuple, kwargs: dict,
                     written: torch.Tensor) -> int:
        j = storage.journal
        if j is None or not storage.consumers:
            return 0
        w = element_write(func, args, written)  # a device-indexed write: its elements, on the device
        if w is not None and j.granularity_bytes is None:
            return j.record_elements(w)
        return j.record(write_runs(func, args, kwargs, written))

    def reinstate(self, restored: Restored) -> None:
        if isinstance(restored, _Undone):
            Journal.redo(self.storage.flat, restored)
        else:
            super().reinstate(restored)

    def restore(self, segment_name: str) -> Restored | None:
        st = self.storage
        st.observe(journaled=False)
        if st.gap_seq >= self.start_seq:
            raise ReplayError(
                f"stateremat.torch.checkpoint: cannot replay segment {segment_name!r}: declared state "
                f"{st.gap_note}, so the journal does not hold the bytes the "
                f"replay needs (expected an unbroken journal; {rule('R8')}). Tip: pass "
                "preserve='whole' for this segment, write the tensor through the declared tensor or views "
                "taken after it was declared, or (a tensor subclass with its own __torch_function__, whose "
                "writes cannot be intercepted per tensor) run that code inside stateremat.torch.journal_writes()."
            )
        return st.journal.restore(self.start_seq)

    def release(self) -> None:
        st = self.storage
        if st.consumers.pop(self.segment_id, None) is None:
            return
        j = st.journal
        if j is None:
            return
        if st.consumers:
            j.prune(min(st.consumers.values()))
        else:
            j.prune(None)
            st.journal = None

    def adopt(self, segment_id: int) -> "RegionPreserver":
        p = RegionPreserver(self.storage, segment_id, self.granularity_bytes, owned=False)
        p.start_seq, p.names = self.start_seq, list(self.names)
        self.storage.consumers[segment_id] = self.start_seq
        return p
