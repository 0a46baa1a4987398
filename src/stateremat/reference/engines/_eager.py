"""Eager retention: keep the full pre-operation state of every op (Table 1, row 1)."""
from __future__ import annotations

import numpy as np

from ._base import RNG_STATE_BYTES, Engine, Recovery, nbytes_of, op_read_from_state


class EagerEngine(Engine):
    """Retains ``B_k`` before every op ``k`` and its recorded noise; backward reads the prestate.

    Retained bytes: ``n_ops * (nbytes + 32)`` plus noise. No replay, no workspace beyond the
    operand values of one segment.

    Checks: its restored bytes and operand values are copies of the live state taken at the
    same moment as the study's truth, so comparing them is structural (it checks the engine
    kept the right op's state and addresses it correctly, nothing more). Real evidence: the
    generator state it kept reproduces the segment's recorded draws and reaches the next
    segment's state; the executor replaying from the restored bytes reaches the next
    segment's bytes; the gradient matches the forward-Jacobian reference.

    References: paper §3.1, Table 1.
    """

    name = "eager"
    structural = ("operand_values", "restored_bytes")

    def __init__(self, program, segments):
        super().__init__(program, segments)
        self.pre, self.rng_pre, self.noise = {}, {}, {}

    def before_op(self, k, buf, rng):
        self.pre[k] = buf.copy()
        self.rng_pre[k] = rng.bit_generator.state

    def after_op(self, k, rec, buf, rng):
        if rec.eps is not None:
            self.noise[k] = rec.eps.copy()

    def end_forward(self, buf, rng):
        self.retained_bytes = (nbytes_of(self.pre.values()) + RNG_STATE_BYTES * len(self.rng_pre)
                               + nbytes_of(self.noise.values()))

    def recover(self, seg, live, rng):
        a, b = self.segments[seg]
        reads = {k: op_read_from_state(self.p, k, self.pre[k], self.noise.get(k)) for k in range(a, b)}
        self._note_workspace(sum(nbytes_of(r.xs) for r in reads.values()))
        return Recovery(reads, self.pre[a], np.ones(self.p.nbytes, bool), self.rng_pre[a],
                        self.workspace_bytes, start_is_copy=True)
