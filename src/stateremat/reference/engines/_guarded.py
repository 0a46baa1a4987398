"""Guarded region: per segment, the journal or a whole anchor by a byte-count rule (Table 1, row 5).

Every segment gets a journal. The rule compares payloads: as soon as a segment's journal
(plus its generator state) grows past the anchor payload (``nbytes + 32``), the journal is
dropped and the segment keeps a whole anchor taken at its start. A segment takes that anchor
only if its journal *could* outgrow it: the declared program bounds the journal by every
element written from the segment start on (each write is journaled at most once per
segment), so segments whose bound fits take no anchor. At the end of the forward, segments
whose journal stayed within the anchor payload drop their anchor. What is held during the
forward but not kept (anchors later dropped, journals dropped when they outgrew the anchor)
is forward workspace: its peak over the forward is reported.
"""
from __future__ import annotations

import numpy as np

from ...contract import internal_assert

from ._base import RNG_STATE_BYTES, Recovery, nbytes_of, replay_reads
from ._region import META_BYTES_PER_ELEMENT, RegionEngine


class GuardedEngine(RegionEngine):
    """Region journal guarded by whole anchors; ``choice[seg]`` is ``"journal"`` or ``"anchor"``.

    Checks: a journal segment is checked like the region engine (restored bytes rebuilt by
    undo from the live state). An anchor segment's restored bytes are a copy taken at the
    moment the study's truth was taken, so that equality is structural (rows then name
    ``restored_bytes`` in ``structural_checks``); its operand values come from a replay.

    References: paper §3.1, Table 1 ("a byte-count selection rule, rather than measured
    latency optimization").
    """

    name = "guarded"

    def __init__(self, program, segments):
        super().__init__(program, segments)
        self.anchor, self.choice = {}, {}
        self.anchor_payload = program.nbytes + RNG_STATE_BYTES
        self._peak_held = 0
        # journal bound of a segment starting at op a: every element written by ops a.. (static)
        bound = [self._max_written(k) for k in range(len(program.ops))] + [0]
        for k in reversed(range(len(program.ops))):
            bound[k] += bound[k + 1]
        self.journal_bound = bound

    def _max_written(self, k: int) -> int:
        """Upper bound of journal bytes for op ``k``'s writes (elements x (itemsize + offset))."""
        op, views = self.p.ops[k], self.p._views
        dst = views[op.dst]
        m = min(dst.length, views[op.index].length) if op.mode == "scatter" else dst.length
        return m * (dst.itemsize + META_BYTES_PER_ELEMENT)

    def keeps_journal(self, seg: int) -> bool:
        return self.choice.get(seg) != "anchor"

    def before_op(self, k, buf, rng):
        super().before_op(k, buf, rng)
        if k in self.starts and self.journal_bound[k] + RNG_STATE_BYTES > self.anchor_payload:
            self.anchor[self.starts[k]] = buf.copy()  # the journal might outgrow it

    def after_op(self, k, rec, buf, rng):
        super().after_op(k, rec, buf, rng)
        live = [s for s in range(self.seg_of[k] + 1) if self.keeps_journal(s)]
        # held now, before the rule drops anything: every anchor taken and every live journal
        held = self.anchor_payload * len(self.anchor) + sum(self.journal_nbytes[s] + RNG_STATE_BYTES
                                                            for s in live)
        self._peak_held = max(self._peak_held, held)
        for s in live:  # byte-count rule, applied as soon as the journal outgrows the anchor
            if self.journal_nbytes[s] + RNG_STATE_BYTES > self.anchor_payload:
                internal_assert(s in self.anchor, "guarded: journal outgrew its static bound")
                self.choice[s] = "anchor"
                self.journal[s], self.journal_nbytes[s] = [], 0

    def end_forward(self, buf, rng):
        kept = 0
        for s in range(len(self.segments)):
            if self.keeps_journal(s):
                self.choice[s] = "journal"
                self.anchor.pop(s, None)
                kept += self.journal_nbytes[s] + RNG_STATE_BYTES
            else:
                kept += self.anchor_payload
        self.retained_bytes = kept + nbytes_of(self.noise.values())
        self._note_workspace(self._peak_held - kept)

    def recover(self, seg, live, rng):
        if self.choice[seg] == "journal":
            return super().recover(seg, live, rng)
        a, b = self.segments[seg]
        work = self.anchor[seg].copy()
        reads = replay_reads(self.p, work, a, b, self.noise)
        self._note_workspace(work.nbytes + sum(nbytes_of(r.xs) for r in reads.values()))
        return Recovery(reads, self.anchor[seg], np.ones(self.p.nbytes, bool), self.rng_start[seg],
                        self.workspace_bytes, start_is_copy=True)
