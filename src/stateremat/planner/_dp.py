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
  (LP-relaxation) lower bound on its best completion exceeds ``UB``: for any ``λ ≥ 0``, a
  completion within the remaining budget ``B = M - P - R - Q`` costs at least
  ``Σ_{j>i} min_o (c_jo + λ (r_jo - rmin_j)) - λ S`` with the slack
  ``S = B - Σ_{j>i} rmin_j ≥ 0`` computed exactly in integers.

Offsetting by ``rmin`` keeps every float term of the bound small: the plain form
``Σ min(c + λ r) - λ B`` subtracts two huge numbers on GiB-scale cards and its rounding
exceeded the cost differences, pruning the optimum. The remaining float error is bounded by
``4 (n + 4) eps (|C| + |G| + λ S + UB)`` and added as a margin (on top of a 1e-9 relative
slack), so no optimum and no tie is pruned. None of these reductions changes the optimum.
Without bound pruning the DP holds the whole budget-feasible Pareto frontier (exponential on
long heterogeneous cards); with it, only the part that can still beat the incumbent. An
optional frontier cap is the only approximation; it is recorded as ``truncated``, and when it
drops every completion while the exact minimum-peak policy fits, that policy is returned.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..contract import internal_assert
from ._model import _ABSENT, CostTables, clamp_budget, evaluate, min_peak
from ._pareto import pareto_mask


#: An exact pass whose frontier grows past this many points warns (:class:`FrontierWarning`).
FRONTIER_WARN_POINTS = 10_000

#: ``on_segment(stage, done, total, frontier_size)``: called after each segment of each pass.
OnSegment = Callable[[str, int, int, int], None]


class FrontierWarning(UserWarning):
    """The exact DP's frontier grew so large that planning may take minutes or hours."""


@dataclass(frozen=True)
class DPOutcome:
    """Raw DP output: codes per segment (``None`` if infeasible) and frontier statistics.

    ``frontier_size`` is the largest stored frontier; ``candidates_max`` the largest number of
    budget-feasible candidate prefixes examined at one segment (before bound pruning and the
    Pareto filter).
    """

    codes: np.ndarray | None
    frontier_size: int
    truncated: bool
    upper_bound_s: float | None = None
    aborted: bool = False
    candidates_max: int = 0


def _lagrangian(tables: CostTables, max_lams: int = 512):
    """Suffix tables for the bound, on retained bytes *offset* by each segment's smallest ``r``.

    Returns ``lams (m,)`` (s/byte) and ``G, W`` ``(n+1, m)`` with row ``j`` covering segments
    ``≥ j``: ``G = Σ min_o (c + λ (r - rmin))`` seconds (every term ≥ 0), ``W`` = offset
    retained bytes of those minimisers. Offsetting
    keeps every float term small: without it, ``λ Σ r`` and ``λ B`` are two huge numbers whose
    difference loses more than the cost differences being compared (GiB-scale cards).
    """
    rmin = np.where(tables.valid, tables.r, _ABSENT).min(axis=1)
    r = (tables.r - rmin[:, None]).astype(np.float64)  # exact below 2^53 (card size cap)
    c = np.where(tables.valid, tables.c, np.inf)
    lam = []
    for a in range(tables.k):
        for b in range(tables.k):
            ok = tables.valid[:, a] & tables.valid[:, b] & (r[:, a] > r[:, b]) & (c[:, a] < c[:, b])
            lam.append((c[ok, b] - c[ok, a]) / (r[ok, a] - r[ok, b]))
    lams = np.unique(np.r_[0.0, np.concatenate(lam)])
    if len(lams) > max_lams:  # any λ gives a valid bound; keep quantiles
        lams = lams[np.unique(np.linspace(0, len(lams) - 1, max_lams).round().astype(np.int64))]
    r = np.where(tables.valid, r, 0.0)  # invalid options already cost inf
    val = c[:, :, None] + r[:, :, None] * lams[None, None, :]  # (n, k, m)
    arg = np.argmin(val, axis=1)  # (n, m)
    h = np.take_along_axis(val, arg[:, None, :], 1)[:, 0, :]
    w = np.take_along_axis(r[:, :, None].repeat(len(lams), 2), arg[:, None, :], 1)[:, 0, :]
    zero = np.zeros((1, len(lams)))
    G = np.r_[np.cumsum(h[::-1], axis=0)[::-1], zero]
    W = np.r_[np.cumsum(w[::-1], axis=0)[::-1], zero]
    return lams, G, W


def _lower_bound(C, S, lams, g, w):
    """Lagrangian lower bound on the total cost of prefixes and its rounding-error scale.

    Args:
        C: prefix costs, ``(N,)`` float64 seconds.
        S: slack bytes ``B - Σ_{j>i} rmin_j ≥ 0`` (remaining budget beyond the cheapest
            completion's retained bytes), ``(N,)`` int64, computed exactly in integers.
        lams: ``(m,)`` multipliers (s/byte), ascending.
        g, w: rows of :func:`_lagrangian`'s ``G`` and ``W`` for the segments still to come.

    Returns:
        ``(lb, scale)``: ``lb = C + max over two λ of (G(λ) - λ S)`` seconds (``(N,)``), and
        ``scale = |C| + |G| + |λ S|`` (``(N,)``), the magnitude its float error is relative to.
    """
    t = np.searchsorted(-w, -S, side="left")  # first λ whose minimisers fit in S
    t1 = np.clip(t, 0, len(lams) - 1)
    t0 = np.clip(t - 1, 0, len(lams) - 1)
    Sf = S.astype(np.float64)
    a1, a0 = lams[t1] * Sf, lams[t0] * Sf
    lb = C + np.maximum(g[t1] - a1, g[t0] - a0)
    scale = np.abs(C) + np.maximum(np.abs(g[t1]) + a1, np.abs(g[t0]) + a0)
    return lb, scale


def _cap(lb: np.ndarray, mem: np.ndarray, cap: int) -> np.ndarray:
    """Indices (ascending) of ``cap`` points: smallest cost bound, plus the smallest memory."""
    keep = np.argsort(lb, kind="stable")[: cap - 1]
    return np.unique(np.r_[keep, np.argmin(mem)])


def dp_solve(tables: CostTables, budget_bytes: int, frontier_cap: int | None = None,
             bound_pruning: bool = False, upper_bound_s: float | None = None,
             abort_above: int | None = None, on_segment: OnSegment | None = None) -> DPOutcome:
    """Minimise ``Σ c`` s.t. ``P + Σ r + max q ≤ M`` over the valid options of ``tables``.

    Ties: lowest cost, then lowest peak, then the lexicographically smallest option codes
    (registry order, eager < whole < region, first segment most significant) — the same rule as
    :func:`stateremat.planner.exhaustive`.

    Args:
        tables: cost tables of one model (bytes int64, seconds float64).
        budget_bytes: ``M`` in bytes (any int; budgets above the largest possible peak are
            treated as that peak, so huge values cannot overflow int64).
        frontier_cap: keep at most this many frontier points per segment (approximate: the
            result is ``truncated``; if the cap dropped every completion but the exact
            minimum-peak policy fits ``M``, that policy is returned, still ``truncated``).
        bound_pruning: drop prefixes whose Lagrangian lower bound exceeds an incumbent's cost
            (never changes the answer; bounds carry a float-error margin).
        upper_bound_s: incumbent cost in seconds (the cost of a feasible policy); found
            automatically when ``None`` and pruning is on.
        abort_above: give up (``aborted``) once the frontier exceeds this many points.
        on_segment: progress, ``(stage, done, total, frontier_size)`` after every segment of
            every pass (a pruned solve runs beam passes before its exact pass).

    Returns:
        :class:`DPOutcome`: ``codes`` ``(n,)`` int64 option codes (``None`` when no policy fits
        or on abort), the largest frontier size, ``truncated``, the incumbent cost used.

    Raises:
        InternalError: (automatic incumbent only) bound pruning emptied an untruncated
            frontier although the incumbent is feasible — a bug, never a silent infeasible.

    Warns:
        FrontierWarning: (once) the frontier holds more than :data:`FRONTIER_WARN_POINTS`
            points; a frontier cap or the MILP is then much faster.

    Danger:
        An explicit ``upper_bound_s`` below the true optimum prunes the optimum: ``codes`` is
        then ``None`` although a policy fits (the caller's incumbent must be a real policy's
        cost).

    References:
        Paper §4, eq. (3).
    """
    budget = clamp_budget(tables, budget_bytes)
    if bound_pruning and upper_bound_s is None:
        return _solve_with_incumbents(tables, budget, frontier_cap, on_segment)
    stage = "exact" if frontier_cap is None else f"capped at {frontier_cap:,}"
    out = _dp(tables, budget, frontier_cap, bound_pruning, upper_bound_s, abort_above,
              _staged(on_segment, stage))
    if out.codes is None and out.truncated and not out.aborted:
        # The cap, not the budget, emptied the frontier: the exact min-peak policy may fit.
        peak, codes = min_peak(tables)
        if peak <= budget:
            return DPOutcome(codes, out.frontier_size, True, upper_bound_s,
                             candidates_max=out.candidates_max)
    return out


def _staged(on_segment: OnSegment | None, stage: str) -> Callable[[int, int, int], None] | None:
    if on_segment is None:
        return None
    return lambda done, total, frontier: on_segment(stage, done, total, frontier)


def _warn_frontier(size: int, done: int, n: int) -> None:
    warnings.warn(
        f"stateremat.planner: the exact plan's Pareto frontier holds {size:,} points after "
        f"segment {done:,} of {n:,} (warning above {FRONTIER_WARN_POINTS:,}); an exact plan of "
        "this card may take minutes to hours. Tip: cap it (frontier_cap=1000, CLI --frontier-cap "
        "1000: the result is marked truncated) or solve it as a MILP "
        "(stateremat.planner.milp).", FrontierWarning, stacklevel=2)


def _dp(tables: CostTables, avail_budget: int, frontier_cap: int | None, bound_pruning: bool,
        upper_bound_s: float | None, abort_above: int | None,
        on_segment: Callable[[int, int, int], None] | None = None,
        warn_above: int | None = FRONTIER_WARN_POINTS) -> DPOutcome:
    """The DP pass itself (``avail_budget`` already clamped); see :func:`dp_solve`.

    Warns (:class:`FrontierWarning`) once, when the frontier first exceeds ``warn_above``.
    """
    if bound_pruning or frontier_cap is not None:
        lams, G, W = _lagrangian(tables)
    limit = upper_bound_s * (1 + 1e-9) + 1e-12 if bound_pruning else np.inf
    n = tables.n
    avail = int(avail_budget) - tables.persistent_bytes
    rmin = np.where(tables.valid, tables.r, _ABSENT).min(axis=1)
    qmin = np.where(tables.valid, tables.q, _ABSENT).min(axis=1)
    rest_r = np.r_[np.cumsum(rmin[::-1])[::-1][1:], 0]  # Σ_{j>i} min r_j
    q_floor = np.r_[np.maximum.accumulate(qmin[::-1])[::-1][1:], 0]  # max_{j>i} min q_j
    # Float error of a bound: G is a sum of ≤ n non-negative terms, C a left fold of ≤ n
    # terms, plus a few products and the comparison with the incumbent's own left fold.
    rel_err = 4.0 * (n + 4) * np.finfo(np.float64).eps

    R = np.zeros(1, np.int64)
    Q = np.zeros(1, np.int64)
    C = np.zeros(1, np.float64)
    parents: list[np.ndarray] = []
    chosen: list[np.ndarray] = []
    largest, truncated, cands = 1, False, 0
    for i in range(n):
        opts = np.flatnonzero(tables.valid[i])
        k = len(opts)
        # Parent-major layout keeps candidates in lexicographic order of their policies.
        Rn = (R[:, None] + tables.r[i, opts][None, :]).ravel()
        Qn = np.maximum(np.maximum(Q[:, None], tables.q[i, opts][None, :]), q_floor[i]).ravel()
        Cn = (C[:, None] + tables.c[i, opts][None, :]).ravel()
        par = np.repeat(np.arange(len(R)), k)
        code = np.tile(opts, len(R))
        slack = avail - Rn - Qn - rest_r[i]  # exact int64 bytes beyond the cheapest completion
        ok = slack >= 0
        cands = max(cands, int(ok.sum()))
        if not ok.any():
            return DPOutcome(None, largest, truncated, upper_bound_s, candidates_max=cands)
        lb = None
        if bound_pruning or frontier_cap is not None:
            lb, scale = _lower_bound(Cn[ok], slack[ok], lams, G[i + 1], W[i + 1])
            if bound_pruning:
                # Prune only what the bound excludes beyond its own rounding error.
                survive = lb - rel_err * (scale + limit) <= limit
                ok[ok] = survive
                lb = lb[survive]
                if not ok.any():  # only a frontier cap can drop the incumbent's own prefix
                    return DPOutcome(None, largest, truncated, upper_bound_s,
                                     candidates_max=cands)
        Rn, Qn, Cn, par, code = Rn[ok], Qn[ok], Cn[ok], par[ok], code[ok]
        keep = np.flatnonzero(pareto_mask(Rn, Qn, Cn))
        if frontier_cap is not None and len(keep) > frontier_cap:
            # Beam: the points whose Lagrangian bound promises the cheapest completion.
            keep = keep[_cap(lb[keep], Rn[keep] + Qn[keep], frontier_cap)]
            truncated = True
        R, Q, C = Rn[keep], Qn[keep], Cn[keep]
        parents.append(par[keep])
        chosen.append(code[keep].astype(np.int8))
        if warn_above is not None and largest <= warn_above < len(R):
            _warn_frontier(len(R), i + 1, n)
        largest = max(largest, len(R))
        if abort_above is not None and largest > abort_above:
            return DPOutcome(None, largest, truncated, upper_bound_s, aborted=True,
                             candidates_max=cands)
        if on_segment is not None:
            on_segment(i + 1, n, len(R))
    best = int(np.lexsort((np.arange(len(R)), R + Q, C))[0])
    codes = np.empty(n, np.int64)
    for i in range(n - 1, -1, -1):
        codes[i] = chosen[i][best]
        best = int(parents[i][best])
    return DPOutcome(codes, largest, truncated, upper_bound_s, candidates_max=cands)


def _restaged(on_segment: OnSegment | None, stage: str) -> OnSegment | None:
    if on_segment is None:
        return None
    return lambda _stage, done, total, frontier: on_segment(stage, done, total, frontier)


#: (beam width, abort-above frontier size) per attempt; the last attempt never aborts.
_SCHEDULE: tuple[tuple[int, int | None], ...] = ((32, 20_000), (512, 20_000), (4096, None))


def _solve_with_incumbents(tables: CostTables, budget_bytes: int, frontier_cap: int | None,
                           on_segment: OnSegment | None = None) -> DPOutcome:
    """Bound-pruned DP with incumbents from beams of growing width.

    The incumbent is the cheaper of the minimum-peak policy and a beam (capped DP ordered by
    the Lagrangian bound). A loose incumbent lets the exact frontier grow; then the exact pass
    is abandoned above 20,000 points and retried with a wider beam, the last time without limit.
    """
    peak, codes = min_peak(tables)
    if peak > budget_bytes:  # no feasible policy exists at all (exact min-peak test)
        return DPOutcome(None, 0, False, None)
    inc_codes, ub = codes, evaluate(tables, codes)[1]
    largest = cands = 0
    warn: int | None = FRONTIER_WARN_POINTS  # once per solve, by the first pass that grows past it
    for attempt, (beam, abort) in enumerate(_SCHEDULE, 1):
        quick = dp_solve(tables, budget_bytes, frontier_cap=beam,
                         on_segment=_restaged(on_segment, f"incumbent {attempt}/{len(_SCHEDULE)}: "
                                                          f"beam of {beam:,}"))
        if quick.codes is not None:
            cost = evaluate(tables, quick.codes)[1]
            if cost < ub:
                inc_codes, ub = quick.codes, cost
        what = "exact" if frontier_cap is None else f"capped at {frontier_cap:,}"
        limit = "" if abort is None else f", given up above {abort:,} points"
        out = _dp(tables, budget_bytes, frontier_cap, True, ub, abort,
                  _staged(on_segment, f"{what} {attempt}/{len(_SCHEDULE)}{limit}"), warn)
        largest, cands = max(largest, out.frontier_size), max(cands, out.candidates_max)
        if largest > FRONTIER_WARN_POINTS:
            warn = None
        if out.aborted:
            continue
        if out.codes is None:
            # Exact bounds keep the incumbent's own prefixes (bound ≤ its cost); only a
            # frontier cap can have dropped them. The incumbent is feasible: return it.
            internal_assert(out.truncated, "bound pruning emptied an untruncated frontier "
                            f"below the feasible incumbent cost {ub!r}")
            return DPOutcome(inc_codes, largest, True, ub, candidates_max=cands)
        return DPOutcome(out.codes, largest, out.truncated, ub, candidates_max=cands)
    internal_assert(False, "the last bound-pruned pass has no abort limit")
