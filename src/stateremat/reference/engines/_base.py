"""The shared interface of the five preservation engines and the backward driver.

An engine watches the forward op by op (:meth:`Engine.before_op`, :meth:`Engine.after_op`),
keeps whatever historical state it chooses, and during backward recovers, per segment, the
operand values each op read (:meth:`Engine.recover`). Recovery runs on the *live* storage,
which holds the final state ``(B_T, R_T)``; it must leave it exactly so (R5).

:func:`backward` is one address-based reverse sweep (adjoints per 8-byte float64 cell) that
uses only what the engine recovered: operand values, operand/destination byte offsets and
noise. It is organised independently of the version graph, so its gradient can be checked
against the forward-Jacobian reference.

References: paper §3.1, Table 1, §7; rules R1–R6.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np

from .._exec import OpRecord, execute, float_input_offsets, positions, read
from .._ir import DTYPES, Program
from .._ops import INT_KINDS, VJP

RNG_STATE_BYTES = 32  # PCG64: 128-bit state + 128-bit increment


@dataclass
class OpRead:
    """What backward needs of one op: operand values and addresses, written addresses, noise."""

    k: int
    xs: tuple            # per operand (m,) values read before the op's write
    src_offsets: tuple   # per operand (m,) int64 byte offsets
    dst_offsets: np.ndarray
    eps: np.ndarray | None


@dataclass
class Recovery:
    """Result of recovering one segment ``[a, b)``.

    ``start_bytes``/``start_mask``: the segment-start state ``B_a`` the engine rebuilt and the
    bytes it vouches for (``None`` when the engine keeps reads only); ``rng_state`` is ``R_a``.
    ``start_is_copy``: ``start_bytes`` is a copy the engine took at the segment start, i.e. at
    the moment the checks' own truth was taken, so comparing the two is structural only.
    """

    reads: dict                       # k -> OpRead for every op of the segment
    start_bytes: np.ndarray | None = None
    start_mask: np.ndarray | None = None
    rng_state: dict | None = None
    workspace_bytes: int = 0
    start_is_copy: bool = False


def op_read_from_record(r: OpRecord) -> OpRead:
    return OpRead(r.k, r.xs, r.src_offsets, r.dst_offsets, r.eps)


def op_read_from_values(p: Program, k: int, xs: tuple, idx: np.ndarray | None, eps) -> OpRead:
    """Rebuild the addresses of op ``k`` from its retained index values (read-set engine)."""
    views, op = p._views, p.ops[k]
    dpos, sposs = positions(views, op, idx)
    return OpRead(k, xs, tuple(views[s].element_offsets(sp) for s, sp in zip(op.srcs, sposs)),
                  views[op.dst].element_offsets(dpos), eps)


def op_read_from_state(p: Program, k: int, state: np.ndarray, eps) -> OpRead:
    """Read op ``k``'s operands from a saved pre-op ``state`` (eager retention); no copy."""
    views, op = p._views, p.ops[k]
    idx = None
    if op.index is not None:
        idx = read(state, views[op.index], np.arange(views[op.index].length))[0].astype(np.int64)
    dpos, sposs = positions(views, op, idx)
    xs = tuple(read(state, views[s], sp)[0] for s, sp in zip(op.srcs, sposs))
    return OpRead(k, xs, tuple(views[s].element_offsets(sp) for s, sp in zip(op.srcs, sposs)),
                  views[op.dst].element_offsets(dpos), eps)


def replay_reads(p: Program, buf: np.ndarray, a: int, b: int, noise: dict) -> dict:
    """Replay ops ``[a, b)`` on ``buf`` *in place* with recorded noise; their :class:`OpRead` s.

    The generator is never drawn (recorded noise is reused, Table 1 "whole checkpoint").
    """
    frozen = np.random.Generator(np.random.PCG64(0))
    before = frozen.bit_generator.state
    run = execute(p, buf, frozen, ops=p.ops[a:b], start=a, noise=noise, graph=False)
    if frozen.bit_generator.state != before:  # pragma: no cover - executor invariant
        raise AssertionError("stateremat internal error: replay drew new noise. This is a bug "
                             "in stateremat, please report it.")
    buf[:] = run.bytes_
    return {r.k: op_read_from_record(r) for r in run.records}


def nbytes_of(arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays if a is not None))


class Engine(abc.ABC):
    """One preservation engine (Table 1). Subclasses set ``name`` and implement the hooks.

    Args:
        program: the program whose forward is watched.
        segments: ``[(a, b), ...]`` contiguous half-open op ranges covering all ops in order.

    Attributes:
        retained_bytes: bytes kept from forward to backward (after the forward ends).
        workspace_bytes: peak temporary bytes used by forward bookkeeping or one recovery.
    """

    name = "engine"
    #: checks that are structural for this engine (equal by construction, not evidence)
    structural: tuple = ()

    def __init__(self, program: Program, segments: list[tuple[int, int]]):
        self.p = program
        self.segments = list(segments)
        self.seg_of = {k: i for i, (a, b) in enumerate(self.segments) for k in range(a, b)}
        self.retained_bytes = 0
        self.workspace_bytes = 0

    def before_op(self, k: int, buf: np.ndarray, rng: np.random.Generator) -> None:
        """Called with the live state before op ``k`` (read only)."""

    def after_op(self, k: int, rec: OpRecord, buf: np.ndarray, rng: np.random.Generator) -> None:
        """Called after op ``k`` with its stored operation."""

    def end_forward(self, buf: np.ndarray, rng: np.random.Generator) -> None:
        """Called once after the last op; sets :attr:`retained_bytes`."""

    @abc.abstractmethod
    def recover(self, seg: int, live: np.ndarray, rng: np.random.Generator) -> Recovery:
        """Reads of every op of segment ``seg``.

        ``live``/``rng`` hold the final state ``(B_T, R_T)`` and must again on return (R5);
        recovery reuses recorded noise and never draws from ``rng`` (R3).
        """

    def _note_workspace(self, n: int) -> None:
        self.workspace_bytes = max(self.workspace_bytes, int(n))


@dataclass
class Forward:
    """The watched forward: final state and the reference run (records, version graph)."""

    run: object
    b_t: np.ndarray
    r_t: dict
    seg_start_bytes: list = field(default_factory=list)
    seg_start_rng: list = field(default_factory=list)


def forward(p: Program, engine: Engine) -> Forward:
    """Run ``p`` once from ``(B0, R0)`` under ``engine``; keeps segment-start truth for checks."""
    starts = {a: i for i, (a, _) in enumerate(engine.segments)}
    sb, sr = [None] * len(starts), [None] * len(starts)

    def before(k, buf, rng):
        if k in starts:  # ground truth for the checks, not visible to the engine
            sb[starts[k]], sr[starts[k]] = buf.copy(), rng.bit_generator.state
        engine.before_op(k, buf, rng)

    g = p.initial_rng()
    run = execute(p, rng=g, before_op=before, after_op=engine.after_op, graph=False)
    run.input_offsets = float_input_offsets(p)
    engine.end_forward(run.bytes_, g)
    return Forward(run, run.bytes_.copy(), run.rng_state, sb, sr)


def backward(p: Program, engine: Engine, live: np.ndarray, rng: np.random.Generator,
             input_offsets: np.ndarray, on_recovery=None) -> np.ndarray:
    """Address-based reverse sweep over segments in reverse using only recovered reads.

    Args:
        p: program (only static op kinds and coefficients are taken from it).
        engine: engine after its forward.
        live: live storage bytes (``B_T``); recovery must leave them unchanged.
        rng: live generator (``R_T``); recovery must not advance it.
        input_offsets: byte offsets ``(n,)`` of the float64 inputs (gradient order).
        on_recovery: optional ``f(seg, Recovery)`` (checks).

    Returns:
        gradient ``(n,)`` float64 of the scalar output with respect to ``B0``'s float64 cells.

    Danger:
        Assumes 8-byte aligned float64 operands (checked by the admission test of the study).
    """
    adj = np.zeros(p.nbytes // 8)
    lv = p.view(p.loss_view)
    np.add.at(adj, lv.element_offsets(np.arange(lv.length)) // 8, p.loss_weights())
    for seg in reversed(range(len(engine.segments))):
        rec = engine.recover(seg, live, rng)
        if on_recovery is not None:
            on_recovery(seg, rec)
        a, b = engine.segments[seg]
        for k in reversed(range(a, b)):
            op, r = p.ops[k], rec.reads[k]
            dst = p.view(op.dst)
            if dst.dtype != "f8" or op.kind in INT_KINDS:
                isz = DTYPES[dst.dtype].itemsize
                adj[np.unique((r.dst_offsets[:, None] + np.arange(isz)).ravel() // 8)] = 0.0
                continue
            cells = r.dst_offsets // 8
            g = adj[cells].copy()
            adj[cells] = 0.0  # the overwritten version's adjoint ends here (R1)
            xs = [np.asarray(x, np.float64) for x in r.xs]
            for so, xb, s in zip(r.src_offsets, VJP[op.kind](xs, op.coef, r.eps, g), op.srcs):
                if p.view(s).dtype == "f8":
                    np.add.at(adj, so // 8, xb)
    return adj[input_offsets // 8]


__all__ = ["Engine", "Recovery", "OpRead", "forward", "backward", "replay_reads", "read",
           "op_read_from_record", "op_read_from_values", "op_read_from_state", "nbytes_of", "RNG_STATE_BYTES"]
