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

from ._storage import StorageKey, flat_bytes, round_runs

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
    return flat.index_select(0, _byte_index(runs, flat.device))


def scatter(flat: torch.Tensor, runs: np.ndarray, data: torch.Tensor) -> None:
    """Write ``data`` (as produced by :func:`gather`) back into ``flat`` at ``runs``."""
    if runs.shape[0] <= 32:
        off = 0
        for a, b in runs:
            n = int(b - a)
            flat[int(a) : int(b)].copy_(data[off : off + n])
            off += n
    else:
        flat.index_copy_(0, _byte_index(runs, flat.device), data)


def _byte_index(runs: np.ndarray, device: torch.device) -> torch.Tensor:
    lengths = runs[:, 1] - runs[:, 0]
    offsets = np.repeat(runs[:, 0] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return torch.from_numpy(np.arange(int(lengths.sum()), dtype=np.int64) + offsets).to(device)


@dataclass
class _Entry:
    seq: int
    runs: np.ndarray  # (n, 2) byte runs
    old: torch.Tensor  # uint8, old bytes of runs, concatenated


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
        self.entries.append(_Entry(next_seq(), runs, old))
        self._bytes += old.numel()
        TOTAL.bytes += old.numel()
        return old.numel()

    def entries_since(self, start_seq: int) -> list[_Entry]:
        return [e for e in self.entries if e.seq >= start_seq]

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
