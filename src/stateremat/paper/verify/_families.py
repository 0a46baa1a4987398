"""Workload families as finite programs: feature queue, prototype memory, unrolled recurrence.

Each family step is one segment of four ops over one float64 region ``F`` (all float views
8-byte aligned) and one int64 region ``I`` of indices:

* ``queue``: enqueue a noisy key into random-ish rows of a large queue (sparse scatter),
  advance the pointer (integer mutation), read the queue at integer indices, update features.
* ``prototype``: read prototypes at assigned indices, mix with features, write the updated
  prototypes back (sparse scatter), then noise or a re-assignment of indices.
* ``recurrence``: gather hidden state and inputs, a nonlinearity into a partially overlapping
  shifted view, noise or an index update, and a strided memory write.

With ``alias=True`` (joint-alias study) index reads also go through an int32 strided alias
of the int64 indices and float views overlap partially. :func:`integer_write_variant` adds an
integer bit write into float storage read later as float (an unsupported gradient, R8).

References: paper §7, Table 3.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ._gen import coefficients
from ...reference import Op, Program, Region, View
from ..records.tables import VERIFY_FAMILIES as FAMILIES  # the tables' rules name them too


class _Layout:
    def __init__(self):
        self.cells, self.views = 0, []

    def block(self, name, n):
        v = View(name, "f8", 8 * self.cells, n)
        self.cells += n
        self.views.append(v)
        return v

    def add(self, v):
        self.views.append(v)
        return v


def family_program(family: str, d: int, steps: int, g: np.random.Generator, *,
                   alias: bool = False, rows: int = 8) -> tuple[Program, list]:
    """A ``family`` program of width ``d`` with ``steps`` segments of four ops.

    Args:
        family: ``"queue"``, ``"prototype"`` or ``"recurrence"``.
        d: feature width (elements per step write).
        steps: number of segments.
        g: generator for the structure, coefficients and seeds.
        alias: add int32 strided index aliases and partially overlapping float views.
        rows: queue/prototype rows (state of ``rows * d`` float64 values).

    Returns:
        ``(program, segments)`` with ``segments = [(4 t, 4 t + 4) for t in range(steps)]``.

    Raises:
        ValueError: for an unknown family.
    """
    if family not in FAMILIES:
        raise ValueError(f"stateremat.paper.verify.family_program: family must be one of {FAMILIES}, "
                         f"got {family!r}")
    L = _Layout()
    x = L.block("X", d)
    s = L.block("S", d)
    big = L.block("M", rows * d)
    h2 = L.block("H2", d)  # spare row: overlap target of shifted views
    nf = L.cells
    base_i = 8 * nf
    idx_a = L.add(View("ia", "i8", base_i, d))
    idx_b = L.add(View("ib", "i8", base_i + 8 * d, d))
    # int32 strided alias: the low halves of the int64 indices ``ib`` (little-endian)
    idx_b_read = L.add(View("ib32", "i4", base_i + 8 * d, d, 2)) if alias else idx_b
    shift = d // 2 if alias else 1
    xs = L.add(View("Xs", "f8", x.offset_bytes + 8 * shift, d))       # overlaps X and S
    mstr = L.add(View("Mstr", "f8", big.offset_bytes, d, 2))          # strided memory view
    L.add(View("F_all", "f8", 0, nf))
    c = lambda k: coefficients(k, g)  # noqa: E731
    ops = []
    for t in range(steps):
        tail = Op("noise", x.name, (x.name,), c("noise")) if t % 2 == 0 else \
            Op("iaffine", idx_b.name, (idx_b.name,), (int(g.choice([3, 5, 7])), int(g.integers(1, 99))))
        if family == "queue":
            ops += [Op("noise", big.name, (x.name,), c("noise"), "scatter", idx_a.name),
                    Op("iaffine", idx_a.name, (idx_a.name,), (1, d)),
                    Op("mul", s.name, (big.name, x.name), c("mul"), "gather", idx_b_read.name),
                    Op("add", x.name, (x.name, s.name), c("add"))]
        elif family == "prototype":
            ops += [Op("tanh", s.name, (big.name,), c("tanh"), "gather", idx_b_read.name),
                    Op("mul", s.name, (s.name, x.name), c("mul")),
                    Op("add", big.name, (x.name, s.name), c("add"), "scatter", idx_b_read.name),
                    tail]
        else:
            ops += [Op("add", s.name, (x.name, big.name), c("add"), "gather", idx_a.name),
                    Op(str(g.choice(["tanh", "sin"])), xs.name, (s.name,), c("tanh")),
                    tail,
                    Op("square", mstr.name, (x.name,), c("square"))]
    regions = (Region("F", "f8", nf), Region("I", "i8", 2 * d))
    p = Program(regions, tuple(L.views), tuple(ops), "F_all", init_seed=int(g.integers(2**31)),
                rng_seed=int(g.integers(2**31)), family=family).validate()
    return p, [(4 * t, 4 * t + 4) for t in range(steps)]


def integer_write_variant(p: Program) -> Program:
    """``p`` with an integer bit write into ``X``'s float bytes as its first op (R8 case)."""
    x = p.view("X")
    bits = View("Xbits", "i8", x.offset_bytes, x.length)
    op = Op("iaffine", "Xbits", ("Xbits",), (3, 1))
    return dataclasses.replace(p, views=p.views + (bits,), ops=(op,) + p.ops).validate()
