"""Region journal: old and new values of overwritten destinations, in write order (Table 1, row 4).

R6: the journal of segment ``s`` covers the union of its own writes and the *later* writes
that destroy state it needs (bytes it reads or writes). Every own write keeps its old values;
a later write is journaled once per destroyed element (its old value, i.e. the value ``s``
left there). Recovery of ``s`` from the live final state saves the final ("new") values of
the bytes it will touch (temporary workspace), undoes the journal in reverse write order,
replays ``s`` in place with recorded noise, and redoes the final values (R5).

Deviation from Table 1, on purpose: new values are not retained from forward to backward;
the redo takes them from the live final state at recovery time, which holds exactly those
bytes, so the journal retains half the payload. ``cover_later_writes=False`` is the insufficient journal (only
the segment's own overwritten values) that tests must catch.
"""
from __future__ import annotations

import numpy as np

from ._base import RNG_STATE_BYTES, Engine, Recovery, nbytes_of, replay_reads

META_BYTES_PER_ELEMENT = 8  # one int64 byte offset per journaled element


def _where(offs, isz):
    return offs[:, None] + np.arange(isz)


class RegionEngine(Engine):
    """Per-segment journals of ``(op, element offsets, itemsize, old bytes, None)`` in write order.

    Args:
        program, segments: see :class:`Engine`.
        cover_later_writes: journal later writes that destroy bytes a segment needs (R6).
            ``False`` only for the negative control.

    References: paper §3.1, Table 1; rule R6.
    """

    name = "region"

    def __init__(self, program, segments, cover_later_writes: bool = True):
        super().__init__(program, segments)
        self.cover_later_writes = cover_later_writes
        self.journal = [[] for _ in self.segments]
        self.cover = [np.zeros(program.nbytes, bool) for _ in self.segments]
        self.destroyed = [np.zeros(program.nbytes, bool) for _ in self.segments]
        self.journal_nbytes = [0] * len(self.segments)  # running journal_bytes(s)
        self.starts = {a: i for i, (a, _) in enumerate(self.segments)}
        self.rng_start, self.noise = {}, {}

    def before_op(self, k, buf, rng):
        if k in self.starts:
            self.rng_start[self.starts[k]] = rng.bit_generator.state

    def after_op(self, k, rec, buf, rng):
        seg, isz = self.seg_of[k], rec.old_bytes.shape[1]
        where = _where(rec.dst_offsets, isz)
        if rec.eps is not None:
            self.noise[k] = rec.eps.copy()
        if self.cover_later_writes:  # R6: later writes destroying what earlier segments need
            for s in range(seg):
                if not self.keeps_journal(s):
                    continue
                sel = (self.cover[s][where] & ~self.destroyed[s][where]).any(axis=1)
                if sel.any():  # first destruction of these elements: keep the old value only
                    self._append(s, (k, rec.dst_offsets[sel], isz, rec.old_bytes[sel].copy(), None))
                    self.destroyed[s][where[sel].ravel()] = True
        if self.keeps_journal(seg):
            self._append(seg, (k, rec.dst_offsets.copy(), isz, rec.old_bytes.copy(), None))
            self.cover[seg][where.ravel()] = True
            self.cover[seg][rec.read_byte_offsets()] = True

    def keeps_journal(self, seg: int) -> bool:
        """Whether ``seg`` is still journaled (always here; the guarded engine stops some)."""
        return True

    def _append(self, seg: int, entry: tuple) -> None:
        _, offs, _, old, new = entry
        self.journal[seg].append(entry)
        self.journal_nbytes[seg] += nbytes_of([old, new]) + META_BYTES_PER_ELEMENT * len(offs)

    def journal_bytes(self, seg: int) -> int:
        """Journal payload of ``seg``: old values and one offset per element."""
        return sum(nbytes_of([o, n]) + META_BYTES_PER_ELEMENT * len(offs)
                   for _, offs, _, o, n in self.journal[seg])

    def end_forward(self, buf, rng):
        self.retained_bytes = (sum(self.journal_bytes(s) for s in range(len(self.segments)))
                               + RNG_STATE_BYTES * len(self.segments) + nbytes_of(self.noise.values()))

    def recover(self, seg, live, rng):
        a, b = self.segments[seg]
        entries = self.journal[seg]
        touched = [_where(offs, isz).ravel() for _, offs, isz, _, _ in entries]
        touched = np.unique(np.concatenate(touched)) if touched else np.zeros(0, np.int64)
        final = live[touched].copy()  # workspace: the final ("new") values to redo
        for _, offs, isz, old, _ in reversed(entries):  # undo in reverse write order
            live[_where(offs, isz)] = old
        start = live.copy()  # for the restored-bytes check only (not workspace)
        reads = replay_reads(self.p, live, a, b, self.noise)  # in place, recorded noise
        live[touched] = final  # redo: reinstate the final state (R5)
        self._note_workspace(final.nbytes + 8 * len(touched) + sum(nbytes_of(r.xs) for r in reads.values()))
        return Recovery(reads, start, self.cover[seg].copy(), self.rng_start.get(seg), self.workspace_bytes)
