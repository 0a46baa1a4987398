"""Exhaustive enumeration of every policy: the DP's oracle (paper §9.1, 2^16 policies).

Policies are numbered in mixed radix with the first segment most significant, so policy
number order is lexicographic order of option codes; chunks of numbers are decoded and
scored with numpy. Costs are accumulated column by column in segment order, which is the
DP's summation order, so equal policies get bit-identical costs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._model import CostTables, clamp_budget


@dataclass(frozen=True)
class ExhaustiveOutcome:
    """Best feasible policy (``None`` if none), min peak over all policies, count enumerated."""

    codes: np.ndarray | None
    min_peak_bytes: int
    min_peak_codes: np.ndarray
    policies_count: int


def _decode(numbers: np.ndarray, radix: int, n: int, cols: np.ndarray) -> np.ndarray:
    digits = np.empty((len(numbers), n), np.int64)
    rest = numbers.copy()
    for i in range(n - 1, -1, -1):
        digits[:, i] = rest % radix
        rest //= radix
    return cols[digits]


def enumerate_policies(tables: CostTables, budget_bytes: int, chunk: int = 1 << 18,
                       max_policies: int = 50_000_000) -> ExhaustiveOutcome:
    """Score every policy over the options valid anywhere in ``tables``.

    Ties: lowest cost, then lowest peak, then lowest policy number (lexicographic codes).

    Raises:
        ValueError: more than ``max_policies`` policies (3^16 ≈ 43 M fits the default).
    """
    budget_bytes = clamp_budget(tables, budget_bytes)  # same feasible set, int64-safe
    n = tables.n
    cols = np.flatnonzero(tables.valid.any(axis=0))  # option codes in play, ascending
    radix = len(cols)
    total = radix ** n
    if total > max_policies:
        raise ValueError(f"exhaustive: {radix}^{n} = {total} policies exceeds max_policies="
                         f"{max_policies}. Tip: use the DP or MILP for long cards.")
    rows = np.arange(n)
    best: tuple[float, int, int] | None = None
    best_codes = None
    minp: tuple[int, int] | None = None
    minp_codes = None
    for start in range(0, total, chunk):
        numbers = np.arange(start, min(start + chunk, total), dtype=np.int64)
        codes = _decode(numbers, radix, n, cols)
        ok = tables.valid[rows, codes].all(axis=1)
        R = tables.r[rows, codes].sum(axis=1)
        Q = tables.q[rows, codes].max(axis=1)
        C = np.zeros(len(numbers))
        for i in range(n):  # left fold, as the DP adds
            C += tables.c[i, codes[:, i]]
        peak = tables.persistent_bytes + R + Q
        if ok.any():
            j = int(np.flatnonzero(ok)[np.argmin(peak[ok])])
            if minp is None or int(peak[j]) < minp[0]:
                minp, minp_codes = (int(peak[j]), int(numbers[j])), codes[j].copy()
        fit = ok & (peak <= budget_bytes)
        if fit.any():
            cand = np.flatnonzero(fit)
            j = int(cand[np.lexsort((numbers[cand], peak[cand], C[cand]))[0]])
            key = (float(C[j]), int(peak[j]), int(numbers[j]))
            if best is None or key < best:
                best, best_codes = key, codes[j].copy()
    return ExhaustiveOutcome(best_codes, minp[0], minp_codes, total)
