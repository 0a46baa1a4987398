"""Read-set checkpoint: keep the historical values each op read (Table 1, row 3)."""
from __future__ import annotations

from ._base import Engine, Recovery, nbytes_of, op_read_from_values


class ReadSetEngine(Engine):
    """Retains every op's operand values, integer indices and noise; backward reads them.

    Addresses are rebuilt from the declared views and the retained indices ("read indices are
    declared by the finite program"). No state is restored and nothing is replayed; its
    workspace is the byte offsets it rebuilds for one segment (the values are not copied).

    Checks: the operand values and noise it returns are copies of the stored operation the
    study compares them with, so those equalities are structural; there is no restored state
    or generator state to check. Real evidence: the addresses rebuilt from the retained
    indices, the gradient against the forward-Jacobian reference, repeated backward, R5.

    References: paper §3.1, Table 1.
    """

    name = "readset"
    structural = ("noise", "operand_values")

    def __init__(self, program, segments):
        super().__init__(program, segments)
        self.kept = {}

    def after_op(self, k, rec, buf, rng):
        self.kept[k] = (tuple(x.copy() for x in rec.xs),
                        None if rec.index_values is None else rec.index_values.copy(),
                        None if rec.eps is None else rec.eps.copy())

    def end_forward(self, buf, rng):
        self.retained_bytes = sum(nbytes_of(xs) + nbytes_of([i, e]) for xs, i, e in self.kept.values())

    def recover(self, seg, live, rng):
        a, b = self.segments[seg]
        reads = {k: op_read_from_values(self.p, k, *self.kept[k]) for k in range(a, b)}
        # the values are the retained arrays (no copy); the rebuilt addresses are new arrays
        self._note_workspace(sum(nbytes_of(r.src_offsets) + r.dst_offsets.nbytes for r in reads.values()))
        return Recovery(reads, workspace_bytes=self.workspace_bytes)
