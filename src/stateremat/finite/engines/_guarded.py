"""Guarded region: per segment, the journal or a whole anchor by a byte-count rule (Table 1, row 5).

Both representations are kept while the forward runs (the journal's final size depends on
later writes); at the end each segment keeps the journal if its payload is at most the
anchor's (``nbytes + 32``), else the anchor. The discarded bytes count as forward workspace.
"""
from __future__ import annotations

import numpy as np

from ._base import RNG_STATE_BYTES, Recovery, nbytes_of, replay_reads
from ._region import RegionEngine


class GuardedEngine(RegionEngine):
    """Region journal guarded by whole anchors; ``choice[seg]`` is ``"journal"`` or ``"anchor"``.

    References: paper §3.1, Table 1 ("a byte-count selection rule, rather than measured
    latency optimization").
    """

    name = "guarded"

    def __init__(self, program, segments):
        super().__init__(program, segments)
        self.anchor, self.choice = {}, {}

    def before_op(self, k, buf, rng):
        super().before_op(k, buf, rng)
        if k in self.starts:
            self.anchor[self.starts[k]] = buf.copy()

    def end_forward(self, buf, rng):
        anchor_bytes = self.p.nbytes + RNG_STATE_BYTES
        kept, dropped = 0, 0
        for s in range(len(self.segments)):
            jb = self.journal_bytes(s) + RNG_STATE_BYTES
            self.choice[s] = "journal" if jb <= anchor_bytes else "anchor"
            kept += min(jb, anchor_bytes)
            dropped += max(jb, anchor_bytes)
            if self.choice[s] == "journal":
                del self.anchor[s]
            else:
                self.journal[s] = []
        self.retained_bytes = kept + nbytes_of(self.noise.values())
        self._note_workspace(dropped)

    def recover(self, seg, live, rng):
        if self.choice[seg] == "journal":
            return super().recover(seg, live, rng)
        a, b = self.segments[seg]
        work = self.anchor[seg].copy()
        reads = replay_reads(self.p, work, a, b, self.noise)
        self._note_workspace(work.nbytes + sum(nbytes_of(r.xs) for r in reads.values()))
        return Recovery(reads, self.anchor[seg], np.ones(self.p.nbytes, bool), self.rng_start[seg],
                        self.workspace_bytes)
