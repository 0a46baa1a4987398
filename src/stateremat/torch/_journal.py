"""Region journal: one ordered write log per declared storage, shared by all segments (R6).

Every in-place write to a journaled storage appends an entry holding the *old* bytes of
the written runs, stamped with a global sequence number. A segment that started at
sequence ``s0`` reconstructs its starting bytes ``B0`` by undoing, newest first, every
entry with ``seq >= s0`` (its own writes and later writes that destroyed state it needs,
§3.1), replays, then reinstates the visible bytes (R5).

Writes that bypass the journal (code outside any checkpointed segment) are noticed through
tensor version counters and recorded as a *gap*; a segment that started before a gap
cannot be reconstructed from the journal and is refused (R8).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from ._storage import StorageKey, flat_bytes, merge_runs, round_runs

_SEQ = itertools.count(1)


class _Total:
    """Bytes of all live journal entries (kept as a running sum: read after every write)."""

    bytes = 0


TOTAL = _Total()


def next_seq() -> int:
    """Return the next global sequence number (orders writes, segment starts and gaps)."""
    return next(_SEQ)


def gather(flat: torch.Tensor, runs: np.ndarray) -> torch.Tensor:
    """Copy the bytes of ``runs`` (shape ``(n, 2)``) out of ``flat`` into one ``uint8`` tensor."""
    if runs.shape[0] == 1:
        return flat[int(runs[0, 0]) : int(runs[0, 1])].clone()
    if runs.shape[0] <= 32:
        return torch.cat([flat[int(a) : int(b)] for a, b in runs])
    ch = _chunks(runs, flat.numel())
    if ch is None:
        return flat.index_select(0, _byte_index(runs, flat.device))
    ids, c, full, tail = ch
    rows = flat[:full].view(-1, c).index_select(0, ids.to(flat.device)).reshape(-1)
    return torch.cat([rows, flat[full:]]) if tail else rows


def scatter(flat: torch.Tensor, runs: np.ndarray, data: torch.Tensor) -> None:
    """Write ``data`` (as produced by :func:`gather`) back into ``flat`` at ``runs``."""
    if runs.shape[0] <= 32:
        off = 0
        for a, b in runs:
            n = int(b - a)
            flat[int(a) : int(b)].copy_(data[off : off + n])
            off += n
        return
    ch = _chunks(runs, flat.numel())
    if ch is None:
        flat.index_copy_(0, _byte_index(runs, flat.device), data)
        return
    ids, c, full, tail = ch
    k = ids.numel() * c
    flat[:full].view(-1, c).index_copy_(0, ids.to(flat.device), data[:k].view(-1, c))
    if tail:
        flat[full:].copy_(data[k:])


#: Smallest common chunk worth a row-wise copy (below it, per-byte indexing is as good).
_MIN_CHUNK = 256


def _chunks(runs: np.ndarray, n: int):
    """Runs whose boundaries share a chunk size ``c`` as row ids of ``flat[:full].view(-1, c)``.

    Region-journal runs are granularity-aligned (:func:`round_runs`), so one row copy replaces
    ``c`` byte-index entries. Returns ``(ids, c, full, tail)`` — ``full = n // c * c`` and
    ``tail``: the last run also covers the partial chunk ``[full, n)`` — or None when the runs
    share no chunk of at least :data:`_MIN_CHUNK` bytes.
    """
    b = runs.reshape(-1)
    inner = b[b != n]
    c = int(np.gcd.reduce(inner)) if inner.size else 0
    if c < _MIN_CHUNK:
        return None
    full = n // c * c
    ids = _run_ids(np.minimum(runs, full), c)
    return torch.from_numpy(ids), c, full, bool(full < n and runs[-1, 1] == n)


def _run_ids(runs: np.ndarray, c: int) -> np.ndarray:
    """Ids of the ``c``-byte chunks covered by ``c``-aligned runs, in run order (int64)."""
    lo = runs[:, 0] // c
    lengths = -(-runs[:, 1] // c) - lo
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(
        lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)


@dataclass
class _Entry:
    seq: int
    runs: np.ndarray  # (n, 2) byte runs
    old: torch.Tensor  # uint8, old bytes of runs, concatenated
    ids: np.ndarray | None = None  # granularity-chunk ids of runs (storages of whole chunks)


class StorageTracker:
    """Write log, version witnesses and live consumers of one declared storage.

    Args:
        key: storage identity.
        tensor: any declared tensor on the storage (kept alive while the tracker lives).
        granularity_bytes: journal chunk size in bytes (first declaration wins).
    """

    def __init__(self, key: StorageKey, tensor: torch.Tensor, granularity_bytes: int) -> None:
        self.key = key
        self.flat = flat_bytes(tensor)
        self.nbytes = self.flat.numel()
        self.granularity_bytes = granularity_bytes
        self.entries: list[_Entry] = []
        self.consumers: dict[int, int] = {}  # segment id -> start seq of its region reconstruction
        self.users = 0  # segments referencing this tracker
        self.witnesses: dict[int, torch.Tensor] = {}
        self.synced: dict[int, int] = {}
        self._names: dict[int, str] = {}
        self.gap_seq = 0
        self.gap_note = ""
        self._bytes = 0  # bytes of self.entries

    # -- version witnesses (R8) -------------------------------------------------------------
    def add_witness(self, t: torch.Tensor, name: str) -> None:
        """Watch ``t``'s version counter; a change the journal did not see is a gap."""
        if id(t) not in self.witnesses:
            self.witnesses[id(t)] = t
            self.synced[id(t)] = t._version
            self._names[id(t)] = name

    def observe(self, journaled: bool) -> None:
        """Compare version counters with the last synced point; record a gap if unjournaled."""
        changed = [i for i, t in self.witnesses.items() if t._version != self.synced[i]]
        if changed and not journaled:
            self.gap_seq = next_seq()
            i = changed[0]
            self.gap_note = (
                f"{self._names[i]!r} (version {self.synced[i]} -> {self.witnesses[i]._version})"
            )
        for i in changed:
            self.synced[i] = self.witnesses[i]._version

    # -- journal ---------------------------------------------------------------------------
    def journal(self, runs: np.ndarray) -> int:
        """Record the old bytes of ``runs`` before a write; return the bytes journaled."""
        runs = round_runs(runs, self.granularity_bytes, self.nbytes)
        if runs.shape[0] == 0:
            return 0
        with torch.no_grad():
            old = gather(self.flat, runs)
        g = self.granularity_bytes
        ids = None if self.nbytes % g else _run_ids(runs, g)
        self.entries.append(_Entry(next_seq(), runs, old, ids))
        self._bytes += old.numel()
        TOTAL.bytes += old.numel()
        return old.numel()

    def entries_since(self, start_seq: int) -> list[_Entry]:
        return [e for e in self.entries if e.seq >= start_seq]

    def restore(self, start_seq: int) -> tuple[np.ndarray, torch.Tensor] | None:
        """Put back the bytes the storage had at ``start_seq``; return ``(runs, visible bytes)``.

        ``runs`` (shape ``(n, 2)``) are the bytes written since ``start_seq`` and the returned
        ``uint8`` tensor holds what they read before the restore (to reinstate later, R5). None:
        nothing was written since. Each chunk takes the old bytes of the *first* entry covering
        it since ``start_seq``, so a replay copies each written chunk once, not once per later
        write (with 64 live segments, per-entry undo copied the same chunks ~30 times over).
        """
        entries = self.entries_since(start_seq)
        if not entries:
            return None
        union = merge_runs(np.concatenate([e.runs[:, 0] for e in entries]),
                           np.concatenate([e.runs[:, 1] for e in entries]))
        with torch.no_grad():
            visible = gather(self.flat, union)
            g = self.granularity_bytes
            if len(entries) == 1 or self.nbytes % g:  # a partial last chunk: undo newest first
                for e in reversed(entries):
                    scatter(self.flat, e.runs, e.old)
                return union, visible
            seen = np.zeros(self.nbytes // g, dtype=bool)
            ids, rows = [], []
            for e in entries:  # oldest first: the first entry covering a chunk holds its B0 bytes
                eids = e.ids
                new = ~seen[eids]
                if not new.any():
                    continue
                seen[eids] = True
                old = e.old.view(-1, g)
                if new.all():
                    ids.append(eids)
                    rows.append(old)
                else:
                    pos = np.flatnonzero(new)
                    ids.append(eids[pos])
                    rows.append(old.index_select(0, torch.from_numpy(pos).to(old.device)))
            self.flat.view(-1, g).index_copy_(
                0, torch.from_numpy(np.concatenate(ids)).to(self.flat.device), torch.cat(rows))
        return union, visible

    def prune(self) -> None:
        """Drop entries no live consumer can need (older than every consumer's start)."""
        oldest = min(self.consumers.values()) if self.consumers else None
        if self.entries and (oldest is None or self.entries[0].seq < oldest):
            self.entries = [] if oldest is None else [e for e in self.entries if e.seq >= oldest]
            kept = sum(e.old.numel() for e in self.entries)
            TOTAL.bytes -= self._bytes - kept
            self._bytes = kept

    def journal_bytes(self) -> int:
        return self._bytes


#: Live trackers by storage; a tracker lives while some segment uses it.
TRACKERS: dict[StorageKey, StorageTracker] = {}


def acquire(key: StorageKey, tensor: torch.Tensor, granularity_bytes: int) -> StorageTracker:
    """Return the tracker of ``key`` (creating it) and count one more user."""
    tr = TRACKERS.get(key)
    if tr is None:
        tr = TRACKERS[key] = StorageTracker(key, tensor, granularity_bytes)
    tr.users += 1
    return tr


def release(tr: StorageTracker, segment_id: int) -> None:
    """Forget ``segment_id`` as a consumer and user; drop the tracker when unused."""
    tr.consumers.pop(segment_id, None)
    tr.prune()
    tr.users -= 1
    if tr.users <= 0 and TRACKERS.get(tr.key) is tr:
        tr.consumers.clear()
        tr.prune()
        del TRACKERS[tr.key]
