"""Byte-level execution of a finite program, building its version graph and operation trace.

The executor is the only code that touches storage bytes. Each op reads its operands (and
integer indices) as the versions current *before* its write (R1), draws recorded noise from
the explicit generator (R3), writes its destination elements, and appends

* an :class:`OpRecord` (stored operation: byte offsets, before/after bytes, noise, indices,
  generator state before/after), and
* a :class:`Node` of the version graph (operand version ids, coefficients, noise, kind).

A version id (vid) names one written element; ``ver[b]`` is the vid that last wrote byte
``b``. A float64 read is differentiable only if its 8 bytes are exactly one float64 version
(otherwise its operand vid is -1 and differentiation is unsupported, R8).

References: paper §3 (eq. 1, eq. 2), §7 (stored operations).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._ir import DTYPES, Program, View
from ._ops import FORWARD, INT_KINDS, RANDOM_KINDS

F64, DATA = 0, 1  # vid kinds: differentiable float64 value, or non-differentiable bits


@dataclass
class OpRecord:
    """One stored operation (paper §7): what it read and wrote, byte by byte."""

    k: int
    kind: str
    dst_dtype: str
    dst_offsets: np.ndarray          # (m,) int64 byte offsets of written elements
    src_offsets: tuple               # per operand: (m,) int64 byte offsets read
    src_dtypes: tuple
    xs: tuple                        # per operand: (m,) values read (before the write, R1)
    index_offsets: np.ndarray | None  # (n,) byte offsets of the integer indices read
    index_values: np.ndarray | None   # (n,) int64 indices read
    old_bytes: np.ndarray            # (m, itemsize) uint8 before the write
    new_bytes: np.ndarray            # (m, itemsize) uint8 after the write
    eps: np.ndarray | None           # (m,) recorded noise
    rng_before: dict
    rng_after: dict

    def read_byte_offsets(self) -> np.ndarray:
        """Every byte this op read (operands and indices), sorted unique int64."""
        parts = [(o[:, None] + np.arange(DTYPES[d].itemsize)).ravel()
                 for o, d in zip(self.src_offsets, self.src_dtypes)]
        if self.index_offsets is not None:
            parts.append((self.index_offsets[:, None] + np.arange(8)).ravel())
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def write_byte_offsets(self) -> np.ndarray:
        isz = DTYPES[self.dst_dtype].itemsize
        return (self.dst_offsets[:, None] + np.arange(isz)).ravel()


@dataclass
class Node:
    """Version-graph node of one write (element granularity: one vid per written element)."""

    k: int
    kind: str
    coef: tuple
    operands: tuple          # per operand: (m,) int64 vids, -1 where not one float64 version
    out: np.ndarray          # (m,) int64 vids written
    eps: np.ndarray | None
    differentiable: bool     # float64 destination with float kind


@dataclass
class Run:
    """Result of :func:`execute`: final bytes/generator state, trace and version graph."""

    program: Program
    bytes_: np.ndarray
    rng_state: dict
    records: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    ver: np.ndarray | None = None       # (nbytes,) vid that last wrote each byte
    vstart: np.ndarray | None = None    # per vid: byte offset of its element
    vkind: np.ndarray | None = None     # per vid: F64 or DATA
    vval: np.ndarray | None = None      # per vid: float64 value (F64 vids only)
    n_inputs: int = 0                   # vids 0..n_inputs-1 hold B0's float64 elements
    input_offsets: np.ndarray | None = None
    next_vid: int = 0

    def loss_vids(self) -> np.ndarray:
        """Vids ``(n,)`` the scalar output reads from the final storage (-1: not float64)."""
        v = self.program.view(self.program.loss_view)
        return _versions(self, v.element_offsets(np.arange(v.length)), "f8")


def read(buf: np.ndarray, view: View, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values ``(m,)`` and byte offsets ``(m,)`` of elements ``pos`` of ``view`` in ``buf``."""
    off = view.element_offsets(pos)
    isz = view.itemsize
    raw = buf[off[:, None] + np.arange(isz)]
    return raw.view(DTYPES[view.dtype]).reshape(-1), off


def positions(views: dict, op, idx: np.ndarray | None) -> tuple[np.ndarray, list]:
    """Destination positions ``(m,)`` and per-operand positions ``(m,)`` of ``op``.

    ``idx`` are the integer indices read through ``op.index`` (``None`` in map mode).
    """
    dst = views[op.dst]
    if op.mode == "map":
        dpos = np.arange(dst.length)
        return dpos, [dpos] * len(op.srcs)
    if op.mode == "gather":
        return np.arange(dst.length), [np.mod(idx, views[s].length) for s in op.srcs]
    # scatter: the last writer of a repeated position wins (sequential semantics)
    pos = np.mod(idx, dst.length)
    _, first_rev = np.unique(pos[::-1], return_index=True)
    spos = np.sort(len(pos) - 1 - first_rev)
    return pos[spos], [spos] * len(op.srcs)


def _versions(run: Run, off: np.ndarray, dtype: str) -> np.ndarray:
    if dtype != "f8":
        return np.full(len(off), -1, np.int64)
    vid = run.ver[off]
    same = (run.ver[off[:, None] + np.arange(8)] == vid[:, None]).all(axis=1)
    ok = same & (run.vstart[vid] == off) & (run.vkind[vid] == F64)
    return np.where(ok, vid, -1)


def float_input_offsets(p: Program) -> np.ndarray:
    """Byte offsets ``(n_inputs,)`` of ``B0``'s float64 elements, in gradient order."""
    offs = p.region_offsets()
    parts = [offs[r.name] + 8 * np.arange(r.length) for r in p.regions if r.dtype == "f8"]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def _init_versions(run: Run, p: Program, cap: int) -> None:
    n0 = p.nbytes // 8
    run.ver = np.repeat(np.arange(n0, dtype=np.int64), 8)
    run.vstart = np.zeros(n0 + cap, np.int64)
    run.vstart[:n0] = np.arange(n0) * 8
    run.vkind = np.full(n0 + cap, DATA, np.int8)
    run.vval = np.zeros(n0 + cap, np.float64)
    f_cells = float_input_offsets(p) // 8
    # renumber so that the float64 inputs are vids 0..n_inputs-1
    order = np.concatenate([f_cells, np.setdiff1d(np.arange(n0), f_cells)])
    new_id = np.empty(n0, np.int64)
    new_id[order] = np.arange(n0)
    run.ver = new_id[run.ver]
    run.vstart[:n0] = order * 8
    run.n_inputs = len(f_cells)
    run.vkind[: run.n_inputs] = F64
    run.input_offsets = f_cells * 8
    run.vval[: run.n_inputs] = run.bytes_.view("<f8")[f_cells] if len(f_cells) else []
    run.next_vid = n0


def execute(program: Program, buf: np.ndarray | None = None, rng: np.random.Generator | None = None,
            *, ops=None, start: int = 0, noise: dict | None = None, track: bool = True,
            before_op=None, after_op=None, graph: bool = True) -> Run:
    """Run ``program`` (or ``ops[start:]`` of it) on a copy of ``buf`` with generator ``rng``.

    Args:
        program: the program (validated by the caller or here).
        buf: starting bytes uint8 ``(nbytes,)``; default ``B0``. Not modified.
        rng: generator advanced in place by random kinds; default a fresh ``R0``.
        ops: op list to run instead of ``program.ops`` (indices ``start, start+1, ...``).
        start: index of the first op (names records and keys ``noise``).
        noise: ``{op index: (m,) float64}`` recorded noise to reuse instead of drawing (a
            replay that must not advance the generator, Table 1 "whole checkpoint").
        track: build records and the version graph (off for fast byte-only replay).
        graph: with ``track``, also build the version graph (off: stored operations only).
        before_op: ``f(k, bytes, generator)`` called before op ``k`` (preservation engines);
            must not modify either.
        after_op: ``f(k, record, bytes, generator)`` called after op ``k`` (needs ``track``).

    Returns:
        :class:`Run` with the final bytes and generator state.

    References: paper §3, eq. (1) and (2).
    """
    p = program
    ops = p.ops if ops is None else ops
    b = (p.initial_bytes() if buf is None else buf).copy()
    g = p.initial_rng() if rng is None else rng
    run = Run(program=p, bytes_=b, rng_state={})
    if track and graph:
        _init_versions(run, p, sum(p.view(o.dst).length for o in ops))
    views = p._views
    with np.errstate(all="ignore"):  # bit-reinterpreted floats may be inf/nan; bytes stay exact
        for j, op in enumerate(ops):
            if before_op is not None:
                before_op(start + j, run.bytes_, g)
            _step(run, views, op, start + j, g, noise, track, graph)
            if after_op is not None:
                after_op(start + j, run.records[-1], run.bytes_, g)
    run.rng_state = g.bit_generator.state
    return run


def _step(run: Run, views: dict, op, k: int, g, noise, track: bool, graph: bool = True) -> None:
    b, dst = run.bytes_, views[op.dst]
    idx_off = idx = None
    if op.mode != "map":
        idx, idx_off = read(b, views[op.index], np.arange(views[op.index].length))
        idx = idx.astype(np.int64)
    dpos, sposs = positions(views, op, idx)
    xs, soffs = [], []
    for s, sp in zip(op.srcs, sposs):
        x, so = read(b, views[s], sp)
        xs.append(x.copy())  # R1: operands are the versions before this op's write
        soffs.append(so)
    m = len(dpos)
    rng_before = g.bit_generator.state if track else None
    eps = None
    if op.kind in RANDOM_KINDS:
        eps = noise[k] if (noise is not None and k in noise) else g.standard_normal(m)
    dt = DTYPES[dst.dtype]
    if op.kind in INT_KINDS:
        y = FORWARD[op.kind]([x.astype(np.int64) for x in xs], op.coef, eps)
    else:
        y = FORWARD[op.kind]([x.astype(np.float64) for x in xs], op.coef, eps)
    y = np.ascontiguousarray(y, dtype=dt)
    doff = dst.element_offsets(dpos)
    where = doff[:, None] + np.arange(dt.itemsize)
    old = b[where]
    new = y.view(np.uint8).reshape(m, dt.itemsize)
    b[where] = new
    if not track:
        return
    run.records.append(OpRecord(
        k=k, kind=op.kind, dst_dtype=dst.dtype, dst_offsets=doff, src_offsets=tuple(soffs),
        src_dtypes=tuple(views[s].dtype for s in op.srcs), xs=tuple(xs), index_offsets=idx_off,
        index_values=idx, old_bytes=old, new_bytes=new.copy(), eps=eps, rng_before=rng_before,
        rng_after=g.bit_generator.state))
    if not graph:
        return
    operands = tuple(_versions(run, so, views[s].dtype) for so, s in zip(soffs, op.srcs))
    out = np.arange(run.next_vid, run.next_vid + m, dtype=np.int64)
    run.next_vid += m
    diff = dst.dtype == "f8" and op.kind not in INT_KINDS
    run.vstart[out] = doff
    run.vkind[out] = F64 if diff else DATA
    if diff:
        run.vval[out] = y
    run.ver[where] = out[:, None]
    run.nodes.append(Node(k=k, kind=op.kind, coef=tuple(op.coef), operands=operands, out=out,
                          eps=eps, differentiable=diff))
