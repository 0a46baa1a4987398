"""The replay transaction of one segment: preserve declared state, restore it, reinstate it.

Per declared storage a segment holds one *item*: either a whole snapshot of every byte of
the storage taken when its forward began (``whole``) or a start sequence number into the
shared region journal (``region``). At recomputation :meth:`Transaction.replay` restores
``B0`` (R2), lets the segment re-run, then reinstates the visible bytes and version counters
exactly (R5).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from stateremat.contract import ReplayError, UnsupportedError, rule

from . import _journal
from ._context import LOCAL
from ._journal import StorageTracker, gather, scatter
from ._stats import COUNTERS
from ._storage import StorageKey, storage_key

PRESERVE_OPTIONS = ("whole", "region")


@dataclass(eq=False)
class Item:
    """Preservation of one declared storage within one segment."""

    key: StorageKey
    tracker: StorageTracker
    kind: str  # "whole" | "region"
    names: list[str]
    lo: int = 0
    hi: int = 0
    snapshot: torch.Tensor | None = None
    start_seq: int = 0
    owned: bool = True  # False when adopted from a nested segment (shares its snapshot)


@dataclass(eq=False)
class _ReplayLog:
    """Pre-write bytes of writes made during a replay (undone to reinstate, R5)."""

    keys: dict[StorageKey, Item]  # region items: their replay writes are captured
    items: dict[StorageKey, Item] = field(default_factory=dict)  # every declared storage
    writes: list[tuple[StorageTracker, np.ndarray, torch.Tensor]] = field(default_factory=list)
    # Recomputed saved tensors that alias a region-journaled storage, not yet copied:
    # (key, copy-and-store callback). Copied lazily, before bytes under them change (R1).
    aliases: list[tuple[StorageKey, Callable[[], int]]] = field(default_factory=list)
    alias_bytes: int = 0  # bytes of saved-tensor aliases copied at pack time (whole items)

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


class Transaction:
    """Declared state of one segment and its preservation (whole snapshot or region journal).

    Args:
        segment_id: unique id of the segment (``id`` of its frame).
        declared: ``(name, tensor, group)`` triples; tensors of one group (a module's buffers)
            witness each other's version counters.
        preserve: ``"whole"`` or ``"region"``.
        granularity_bytes: region journal chunk size in bytes.
    """

    def __init__(self, segment_id: int, declared: list[tuple[str, torch.Tensor, int]], preserve: str,
                 granularity_bytes: int) -> None:
        self.segment_id = segment_id
        self.preserve = preserve
        self.granularity_bytes = granularity_bytes
        self.items: dict[StorageKey, Item] = {}
        self.snapshot_bytes = 0
        self.journal_bytes = 0  # bytes journaled by this segment's own forward writes
        self._declared = declared
        self._released = False

    # -- forward -------------------------------------------------------------------------
    def begin(self, journaled: bool) -> None:
        """Preserve ``B0`` of every declared storage (called as the forward begins)."""
        by_key: dict[StorageKey, list[tuple[str, torch.Tensor]]] = {}
        groups: dict[int, list[tuple[str, torch.Tensor]]] = {}
        for name, t, group in self._declared:
            if t.layout != torch.strided or t.device.type == "meta":
                raise UnsupportedError(
                    f"stateremat.torch.checkpoint: declared state {name!r} must be a dense strided "
                    f"tensor with storage, got layout={t.layout}, device={t.device}. Tip: declare "
                    "the dense buffers that hold the state."
                )
            by_key.setdefault(storage_key(t), []).append((name, t))
            groups.setdefault(group, []).append((name, t))
        group_of = {id(t): g for _, t, g in self._declared}
        for key, members in by_key.items():
            tr = _journal.acquire(key, members[0][1], self.granularity_bytes)
            for name, t in members:
                for wname, w in groups[group_of[id(t)]]:
                    tr.add_witness(w, wname)
            tr.observe(journaled=journaled)
            self._add_item(key, tr, [n for n, _ in members], [t for _, t in members], self.preserve)

    def _add_item(self, key: StorageKey, tr: StorageTracker, names: list[str], tensors: list[torch.Tensor],
                  kind: str) -> Item:
        item = Item(key, tr, kind, names)
        if kind == "whole":
            # Every byte of the storage, not only the declared views' extent: an alias outside
            # it (base[4:] of a declared base[:4]) may be read and written too (R2, R8).
            item.lo, item.hi = 0, tr.nbytes
            with torch.no_grad():
                item.snapshot = tr.flat[item.lo : item.hi].clone()
            self.snapshot_bytes += item.hi - item.lo
            COUNTERS.snapshot_bytes += item.hi - item.lo
        else:
            item.start_seq = _journal.next_seq()
            tr.consumers[self.segment_id] = item.start_seq
        self.items[key] = item
        COUNTERS.touch()
        return item

    def promote(self, name: str, t: torch.Tensor) -> None:
        """Declare ``t`` now, before its first write, with a whole snapshot (``on_undeclared="declare"``)."""
        key = storage_key(t)
        tr = _journal.acquire(key, t, self.granularity_bytes)
        tr.add_witness(t, name)
        self._add_item(key, tr, [name], [t], "whole")

    def adopt(self, inner: Transaction) -> None:
        """Take over the items of a nested segment this segment encloses (its B0 is ours too)."""
        for key, it in inner.items.items():
            if key in self.items:
                continue
            it.tracker.users += 1
            mine = Item(key, it.tracker, it.kind, list(it.names), it.lo, it.hi, it.snapshot, it.start_seq, False)
            if it.kind == "region":
                it.tracker.consumers[self.segment_id] = it.start_seq
            self.items[key] = mine

    def needs_journal(self) -> bool:
        """True if writes to our storages must be journaled (ours or an earlier segment's region)."""
        return any(it.kind == "region" or it.tracker.consumers for it in self.items.values())

    def end_forward(self, journaled: bool) -> None:
        for it in self.items.values():
            it.tracker.observe(journaled=journaled)

    def release(self) -> None:
        """Free snapshots and stop consuming journals (the segment can no longer replay)."""
        if self._released:
            return
        self._released = True
        for it in self.items.values():
            if it.owned and it.snapshot is not None:
                COUNTERS.snapshot_bytes -= it.hi - it.lo
            it.snapshot = None
            _journal.release(it.tracker, self.segment_id)
        self.items.clear()

    # -- recomputation -------------------------------------------------------------------
    @contextlib.contextmanager
    def replay(self, segment_name: str) -> Iterator[_ReplayLog]:
        """Restore ``B0`` of every item, yield for the re-run, then reinstate (R2, R5)."""
        if not self.items:
            LOCAL.replay.append(_ReplayLog({}, {}))
            try:
                yield LOCAL.replay[-1]
            finally:
                LOCAL.replay.pop()
            return
        witnesses = {id(w): w for it in self.items.values() for w in it.tracker.witnesses.values()}
        for it in self.items.values():
            it.tracker.observe(journaled=LOCAL.mode_depth > 0)
            if it.kind == "region" and it.tracker.gap_seq >= it.start_seq:
                raise ReplayError(
                    f"stateremat.torch.checkpoint: cannot replay segment {segment_name!r}: declared "
                    f"state {it.tracker.gap_note} was written outside any checkpointed segment after "
                    "the segment's forward, so the region journal does not hold the bytes it needs "
                    f"(expected an unbroken journal, got a version gap; {rule('R8')}). Tip: pass "
                    "preserve='whole' for this segment, or run that write inside a checkpointed "
                    "segment that declares the tensor or inside stateremat.torch.journal_writes()."
                )
        versions = [(w, w._version) for w in witnesses.values()]
        visible: list[tuple[Item, np.ndarray, torch.Tensor]] = []
        with torch.no_grad():
            for it in self.items.values():
                if it.kind == "whole":
                    runs = np.array([[it.lo, it.hi]], dtype=np.int64)
                    visible.append((it, runs, gather(it.tracker.flat, runs)))
                    scatter(it.tracker.flat, runs, it.snapshot)
                else:
                    restored = it.tracker.restore(it.start_seq)
                    if restored is not None:
                        visible.append((it, *restored))
        log = _ReplayLog({k: it for k, it in self.items.items() if it.kind == "region"}, dict(self.items))
        temp = sum(v[2].numel() for v in visible)
        LOCAL.replay.append(log)
        try:
            yield log
        finally:
            LOCAL.replay.pop()
            changing = {it.key for it, _, _ in visible} | {tr.key for tr, _, _ in log.writes}
            for key in changing:
                temp += log.copy_aliases(key)
            log.aliases.clear()  # the rest alias bytes that reinstatement leaves unchanged
            temp += sum(d.numel() for _, _, d in log.writes) + log.alias_bytes
            COUNTERS.peak_temporary = max(COUNTERS.peak_temporary, temp)
            with torch.no_grad():
                for tr, runs, old in reversed(log.writes):  # back to B0 ...
                    scatter(tr.flat, runs, old)
                for it, runs, data in visible:  # ... then to the visible bytes
                    scatter(it.tracker.flat, runs, data)
            torch._C._autograd._unsafe_set_version_counter(
                tuple(w for w, _ in versions), tuple(v for _, v in versions)
            )
