"""The chain peak model: the peak that happens when the segments run as a chain (issue 26).

Eq. (3)'s ``P + Σ r + max q`` charges every segment's retained bytes at the moment of the
largest temporary. In a chain, segment ``i``'s temporary (its forward, or its replay and
backward) runs while only the retained bytes of segments ``≤ i`` are held, so the peak of a
training step under a policy ``o`` is::

    peak(o) = max(base + max_i (Σ_{j≤i} r[j, o_j] + q[i, o_i]), outside)

with ``base`` the live bytes at the first segment's entry and ``outside`` the peaks outside the
segments, both from a :func:`stateremat.torch.profile` card's ``meta["persistent"]`` (cards
without that record use ``base = P``, ``outside = 0``). The last segment's ``q`` includes the
head and loss. The constraint ``peak ≤ M`` is ``n`` linear constraints (one per prefix), so the
MILP stays linear; the DP keeps a Pareto frontier over ``(R = Σ r, T = max_i (R_i + q_i), C)``.

Ties: lowest cost, then lowest peak (the solvers may return different policies among those).
"""
from __future__ import annotations

import numpy as np

from ..contract import ProfileCard, ProfileCardError, internal_assert
from ._dp import DPOutcome
from ._exhaustive import ExhaustiveOutcome, _decode
from ._milp import MILPOutcome
from ._model import _ABSENT, CostTables, chain_parts as chain_parts, left_fold_sum
from ._pareto import pareto_mask

#: Peak models a planner can judge a budget by: eq. (3)'s bound, or the chain's peak.
PEAK_MODELS = ("eq3", "chain")


def chain_peak_bytes(card: ProfileCard, options: list[str]) -> int:
    """Chain peak of a training step under ``options`` (one option name per card segment), bytes.

    ``max(base + max_i (Σ_{j≤i} r_j + q_i), peaks outside the segments)`` with the parts a
    :func:`stateremat.torch.profile` card records in ``meta["persistent"]`` (``base =
    persistent_bytes`` and no outside peaks without them); at most eq. (3)'s ``P + Σ r + max q``
    on a profiled card, whose ``base ≤ P`` and outside peaks are measured.

    Raises:
        ValueError: ``options`` does not match the card's segments or names an unmeasured option.
        ProfileCardError: a recorded part of ``meta["persistent"]`` is not a byte count.

    References:
        Paper §4, eq. (3) (the bound this refines for a chain of segments).
    """
    api = "stateremat.planner.chain_peak_bytes"
    if not isinstance(card, ProfileCard):
        raise ProfileCardError(f"{api}: expected a ProfileCard, got {type(card).__name__}. "
                               "Tip: load one with stateremat.contract.load_card(path).")
    options = list(options)
    if len(options) != len(card.segments):
        raise ValueError(f"{api}: {len(options)} options for {len(card.segments)} card segments. "
                         "Tip: pass plan.options of a plan made on this card.")
    base, outside = chain_parts(card)
    running = top = 0
    for seg, o in zip(card.segments, options):
        if o not in seg.options:
            raise ValueError(f"{api}: segment {seg.name!r} has no measured {o!r} option (it has "
                             f"{list(seg.options)}). Tip: plan on this card.")
        cost = seg.options[o]
        running += cost.retained_bytes
        top = max(top, running + cost.temp_bytes)
    return max(base + top, outside)


def chain_evaluate(tables: CostTables, codes) -> tuple[int, float]:
    """Chain ``(peak_bytes, time_s)`` of a policy in ``tables`` (time in the tables' units).

    Raises:
        ValueError: a code selects an option invalid for its segment.
    """
    codes = np.asarray(codes, dtype=np.int64)
    rows = np.arange(tables.n)
    if codes.shape != (tables.n,) or not tables.valid[rows, codes].all():
        raise ValueError(f"planner: policy {codes.tolist()} selects an option that this model "
                         "does not allow. Tip: the card omits region for some segments.")
    r = tables.r[rows, codes]
    top = int((np.cumsum(r) + tables.q[rows, codes]).max())
    peak = max(tables.chain_base + top, tables.chain_outside)
    return peak, left_fold_sum(tables.c[rows, codes])


def _future(tables: CostTables) -> tuple[np.ndarray, np.ndarray]:
    """Per segment ``i``: the least growth of ``T`` beyond ``R_i`` the later segments force
    (``max_{j>i} Σ_{i<l≤j} rmin_l + qmin_j``, 0 when none), and the least later cost."""
    rmin = np.where(tables.valid, tables.r, _ABSENT).min(axis=1)
    qmin = np.where(tables.valid, tables.q, _ABSENT).min(axis=1)
    cmin = np.where(tables.valid, tables.c, np.inf).min(axis=1)
    S = np.cumsum(rmin)
    v = S + qmin  # Σ_{l≤j} rmin_l + qmin_j
    suf = np.r_[np.maximum.accumulate(v[::-1])[::-1][1:], np.iinfo(np.int64).min // 4]
    fut = np.maximum(suf - S, 0)
    rest_c = np.r_[np.cumsum(cmin[::-1])[::-1][1:], 0.0]
    return fut, rest_c


def chain_dp(tables: CostTables, budget_bytes: int, upper_bound_s: float | None = None,
             frontier_cap: int | None = None, on_segment=None) -> DPOutcome:
    """Minimise ``Σ c`` s.t. the chain peak ``≤ M``: an exact Pareto DP over ``(R, T, C)``.

    Exact reductions: a prefix is dropped when its ``T`` or the least ``T`` its completions
    force exceeds ``M - base``, or (given ``upper_bound_s``, the cost of a chain-feasible policy)
    when its cost plus the least cost of the later segments exceeds that bound beyond a
    float-error margin. ``frontier_cap`` keeps the cheapest points (then ``truncated``).
    ``on_segment(done, total, frontier_size)`` is called after each segment.
    """
    n = tables.n
    if tables.chain_outside > budget_bytes:
        return DPOutcome(None, 0, False, upper_bound_s)
    avail = int(min(budget_bytes, 2**62)) - tables.chain_base
    fut, rest_c = _future(tables)
    limit = np.inf if upper_bound_s is None else upper_bound_s * (1 + 1e-9) + 1e-12
    rel_err = 4.0 * (n + 4) * np.finfo(np.float64).eps
    R = np.zeros(1, np.int64)
    T = np.zeros(1, np.int64)
    C = np.zeros(1, np.float64)
    parents, chosen = [], []
    largest, truncated, cands = 1, False, 0
    for i in range(n):
        opts = np.flatnonzero(tables.valid[i])
        k = len(opts)
        Rn = (R[:, None] + tables.r[i, opts][None, :]).ravel()
        Tn = np.maximum(T[:, None], R[:, None] + (tables.r[i, opts] + tables.q[i, opts])[None, :]).ravel()
        Cn = (C[:, None] + tables.c[i, opts][None, :]).ravel()
        par = np.repeat(np.arange(len(R)), k)
        code = np.tile(opts, len(R))
        ok = (Tn <= avail) & (Rn + fut[i] <= avail)
        if upper_bound_s is not None:
            lb = Cn + rest_c[i]
            ok &= lb - rel_err * (np.abs(lb) + limit) <= limit
        cands = max(cands, int(ok.sum()))
        if not ok.any():
            return DPOutcome(None, largest, truncated, upper_bound_s, candidates_max=cands)
        Rn, Tn, Cn, par, code = Rn[ok], Tn[ok], Cn[ok], par[ok], code[ok]
        keep = np.flatnonzero(pareto_mask(Rn, Tn, Cn))
        if frontier_cap is not None and len(keep) > frontier_cap:
            keep = np.unique(np.r_[keep[np.argsort(Cn[keep] + rest_c[i], kind="stable")[:frontier_cap - 1]],
                                   keep[np.argmin(Tn[keep] + (Rn[keep] + fut[i] - Tn[keep]).clip(0))]])
            truncated = True
        R, T, C = Rn[keep], Tn[keep], Cn[keep]
        parents.append(par[keep])
        chosen.append(code[keep])
        largest = max(largest, len(R))
        if on_segment is not None:
            on_segment(i + 1, n, len(R))
    best = int(np.lexsort((np.arange(len(R)), T, C))[0])
    codes = np.empty(n, np.int64)
    for i in range(n - 1, -1, -1):
        codes[i] = chosen[i][best]
        best = int(parents[i][best])
    return DPOutcome(codes, largest, truncated, upper_bound_s, candidates_max=cands)


def chain_min_peak(tables: CostTables) -> tuple[int, np.ndarray]:
    """Exact least chain peak over all policies and one policy attaining it (the fastest of
    those the ``(R, T)`` frontier keeps)."""
    n = tables.n
    R = np.zeros(1, np.int64)
    T = np.zeros(1, np.int64)
    C = np.zeros(1, np.float64)
    parents, chosen = [], []
    for i in range(n):
        opts = np.flatnonzero(tables.valid[i])
        k = len(opts)
        Rn = (R[:, None] + tables.r[i, opts][None, :]).ravel()
        Tn = np.maximum(T[:, None], R[:, None] + (tables.r[i, opts] + tables.q[i, opts])[None, :]).ravel()
        Cn = (C[:, None] + tables.c[i, opts][None, :]).ravel()
        par = np.repeat(np.arange(len(R)), k)
        code = np.tile(opts, len(R))
        # (R, T) dominance only (cost as the last coordinate's tie-break keeps the frontier 2-D)
        keep = np.flatnonzero(pareto_mask(Rn, Tn, np.zeros(len(Rn))))
        R, T, C = Rn[keep], Tn[keep], Cn[keep]
        parents.append(par[keep])
        chosen.append(code[keep])
    best = int(np.lexsort((np.arange(len(R)), C, T))[0])
    codes = np.empty(n, np.int64)
    for i in range(n - 1, -1, -1):
        codes[i] = chosen[i][best]
        best = int(parents[i][best])
    peak = chain_evaluate(tables, codes)[0]
    internal_assert(peak == max(tables.chain_base + int(T.min()), tables.chain_outside),
                    "chain min-peak reconstruction differs from its frontier")
    return peak, codes


def chain_enumerate(tables: CostTables, budget_bytes: int, chunk: int = 1 << 18,
                    max_policies: int = 50_000_000) -> ExhaustiveOutcome:
    """Score every policy by the chain peak (the chain DP's oracle); ties as the DP's.

    Raises:
        ValueError: more than ``max_policies`` policies.
    """
    n = tables.n
    cols = np.flatnonzero(tables.valid.any(axis=0))
    radix = len(cols)
    total = radix ** n
    if total > max_policies:
        raise ValueError(f"exhaustive: {radix}^{n} = {total} policies exceeds max_policies="
                         f"{max_policies}. Tip: use the DP or MILP for long cards.")
    rows = np.arange(n)
    best, best_codes, minp, minp_codes = None, None, None, None
    for start in range(0, total, chunk):
        numbers = np.arange(start, min(start + chunk, total), dtype=np.int64)
        codes = _decode(numbers, radix, n, cols)
        ok = tables.valid[rows, codes].all(axis=1)
        r = tables.r[rows, codes]
        top = (np.cumsum(r, axis=1) + tables.q[rows, codes]).max(axis=1)
        peak = np.maximum(tables.chain_base + top, tables.chain_outside)
        C = np.zeros(len(numbers))
        for i in range(n):  # left fold, as the DP adds
            C += tables.c[i, codes[:, i]]
        if ok.any():
            j = int(np.flatnonzero(ok)[np.argmin(peak[ok])])
            if minp is None or int(peak[j]) < minp:
                minp, minp_codes = int(peak[j]), codes[j].copy()
        fit = ok & (peak <= budget_bytes)
        if fit.any():
            cand = np.flatnonzero(fit)
            j = int(cand[np.lexsort((numbers[cand], peak[cand], C[cand]))[0]])
            key = (float(C[j]), int(peak[j]), int(numbers[j]))
            if best is None or key < best:
                best, best_codes = key, codes[j].copy()
    return ExhaustiveOutcome(best_codes, minp, minp_codes, total)


def _chain_milp(tables: CostTables, avail: float, objective: str, time_limit_s: float):
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    n = tables.n
    seg, opt = np.nonzero(tables.valid)
    nx = len(seg)
    r = tables.r[seg, opt].astype(np.float64)
    q = tables.q[seg, opt].astype(np.float64)
    top = max(float(np.abs(r).max()), float(np.abs(q).max()), 1.0) * n
    unit = 2.0 ** max(int(np.floor(np.log2(top))) - 10, 0)
    r, q, avail = r / unit, q / unit, avail / unit
    # prefix row i: Σ_{seg ≤ i} r x + Σ_{seg = i} q x (- t for the min-peak objective)
    rows_i, cols_j, vals = [], [], []
    for i in range(n):
        sel = np.flatnonzero(seg <= i)
        rows_i.append(np.full(len(sel), i))
        cols_j.append(sel)
        vals.append(r[sel] + np.where(seg[sel] == i, q[sel], 0.0))
    rows_i, cols_j, vals = np.concatenate(rows_i), np.concatenate(cols_j), np.concatenate(vals)
    onehot = coo_array((np.ones(nx), (seg, np.arange(nx))), shape=(n, nx + 1))
    if objective == "time":
        cmax = float(tables.c[seg, opt].max()) or 1.0
        obj = np.r_[tables.c[seg, opt] * (1e4 / (cmax * n)), 0.0]
        pref = coo_array((vals, (rows_i, cols_j)), shape=(n, nx + 1))
        cons = [LinearConstraint(onehot, 1, 1), LinearConstraint(pref, -np.inf, avail)]
    else:  # minimise t ≥ every prefix row
        obj = np.r_[np.zeros(nx), 1.0]
        pref = coo_array((np.r_[vals, -np.ones(n)], (np.r_[rows_i, np.arange(n)],
                                                     np.r_[cols_j, np.full(n, nx)])),
                         shape=(n, nx + 1))
        cons = [LinearConstraint(onehot, 1, 1), LinearConstraint(pref, -np.inf, 0)]
    res = milp(obj, integrality=np.r_[np.ones(nx), 0], bounds=Bounds(np.zeros(nx + 1),
               np.r_[np.ones(nx), np.inf]), constraints=cons,
               options={"mip_rel_gap": 0.0, "time_limit": time_limit_s, "presolve": True})
    codes = None
    if res.x is not None:
        x = res.x[:nx] > 0.5
        codes = np.full(n, -1, np.int64)
        codes[seg[x]] = opt[x]
        if (codes < 0).any() or np.bincount(seg[x], minlength=n).max() != 1:
            codes = None
    return res, codes


def chain_milp_solve(tables: CostTables, budget_bytes: int,
                     time_limit_s: float = 60.0) -> MILPOutcome:
    """The chain model as a MILP (HiGHS); the policy is re-scored exactly and, if a solver
    tolerance let it exceed ``M``, re-solved with a tightened budget (then not claimed optimal)."""
    if tables.chain_outside > budget_bytes or budget_bytes < tables.chain_base:
        return MILPOutcome(None, 2, "the peaks outside the segments or the base exceed the budget",
                           True)
    avail = float(min(budget_bytes, 2**62) - tables.chain_base)
    tightened = 0.0
    for attempt in range(12):
        res, codes = _chain_milp(tables, avail, "time", time_limit_s)
        if codes is None:
            return MILPOutcome(None, int(res.status), str(res.message),
                               res.status == 2 and tightened == 0)
        peak, _ = chain_evaluate(tables, codes)
        if peak <= budget_bytes:
            return MILPOutcome(codes, int(res.status), str(res.message),
                               res.status == 0 and tightened == 0)
        step = ((peak - budget_bytes) + 1.0) * 2.0**attempt
        avail -= step
        tightened += step
        if avail < 0:
            break
    return MILPOutcome(None, int(res.status), "could not find a policy within the budget after "
                       "tightening for solver tolerance", False)


def chain_milp_min_peak(tables: CostTables, time_limit_s: float = 60.0) -> tuple[int, np.ndarray]:
    """Least chain peak by MILP (independent of :func:`chain_min_peak`)."""
    _, codes = _chain_milp(tables, np.inf, "peak", time_limit_s)
    internal_assert(codes is not None, "chain min-peak MILP returned no policy")
    return chain_evaluate(tables, codes)[0], codes
