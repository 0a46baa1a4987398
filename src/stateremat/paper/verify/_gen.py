"""Seeded generators of the derivative and byte suites (paper §6).

Both suites use dimensions 4/8/16 and 8/12/16 operations with overlapping and strided views,
gather/scatter through integer index reads, integer index updates and recorded noise.

* :func:`derivative_program` keeps float64 views 8-byte aligned (every float read is one
  float64 version) and always ends with an in-place nonlinear write, so every program holds a
  version hazard: a location read by a nonlinearity is overwritten afterwards (R1).
* :func:`byte_program` adds the aliases the byte suite is about: float32 and int32/int64 views
  onto float64 bytes, misaligned float64 views and integer bit writes into float storage.

Program ``i`` of a suite with base ``seed`` is drawn from ``default_rng([seed, suite, i])``.
"""
from __future__ import annotations

import numpy as np

from ...reference import RANDOM_KINDS, Op, Program, Region, View

DIMS = (4, 8, 16)
N_OPS = (8, 12, 16)
SUITE_CODES = {"derivative": 1, "byte": 2}
NONLIN = ("tanh", "sin", "square")


def coefficients(kind: str, g: np.random.Generator) -> tuple:
    """Coefficients for ``kind`` from ranges that keep values O(1) over 16 ops."""
    u = lambda lo, hi: float(g.uniform(lo, hi))  # noqa: E731
    return {
        "copy": (),
        "affine": (u(-0.8, 0.8), u(-0.4, 0.4)),
        "tanh": (u(-1.5, 1.5), u(-0.5, 0.5), u(0.5, 1.5)),
        "sin": (u(-1.5, 1.5), u(-0.5, 0.5), u(0.5, 1.5)),
        "square": (u(-1.0, 1.0), u(-0.5, 0.5), u(0.1, 0.25)),
        "noise": (u(0.05, 0.2),),
        "mul": (u(0.3, 0.5),),
        "add": (u(-0.5, 0.5), u(-0.5, 0.5)),
        "iaffine": (int(g.choice([1, 3, 5, 7])), int(g.integers(0, 100))),
    }[kind]


def _float_views(d: int, n_cells: int, g, prefix: str, count: int, base: int = 0) -> list[View]:
    out = []
    for j in range(count):
        stride = int(g.choice([1, 1, 2]))
        span = (d - 1) * stride + 1
        cell = int(g.integers(0, n_cells - span + 1))
        out.append(View(f"{prefix}{j}", "f8", base + 8 * cell, d, stride))
    return out


def _pick_op(g, kinds, fviews, ivews_map, index_views, dst_views=None, all_fviews=None) -> Op:
    kind = str(g.choice(kinds))
    dst_views = dst_views or fviews
    if kind == "iaffine":
        dst = ivews_map[int(g.integers(len(ivews_map)))]
        src = ivews_map[int(g.integers(len(ivews_map)))]
        return Op(kind, dst.name, (src.name,), coefficients(kind, g))
    arity = 2 if kind in ("mul", "add") else 1
    mode = str(g.choice(["map", "map", "map", "gather", "scatter"]))
    coef = coefficients(kind, g)
    pool = all_fviews or fviews
    if mode == "map":
        dst = dst_views[int(g.integers(len(dst_views)))]
        srcs = tuple(fviews[int(g.integers(len(fviews)))].name for _ in range(arity))
        return Op(kind, dst.name, srcs, coef)
    idx = index_views[int(g.integers(len(index_views)))]
    if mode == "gather":
        dst = dst_views[int(g.integers(len(dst_views)))]
        srcs = tuple(pool[int(g.integers(len(pool)))].name for _ in range(arity))
        return Op(kind, dst.name, srcs, coef, "gather", idx.name)
    dst = pool[int(g.integers(len(pool)))]
    srcs = tuple(fviews[int(g.integers(len(fviews)))].name for _ in range(arity))
    return Op(kind, dst.name, srcs, coef, "scatter", idx.name)


def derivative_program(seed: int, i: int) -> Program:
    """Program ``i`` of the derivative suite (aligned float64 views; ends with a hazard)."""
    g = np.random.default_rng([seed, SUITE_CODES["derivative"], i])
    d, t = int(g.choice(DIMS)), int(g.choice(N_OPS))
    nf = 3 * d
    regions = (Region("F", "f8", nf), Region("I", "i8", d))
    fviews = _float_views(d, nf, g, "f", 5)
    whole = View("F_all", "f8", 0, nf, 1)
    idx = View("idx", "i8", nf * 8, d, 1)
    kinds = ["affine", "tanh", "sin", "square", "mul", "add", "noise", "copy", "iaffine"]
    ops = [_pick_op(g, kinds, fviews, [idx], [idx], all_fviews=fviews + [whole])
           for _ in range(t - 2)]
    v = fviews[int(g.integers(len(fviews)))]
    ops.insert(int(g.integers(0, len(ops) + 1)), Op("noise", v.name, (v.name,), coefficients("noise", g)))
    kind = str(g.choice(NONLIN))
    v = fviews[int(g.integers(len(fviews)))]
    ops.append(Op(kind, v.name, (v.name,), coefficients(kind, g)))  # in place: x <- f(x)
    return Program(regions, tuple(fviews + [whole, idx]), tuple(ops), "F_all",
                   init_seed=int(g.integers(2**31)), rng_seed=int(g.integers(2**31)),
                   family="derivative").validate()


def byte_program(seed: int, i: int) -> Program:
    """Program ``i`` of the byte suite (typed aliases, misalignment, integer bit writes)."""
    g = np.random.default_rng([seed, SUITE_CODES["byte"], i])
    d, t = int(g.choice(DIMS)), int(g.choice(N_OPS))
    nf = 3 * d
    regions = (Region("F", "f8", nf), Region("I", "i8", d))
    f8 = _float_views(d, nf, g, "f", 3)
    f8.append(View("fmis", "f8", 4 + 8 * int(g.integers(0, nf - d)), d, 1))  # misaligned alias
    f4 = [View(f"h{j}", "f4", 4 * int(g.integers(0, 2 * nf - 2 * d)), d, int(g.choice([1, 2])))
          for j in range(2)]
    ints = [View("idx", "i8", nf * 8, d, 1),
            View("idx32", "i4", nf * 8 + 4 * int(g.integers(0, d)), d, 1),   # int alias of idx
            View("fbits", "i8", 8 * int(g.integers(0, nf - d + 1)), d, 1),   # int view of floats
            View("fbits32", "i4", 4 * int(g.integers(0, 2 * nf - d + 1)), d, 1)]
    whole = View("F_all", "f8", 0, nf, 1)
    fviews = f8 + f4
    kinds = ["affine", "tanh", "sin", "square", "mul", "add", "noise", "copy", "iaffine", "iaffine"]
    ops = [_pick_op(g, kinds, fviews, ints, ints[:2], all_fviews=fviews + [whole]) for _ in range(t - 1)]
    v = fviews[int(g.integers(len(fviews)))]
    ops.insert(int(g.integers(0, len(ops) + 1)), Op("noise", v.name, (v.name,), coefficients("noise", g)))
    return Program(regions, tuple(fviews + [whole] + ints), tuple(ops), "F_all",
                   init_seed=int(g.integers(2**31)), rng_seed=int(g.integers(2**31)),
                   family="byte").validate()


def byte_segment(seed: int, i: int, p: Program) -> tuple[int, int]:
    """Replayed segment ``[s, e)`` of byte-suite program ``i`` (``0 <= s < e <= len(p.ops)``).

    The segment always contains at least one random op (every byte program has one), so the
    wrong-RNG control is caught by what the replay draws, not only by its start state.
    """
    g = np.random.default_rng([seed, SUITE_CODES["byte"], i, 99])
    draws = [k for k, op in enumerate(p.ops) if op.kind in RANDOM_KINDS]
    if not draws:
        raise ValueError(f"stateremat.paper.verify.byte_segment: program {i} has no random op; expected "
                         "at least one (byte_program inserts one). Tip: pass a byte_program.")
    j = draws[int(g.integers(len(draws)))]
    s = int(g.integers(0, j + 1))
    return s, int(g.integers(j + 1, len(p.ops) + 1))
