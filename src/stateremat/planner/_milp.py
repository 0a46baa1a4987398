"""MILP formulation of eq. (3) solved with ``scipy.optimize.milp`` (HiGHS): an independent check.

Variables: binary ``x[i,o]`` for each valid option, continuous ``Q ≥ 0``.

    minimise   Σ c[i,o] x[i,o]
    subject to Σ_o x[i,o] = 1                      (one option per segment)
               q[i,o] x[i,o] - Q ≤ 0               (Q is the temporary maximum)
               P + Σ r[i,o] x[i,o] + Q ≤ M         (budget)

Memory rows are scaled by ``1/(M - P)`` and costs to a large objective so HiGHS' absolute
tolerances are negligible; the returned policy is re-scored exactly and, if the solver's
feasibility tolerance let it exceed ``M`` by a few bytes, re-solved with a tightened budget.
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


def _solve(tables: CostTables, avail: float, objective: str, time_limit_s: float):
    from scipy.optimize import Bounds, LinearConstraint, milp  # lazy: plan() does not need scipy
    from scipy.sparse import coo_array

    n = tables.n
    seg, opt = np.nonzero(tables.valid)
    nx = len(seg)
    scale = 1.0 / max(avail, 1.0)
    if objective == "time":
        cmax = float(tables.c[seg, opt].max()) or 1.0
        obj = np.r_[tables.c[seg, opt] * (1e4 / (cmax * n)), 0.0]
    else:  # minimum peak: Σ r x + Q
        obj = np.r_[tables.r[seg, opt] * scale, 1.0] * 1e4  # ×1e4: HiGHS' absolute gap
    onehot = coo_array((np.ones(nx), (seg, np.arange(nx))), shape=(n, nx + 1))
    tmp = coo_array((np.r_[tables.q[seg, opt] * scale, -np.ones(nx)],
                     (np.r_[np.arange(nx), np.arange(nx)], np.r_[np.arange(nx), np.full(nx, nx)])),
                    shape=(nx, nx + 1))
    cons = [LinearConstraint(onehot, 1, 1), LinearConstraint(tmp, -np.inf, 0)]
    if objective == "time":
        budget = np.r_[tables.r[seg, opt] * scale, 1.0][None, :]
        cons.append(LinearConstraint(budget, -np.inf, avail * scale))
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
    """Solve eq. (3) as a MILP; exact re-scoring guards against solver tolerances."""
    budget_bytes = clamp_budget(tables, budget_bytes)  # same feasible set, int64-safe
    avail = float(budget_bytes - tables.persistent_bytes)
    if avail < 0:
        return MILPOutcome(None, 2, "persistent bytes alone exceed the budget", True)
    target = avail
    for _ in range(6):
        res, codes = _solve(tables, target, "time", time_limit_s)
        if codes is None:
            return MILPOutcome(None, int(res.status), str(res.message), res.status == 2)
        peak, _ = evaluate(tables, codes)
        if peak <= budget_bytes:
            return MILPOutcome(codes, int(res.status), str(res.message), res.status == 0)
        target -= (peak - budget_bytes) + 1.0  # solver tolerance admitted an over-budget policy
    return MILPOutcome(None, int(res.status), "could not find a policy within the budget after "
                       "tightening for solver tolerance", False)


def milp_min_peak(tables: CostTables, time_limit_s: float = 60.0) -> tuple[int, np.ndarray]:
    """Minimum ``P + Σ r + max q`` by MILP (independent of :func:`min_peak`'s sweep)."""
    scale_ref = float(max(int(tables.r.max()) * tables.n + int(tables.q.max()), 1))
    _, codes = _solve(tables, scale_ref, "peak", time_limit_s)
    internal_assert(codes is not None, "min-peak MILP returned no policy")
    return evaluate(tables, codes)[0], codes
