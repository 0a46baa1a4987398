"""Vectorised 3-D Pareto filter on (retained bytes, max temporary bytes, cost) (paper §4).

Dominance is on the three coordinates separately, never on ``retained + temporary``: a later
segment can raise the temporary maximum, which erases a prefix's temporary advantage but
never its retained advantage, so combined-memory dominance can discard the optimum.
"""
from __future__ import annotations

import numpy as np

_SMALL = 192


def _exclusive_groupwise_cummin(values: np.ndarray, group: np.ndarray, span: int) -> np.ndarray:
    """Per position, min of ``values`` over earlier positions of the same (contiguous) group.

    ``values`` are ranks in ``[0, span)``, ``group`` is non-decreasing; returns ``span`` where
    there is no earlier member.
    """
    shifted = values - group * (span + 1)  # earlier groups get larger keys: cannot win
    cm = np.minimum.accumulate(shifted) + group * (span + 1)
    out = np.full(values.shape, span, np.int64)
    same = group[1:] == group[:-1]
    out[1:][same] = cm[:-1][same]
    return out


def pareto_mask(r: np.ndarray, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Keep-mask of the Pareto frontier of points ``(r, q, c)`` given in tie-break order.

    Point ``j`` is removed when some ``i`` has ``r_i ≤ r_j``, ``q_i ≤ q_j``, ``c_i ≤ c_j`` and
    either ``(r_i, c_i) ≠ (r_j, c_j)`` or (same ``r`` and ``c``) ``i < j``. The last clause
    keeps the earliest (lexicographically smallest policy) of exact ties; a point with equal
    ``r`` and ``c`` but smaller ``q`` and a *later* index does not remove an earlier one,
    because a later segment can raise both temporary maxima to the same value and the tie
    must then go to the earlier policy. The relation is a strict partial order, so removing
    every dominated point keeps a dominating survivor for each.

    Args:
        r: retained bytes, ``(N,)`` int64.
        q: max temporary bytes, ``(N,)`` int64.
        c: cost seconds, ``(N,)`` float64.

    Returns:
        ``(N,)`` bool, True for frontier points.

    References:
        Paper §4 ("dominance on only their combined memory would be unsafe").
    """
    n = r.shape[0]
    if n <= 1:
        return np.ones(n, bool)
    if n <= _SMALL:  # a few broadcast ops beat the sort-based sweep's fixed overhead
        return pareto_mask_bruteforce(r, q, c)
    return pareto_sweep(r, q, c)


def pareto_sweep(r: np.ndarray, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The O(N log N log L) sort-and-sweep form of :func:`pareto_mask` (any N ≥ 1)."""
    n = r.shape[0]
    idx = np.arange(n)
    order = np.lexsort((idx, q, c, r))  # by r, then c, then q, then index
    rs, cs, qs = r[order], c[order], q[order]
    new_group = np.r_[True, (rs[1:] != rs[:-1]) | (cs[1:] != cs[:-1])]
    gid = np.cumsum(new_group) - 1
    starts = np.flatnonzero(new_group)[gid]  # first sorted position of each point's (r, c) group
    crank = np.unique(cs, return_inverse=True)[1].astype(np.int64)
    qvals, qrank = np.unique(qs, return_inverse=True)
    qrank = qrank.astype(np.int64)
    n_levels = len(qvals)

    # Pass 1: dominated by a point of an earlier (r, c) group (so r_i ≤ r_j, c_i ≤ c_j with one
    # strict... or c_i < c_j at equal r) that also has q_i ≤ q_j. The prefix [0, qrank_j] is split
    # into dyadic blocks; per block size 2^d a block-wise running min of crank over sorted
    # positions answers "min cost among earlier groups inside this q-block" by binary search.
    best = np.full(n, n, np.int64)
    x = qrank + 1
    pos = np.arange(n)
    for d in range(int(n_levels).bit_length()):
        ask = ((x >> d) & 1).astype(bool)
        if not ask.any():
            continue
        blk = qrank >> d
        o2 = np.argsort(blk, kind="stable")  # by block, then position
        keys = blk[o2] * n + pos[o2]
        bsorted = blk[o2]
        cm = np.minimum.accumulate(crank[o2] - bsorted * (n + 1)) + bsorted * (n + 1)
        want_blk = (x[ask] >> d) - 1
        at = np.searchsorted(keys, want_blk * n + starts[ask], side="left") - 1
        hit = (at >= 0) & (bsorted[np.maximum(at, 0)] == want_blk)
        sel = np.flatnonzero(ask)[hit]
        best[sel] = np.minimum(best[sel], cm[at[hit]])
    dominated = best <= crank

    # Pass 2: inside an (r, c) group, an earlier index with q_i ≤ q_j removes j.
    o3 = np.lexsort((order, gid))  # sorted positions, by group then original index
    prev_min = _exclusive_groupwise_cummin(qrank[o3], gid[o3], n_levels)
    dominated[o3[prev_min <= qrank[o3]]] = True

    keep = np.empty(n, bool)
    keep[order] = ~dominated
    return keep


def pareto_mask_bruteforce(r: np.ndarray, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """O(N²) form of :func:`pareto_mask`: its reference in tests and its small-N path."""
    n = r.shape[0]
    ri, rj = r[:, None], r[None, :]  # [i, j]: does i dominate j
    ci, cj = c[:, None], c[None, :]
    le = (ri <= rj) & (q[:, None] <= q[None, :]) & (ci <= cj)
    strict = (ri != rj) | (ci != cj) | np.tri(n, n, -1, dtype=bool).T  # i < j
    return ~(le & strict).any(axis=0)
