"""Whole checkpoint: a full-state anchor per segment plus recorded noise (Table 1, row 2)."""
from __future__ import annotations

import numpy as np

from ._base import RNG_STATE_BYTES, Engine, Recovery, nbytes_of, replay_reads


class WholeEngine(Engine):
    """Anchors ``(B_a, R_a)`` at every segment start; backward replays ``[a, b)`` from the anchor.

    Replay runs in a workspace copy of the anchor and reuses the recorded noise of the
    original forward, never drawing anew (R3); the live state is not touched (R5).

    Checks: the restored bytes are the anchor, a copy taken at the same moment as the study's
    truth, so that equality is structural. Real evidence: the operand values come from a
    replay; the executor replaying from the anchor reaches the next segment's bytes; the
    anchored generator state reproduces the recorded draws and the next segment's state.

    References: paper §3.1, Table 1.
    """

    name = "whole"
    structural = ("restored_bytes",)

    def __init__(self, program, segments):
        super().__init__(program, segments)
        self.starts = {a: i for i, (a, _) in enumerate(self.segments)}
        self.anchor, self.anchor_rng, self.noise = {}, {}, {}

    def before_op(self, k, buf, rng):
        if k in self.starts:
            self.anchor[self.starts[k]] = buf.copy()
            self.anchor_rng[self.starts[k]] = rng.bit_generator.state

    def after_op(self, k, rec, buf, rng):
        if rec.eps is not None:
            self.noise[k] = rec.eps.copy()

    def end_forward(self, buf, rng):
        self.retained_bytes = (nbytes_of(self.anchor.values()) + RNG_STATE_BYTES * len(self.anchor)
                               + nbytes_of(self.noise.values()))

    def recover(self, seg, live, rng):
        a, b = self.segments[seg]
        work = self.anchor[seg].copy()  # workspace: one full state
        reads = replay_reads(self.p, work, a, b, self.noise)
        self._note_workspace(work.nbytes + sum(nbytes_of(r.xs) for r in reads.values()))
        return Recovery(reads, self.anchor[seg], np.ones(self.p.nbytes, bool), self.anchor_rng[seg],
                        self.workspace_bytes, start_is_copy=True)
