"""Dynamic program over segments with an exact (r, q, c) Pareto frontier (paper §4).

State after segment ``i``: retained bytes ``R = Σ r``, temporary maximum ``Q = max q`` and cost
``C = Σ c`` of a policy prefix. Three exact reductions keep the frontier small:

* budget pruning: a prefix whose cheapest possible completion already exceeds ``M`` is
  dropped (every later segment adds at least its smallest ``r`` and raises ``Q`` to at least
  its smallest ``q``);
* temporary floor: ``Q`` is stored as ``max(Q, max_{j>i} min_o q_jo)``: every completion's
  temporary maximum is at least that floor, so prefixes differing only below it are
  interchangeable and merge;
* bound pruning (optional, default on in :func:`stateremat.planner.plan`): given the cost
  ``UB`` of a known feasible policy (the minimum-peak policy, improved by a beam: a capped
  DP pass ordered by the same bound), a prefix is dropped when a Lagrangian
  (LP-relaxation) lower bound on its best completion exceeds ``UB``: for any ``λ ≥ 0``, a completion within the remaining budget
  ``B = M - P - R - Q`` costs at least ``Σ_{j>i} min_o (c_jo + λ r_jo) - λ B``.

None of these changes the optimum (ties included: bounds are compared with a relative slack
of 1e-9). Without bound pruning the DP holds the whole budget-feasible Pareto frontier
(exponential on long heterogeneous cards); with it, only the part that can still beat the
incumbent. An optional frontier cap is the only approximation; it is recorded as
``truncated``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..contract import internal_assert
from ._model import CostTables, evaluate, min_peak
from ._pareto import pareto_mask


@dataclass(frozen=True)
class DPOutcome:
    """Raw DP output: codes per segment (``None`` if infeasible) and frontier statistics."""

    codes: np.ndarray | None
    frontier_size: int
    truncated: bool
    upper_bound_s: float | None = None
    aborted: bool = False


def _lagrangian(tables: CostTables, max_lams: int = 512):
    """Suffix tables for the bound: ``lams (m,)``, ``G, W (n+1, m)`` with row ``j`` covering
    segments ``≥ j``: ``G = Σ min_o (c + λ r)``, ``W`` = retained bytes of those minimisers."""
    r = tables.r.astype(np.float64)
    c = np.where(tables.valid, tables.c, np.inf)
    lam = []
    for a in range(3):
        for b in range(3):
            ok = tables.valid[:, a] & tables.valid[:, b] & (r[:, a] > r[:, b]) & (c[:, a] < c[:, b])
            lam.append((c[ok, b] - c[ok, a]) / (r[ok, a] - r[ok, b]))
    lams = np.unique(np.r_[0.0, np.concatenate(lam)])
    if len(lams) > max_lams:  # any λ gives a valid bound; keep quantiles
        lams = lams[np.unique(np.linspace(0, len(lams) - 1, max_lams).round().astype(np.int64))]
    val = c[:, :, None] + r[:, :, None] * lams[None, None, :]  # (n, 3, m)
    arg = np.argmin(val, axis=1)  # (n, m)
    h = np.take_along_axis(val, arg[:, None, :], 1)[:, 0, :]
    w = np.take_along_axis(r[:, :, None].repeat(len(lams), 2), arg[:, None, :], 1)[:, 0, :]
    zero = np.zeros((1, len(lams)))
    G = np.r_[np.cumsum(h[::-1], axis=0)[::-1], zero]
    W = np.r_[np.cumsum(w[::-1], axis=0)[::-1], zero]
    return lams, G, W


def _lower_bound(C, B, lams, g, w):
    """Lagrangian lower bound on the total cost of prefixes ``(C, B)`` (remaining budget B)."""
    t = np.searchsorted(-w, -B, side="left")  # first λ whose minimisers fit in B
    t1 = np.clip(t, 0, len(lams) - 1)
    t0 = np.clip(t - 1, 0, len(lams) - 1)
    Bf = B.astype(np.float64)
    return C + np.maximum(g[t1] - lams[t1] * Bf, g[t0] - lams[t0] * Bf)


def _cap(lb: np.ndarray, mem: np.ndarray, cap: int) -> np.ndarray:
    """Indices (ascending) of ``cap`` points: smallest cost bound, plus the smallest memory."""
    keep = np.argsort(lb, kind="stable")[: cap - 1]
    return np.unique(np.r_[keep, np.argmin(mem)])


def dp_solve(tables: CostTables, budget_bytes: int, frontier_cap: int | None = None,
             bound_pruning: bool = False, upper_bound_s: float | None = None,
             abort_above: int | None = None) -> DPOutcome:
    """Minimise ``Σ c`` s.t. ``P + Σ r + max q ≤ M`` over the valid options of ``tables``.

    Ties: lowest cost, then lowest peak, then the lexicographically smallest option codes
    (eager < whole < region, first segment most significant) — the same rule as
    :func:`stateremat.planner.exhaustive`.

    Args:
        tables: cost tables (one model).
        budget_bytes: ``M``.
        frontier_cap: keep at most this many frontier points per segment (approximate).
        bound_pruning: drop prefixes whose Lagrangian lower bound exceeds an incumbent's cost.
        upper_bound_s: incumbent cost; found automatically when ``None`` and pruning is on.
        abort_above: give up (``aborted``) once the frontier exceeds this many points.

    Returns:
        :class:`DPOutcome`.
    """
    if bound_pruning and upper_bound_s is None:
        return _solve_with_incumbents(tables, budget_bytes, frontier_cap)
    if bound_pruning or frontier_cap is not None:
        lams, G, W = _lagrangian(tables)
    limit = upper_bound_s * (1 + 1e-9) + 1e-12 if bound_pruning else np.inf
    n = tables.n
    avail = int(budget_bytes) - tables.persistent_bytes
    big = np.iinfo(np.int64).max // 4
    rmin = np.where(tables.valid, tables.r, big).min(axis=1)
    qmin = np.where(tables.valid, tables.q, big).min(axis=1)
    rest_r = np.r_[np.cumsum(rmin[::-1])[::-1][1:], 0]  # Σ_{j>i} min r_j
    q_floor = np.r_[np.maximum.accumulate(qmin[::-1])[::-1][1:], 0]  # max_{j>i} min q_j

    R = np.zeros(1, np.int64)
    Q = np.zeros(1, np.int64)
    C = np.zeros(1, np.float64)
    parents: list[np.ndarray] = []
    chosen: list[np.ndarray] = []
    largest, truncated = 1, False
    for i in range(n):
        opts = np.flatnonzero(tables.valid[i])
        k = len(opts)
        # Parent-major layout keeps candidates in lexicographic order of their policies.
        Rn = (R[:, None] + tables.r[i, opts][None, :]).ravel()
        Qn = np.maximum(np.maximum(Q[:, None], tables.q[i, opts][None, :]), q_floor[i]).ravel()
        Cn = (C[:, None] + tables.c[i, opts][None, :]).ravel()
        par = np.repeat(np.arange(len(R)), k)
        code = np.tile(opts, len(R))
        ok = Rn + rest_r[i] + Qn <= avail
        if not ok.any():
            return DPOutcome(None, largest, truncated, upper_bound_s)
        lb = None
        if bound_pruning or frontier_cap is not None:
            lb = _lower_bound(Cn[ok], avail - Rn[ok] - Qn[ok], lams, G[i + 1], W[i + 1])
            if bound_pruning:
                ok[ok] = lb <= limit
                lb = lb[lb <= limit]
                if not ok.any():  # cannot happen when upper_bound_s is a feasible policy's cost
                    return DPOutcome(None, largest, truncated, upper_bound_s)
        Rn, Qn, Cn, par, code = Rn[ok], Qn[ok], Cn[ok], par[ok], code[ok]
        keep = np.flatnonzero(pareto_mask(Rn, Qn, Cn))
        if frontier_cap is not None and len(keep) > frontier_cap:
            # Beam: the points whose Lagrangian bound promises the cheapest completion.
            keep = keep[_cap(lb[keep], Rn[keep] + Qn[keep], frontier_cap)]
            truncated = True
        R, Q, C = Rn[keep], Qn[keep], Cn[keep]
        parents.append(par[keep])
        chosen.append(code[keep].astype(np.int8))
        largest = max(largest, len(R))
        if abort_above is not None and largest > abort_above:
            return DPOutcome(None, largest, truncated, upper_bound_s, aborted=True)
    best = int(np.lexsort((np.arange(len(R)), R + Q, C))[0])
    codes = np.empty(n, np.int64)
    for i in range(n - 1, -1, -1):
        codes[i] = chosen[i][best]
        best = int(parents[i][best])
    return DPOutcome(codes, largest, truncated, upper_bound_s)


#: (beam width, abort-above frontier size) per attempt; the last attempt never aborts.
_SCHEDULE: tuple[tuple[int, int | None], ...] = ((32, 20_000), (512, 20_000), (4096, None))


def _solve_with_incumbents(tables: CostTables, budget_bytes: int,
                           frontier_cap: int | None) -> DPOutcome:
    """Bound-pruned DP with incumbents from beams of growing width.

    The incumbent is the cheaper of the minimum-peak policy and a beam (capped DP ordered by
    the Lagrangian bound). A loose incumbent lets the exact frontier grow; then the exact pass
    is abandoned above 20,000 points and retried with a wider beam, the last time without limit.
    """
    peak, codes = min_peak(tables)
    if peak > budget_bytes:  # no feasible policy exists at all (exact min-peak test)
        return DPOutcome(None, 0, False, None)
    ub = evaluate(tables, codes)[1]
    largest = 0
    for beam, abort in _SCHEDULE:
        quick = dp_solve(tables, budget_bytes, frontier_cap=beam)
        if quick.codes is not None:
            ub = min(ub, evaluate(tables, quick.codes)[1])
        out = dp_solve(tables, budget_bytes, frontier_cap, True, ub, abort_above=abort)
        largest = max(largest, out.frontier_size)
        if not out.aborted:
            return DPOutcome(out.codes, largest, out.truncated, ub)
    internal_assert(False, "the last bound-pruned pass has no abort limit")
