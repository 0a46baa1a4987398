"""Paired process-bootstrap intervals for geometric-mean ratios, with Bonferroni levels.

The statistic is the mean of per-process log ratios (so ``exp`` of it is the geometric mean
ratio); resampling processes with replacement keeps each process's pair together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as _sps

#: Family-wise error rate of a cohort's prespecified comparisons (paper §11: two
#: comparisons per cohort -> approximate 97.5 % intervals = 1 - 0.05/2).
FAMILY_ALPHA = 0.05
N_RESAMPLES = 20_000


def bonferroni_level(m: int, family_alpha: float = FAMILY_ALPHA) -> float:
    """Per-interval confidence level ``1 - family_alpha / m`` for ``m`` prespecified tests.

    Args:
        m: number of prespecified (comparison, metric) pairs in the cohort, ``m >= 1``.
        family_alpha: family-wise error rate (default 0.05).

    Returns:
        The confidence level, e.g. 0.975 for ``m = 2`` (the paper's 44 and 32 GiB cohorts)
        and 0.991667 for ``m = 6`` (the three-workload cohort).

    Raises:
        ValueError: if ``m < 1`` or ``family_alpha`` is not in (0, 1).

    References:
        Paper §11 and Table 8 ("Bonferroni adjustment across the six comparisons").
    """
    if int(m) < 1 or not 0.0 < family_alpha < 1.0:
        raise ValueError(f"stateremat.paper.stats.bonferroni_level: need m >= 1 and 0 < family_alpha "
                         f"< 1, got m={m}, family_alpha={family_alpha}. Tip: count the "
                         "prespecified comparisons of the cohort.")
    return 1.0 - family_alpha / int(m)


@dataclass(frozen=True)
class RatioEstimate:
    """Geometric-mean ratio with a paired process-bootstrap interval.

    Attributes:
        point: geometric mean of the per-process ratios (NaN if no paired process).
        ci_low, ci_high: interval bounds (NaN when it cannot be computed: < 2 processes).
        confidence_level: per-interval level (after Bonferroni adjustment).
        n_processes: number of paired processes.
        n_resamples: bootstrap draws (0 when the interval is degenerate or not computed).
        degenerate: every process has the same ratio, so every draw gives the point:
            a point interval, which reflects identical observed values, not an absence of
            population uncertainty.
    """

    point: float
    ci_low: float
    ci_high: float
    confidence_level: float
    n_processes: int
    n_resamples: int
    degenerate: bool


def bootstrap_ratio(ratios: Sequence[float], *, confidence_level: float,
                    n_resamples: int = N_RESAMPLES, seed: int = 0,
                    method: str = "percentile") -> RatioEstimate:
    """Point estimate and bootstrap interval of the geometric mean of paired ratios.

    Args:
        ratios: per-process ratios (numerator/denominator within one process), positive.
        confidence_level: e.g. ``bonferroni_level(m)``.
        n_resamples: bootstrap draws (paper: 20,000).
        seed: seed of the resampling generator (recorded in the summary).
        method: ``scipy.stats.bootstrap`` method on the log ratios: ``"percentile"``
            (default; transformation-respecting, so the interval of ``exp(mean log r)`` is
            ``exp`` of the log interval) or ``"BCa"``.

    Returns:
        :class:`RatioEstimate`.

    Raises:
        ValueError: if a ratio is not finite and positive.

    Danger:
        With few processes (< ~10) percentile intervals under-cover; they are reported, but
        the number of processes is kept next to them.

    References:
        Paper §11: "20,000 paired-process bootstrap draws supply approximate 97.5 % intervals".
    """
    r = np.asarray(ratios, dtype=float)
    if r.size and not np.all(np.isfinite(r) & (r > 0)):
        raise ValueError(f"stateremat.paper.stats.bootstrap_ratio: ratios must be finite and > 0, got "
                         f"{r.tolist()}. Tip: infeasible methods have no time; leave them out.")
    n = int(r.size)
    if n == 0:
        return RatioEstimate(math.nan, math.nan, math.nan, confidence_level, 0, 0, False)
    logs = np.log(r)
    point = float(np.exp(logs.mean()))
    if n < 2:  # one process: no resampling distribution at all
        return RatioEstimate(point, math.nan, math.nan, confidence_level, n, 0, False)
    if np.ptp(logs) == 0.0:
        # Every resample has the same mean: the interval is the point (paper Table 8).
        return RatioEstimate(point, point, point, confidence_level, n, 0, True)
    res = _sps.bootstrap((logs,), np.mean, n_resamples=int(n_resamples),
                         confidence_level=confidence_level, method=method, vectorized=True,
                         rng=np.random.default_rng(seed))
    lo, hi = res.confidence_interval
    return RatioEstimate(point, float(np.exp(lo)), float(np.exp(hi)), confidence_level, n,
                         int(n_resamples), False)
