"""MILP formulation of eq. (3) solved with ``scipy.optimize.milp`` (HiGHS): an independent check.

Variables: binary ``x[i,o]`` for each valid option, continuous ``Q' ≥ 0``. Memory is written
relative to each segment's smallest retained bytes ``rmin_i`` and the temporary floor
``qf = max_i min_o q[i,o]`` (every policy's ``max q`` is at least ``qf``):

    minimise   Σ c[i,o] x[i,o]
    subject to Σ_o x[i,o] = 1                              (one option per segment)
               (q[i,o] - qf) x[i,o] - Q' ≤ 0               (Q' + qf is the temporary maximum)
               Σ (r[i,o] - rmin_i) x[i,o] + Q' ≤ S         (budget)

with the slack ``S = M - P - Σ rmin_i - qf`` computed exactly in integers (``S < 0``: no policy
fits). Memory rows use a power-of-two unit (exact in float) that brings the largest
coefficient near 2^10, so HiGHS' 1e-7 feasibility tolerance stays below a byte for offsets up
to ~2^33 bytes and its presolve sees well-scaled rows; GiB-scale cards whose options differ by
a few bytes are then solved byte-exactly (an earlier form scaled rows by ``1/(M - P)``, which
let the tolerance swallow hundreds of bytes). The returned policy is re-scored exactly and, if a tolerance still
let it exceed ``M``, re-solved with a tightened budget (then no longer claimed optimal: HiGHS
accepts binaries within 1e-6 of 0/1, which on GiB coefficients can hide up to ~1 KiB).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..contract import internal_assert
from ._model import CostTables, clamp_budget, evaluate


@dataclass(frozen=True)
class MILPOutcome:
    """Policy codes (``None`` if infeasible or not solved), solver status and message."""

    codes: np.ndarray | None
    status: int
    message: str
    proven_optimal: bool


def _offsets(tables: CostTables) -> tuple[np.ndarray, int]:
    """``rmin (n,)`` int64 and the temporary floor ``qf`` (bytes) of the offset form."""
    rmin = np.where(tables.valid, tables.r, np.iinfo(np.int64).max).min(axis=1)
    qf = int(np.where(tables.valid, tables.q, np.iinfo(np.int64).max).min(axis=1).max())
    return rmin, qf


def _solve(tables: CostTables, slack: float, objective: str, time_limit_s: float):
    from scipy.optimize import Bounds, LinearConstraint, milp  # lazy: plan() does not need scipy
    from scipy.sparse import coo_array

    n = tables.n
    seg, opt = np.nonzero(tables.valid)
    nx = len(seg)
    rmin, qf = _offsets(tables)
    dr = (tables.r[seg, opt] - rmin[seg]).astype(np.float64)  # exact: sizes ≤ 2^53
    dq = (tables.q[seg, opt] - qf).astype(np.float64)
    # Power-of-two units (exact in float) bring the largest coefficient near 2^10: raw GiB
    # coefficients upset HiGHS' presolve (it returned a clearly suboptimal "optimal" policy),
    # while 2^10 units keep its 1e-7 feasibility tolerance below a byte up to 2^33-byte ranges.
    top = max(float(np.abs(dr).max()), float(np.abs(dq).max()), 1.0)
    unit = 2.0 ** max(int(np.floor(np.log2(top))) - 10, 0)
    dr, dq, slack = dr / unit, dq / unit, slack / unit
    if objective == "time":
        cmax = float(tables.c[seg, opt].max()) or 1.0
        obj = np.r_[tables.c[seg, opt] * (1e4 / (cmax * n)), 0.0]
    else:  # minimum peak: Σ (r - rmin) x + Q'
        obj = np.r_[dr, 1.0]
    onehot = coo_array((np.ones(nx), (seg, np.arange(nx))), shape=(n, nx + 1))
    tmp = coo_array((np.r_[dq, -np.ones(nx)],
                     (np.r_[np.arange(nx), np.arange(nx)], np.r_[np.arange(nx), np.full(nx, nx)])),
                    shape=(nx, nx + 1))
    cons = [LinearConstraint(onehot, 1, 1), LinearConstraint(tmp, -np.inf, 0)]
    if objective == "time":
        cons.append(LinearConstraint(np.r_[dr, 1.0][None, :], -np.inf, slack))
    integrality = np.r_[np.ones(nx), 0]
    bounds = Bounds(np.zeros(nx + 1), np.r_[np.ones(nx), np.inf])
    res = milp(obj, integrality=integrality, bounds=bounds, constraints=cons,
               options={"mip_rel_gap": 0.0, "time_limit": time_limit_s, "presolve": True})
    codes = None
    if res.x is not None:
        x = res.x[:nx] > 0.5
        codes = np.full(n, -1, np.int64)
        codes[seg[x]] = opt[x]
        if (codes < 0).any() or np.bincount(seg[x], minlength=n).max() != 1:
            codes = None
    return res, codes


def milp_solve(tables: CostTables, budget_bytes: int, time_limit_s: float = 60.0) -> MILPOutcome:
    """Solve eq. (3) as a MILP; exact re-scoring guards against solver tolerances.

    Args:
        tables: cost tables of one model.
        budget_bytes: ``M`` in bytes.
        time_limit_s: HiGHS time limit per solve, seconds.

    Returns:
        :class:`MILPOutcome`; ``codes`` is ``None`` when no policy fits (proven) or HiGHS
        found none in time.
    """
    budget_bytes = clamp_budget(tables, budget_bytes)  # same feasible set, int64-safe
    rmin, qf = _offsets(tables)
    slack = budget_bytes - tables.persistent_bytes - int(rmin.sum()) - qf  # exact
    if slack < 0:
        return MILPOutcome(None, 2, "even the smallest retained and temporary bytes exceed the "
                           "budget", True)
    target, tightened = float(slack), 0.0
    for attempt in range(12):
        res, codes = _solve(tables, target, "time", time_limit_s)
        if codes is None:
            return MILPOutcome(None, int(res.status), str(res.message),
                               res.status == 2 and tightened == 0)
        peak, _ = evaluate(tables, codes)
        if peak <= budget_bytes:
            note = "" if tightened == 0 else (
                f"; budget tightened by {tightened:.0f} B for solver tolerance: optimal only "
                "among policies that far under the budget")
            return MILPOutcome(codes, int(res.status), str(res.message) + note,
                               res.status == 0 and tightened == 0)
        # HiGHS accepts x within 1e-6 of 0/1, so a GiB coefficient can hide ~1 KiB: tighten
        # by the excess, doubling each time (the same excess may reappear at a lower target).
        step = ((peak - budget_bytes) + 1.0) * 2.0**attempt
        target -= step
        tightened += step
        if target < 0:
            break
    return MILPOutcome(None, int(res.status), "could not find a policy within the budget after "
                       "tightening for solver tolerance", False)


def milp_min_peak(tables: CostTables, time_limit_s: float = 60.0) -> tuple[int, np.ndarray]:
    """Minimum ``P + Σ r + max q`` by MILP (independent of :func:`min_peak`'s sweep).

    Returns:
        ``(peak_bytes, codes)`` with ``codes`` ``(n,)`` int64 option codes.
    """
    _, codes = _solve(tables, np.inf, "peak", time_limit_s)
    internal_assert(codes is not None, "min-peak MILP returned no policy")
    return evaluate(tables, codes)[0], codes
