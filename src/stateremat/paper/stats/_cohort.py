"""Cohort summaries: per-method table (paper Table 7) and prespecified comparisons (Table 8)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ._bootstrap import N_RESAMPLES, bonferroni_level, bootstrap_ratio
from ._ratios import METRICS, paired_ratios, process_means


@dataclass(frozen=True)
class Comparison:
    """One prespecified paired comparison ``numerator / denominator`` within a cell.

    Attributes:
        cell: experiment cell the two methods ran in.
        numerator, denominator: method names.
        primary: metrics (``"time"``, ``"peak"``) of this comparison that belong to the
            cohort's prespecified family (they set the Bonferroni count ``m``); the other
            metric is still estimated, at the same level, as a secondary result.
    """

    cell: str
    numerator: str
    denominator: str
    primary: tuple[str, ...] = ("time", "peak")

    @property
    def name(self) -> str:
        """``"numerator/denominator"``, e.g. ``"joint/eager_whole"``."""
        return f"{self.numerator}/{self.denominator}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (inverse of :meth:`from_dict`)."""
        d = asdict(self)
        d["primary"] = list(self.primary)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Comparison":
        """Rebuild from :meth:`to_dict` output (e.g. a cohort sidecar)."""
        return cls(str(d["cell"]), str(d["numerator"]), str(d["denominator"]),
                   tuple(d.get("primary", ("time", "peak"))))


def family_size(comparisons: Sequence[Comparison]) -> int:
    """Number of prespecified (comparison, metric) pairs: the Bonferroni ``m``."""
    return max(1, sum(len(c.primary) for c in comparisons))


def method_table(rows: pd.DataFrame, budget_bytes: Mapping[str, int] | None = None) -> list[dict]:
    """Table 7-style per-method summary of every cell, from raw rows.

    Args:
        rows: raw timing rows (see :func:`process_means`).
        budget_bytes: logical budget per cell (bytes), written next to each row.

    Returns:
        One dict per (cell, method): ``cell, method, n_processes, n_feasible,
        mean_step_time_s`` (arithmetic mean of the per-process means; None when the method
        has no feasible policy — never infinite), ``min_step_time_s``/``max_step_time_s``
        (range of process means), ``peak_bytes`` (mean of per-process peaks),
        ``peak_bytes_min``/``peak_bytes_max``, ``fits`` (processes whose every step is
        within the logical budget; exceeding it is *over budget*, not an OOM),
        ``semantic_pass`` (processes whose checks passed), ``n_errors`` (steps that raised),
        ``budget_bytes``.
    """
    means = process_means(rows)
    out = []
    for (cell, method), g in means.groupby(["cell", "method"], sort=False):
        feas = g[g["feasible"]]
        t = feas["mean_step_time_s"].dropna()
        p = feas["peak_bytes"].dropna()
        out.append({
            "cell": cell, "method": method, "n_processes": int(g["process"].nunique()),
            "n_feasible": int(feas["process"].nunique()),
            "mean_step_time_s": float(t.mean()) if len(t) else None,
            "min_step_time_s": float(t.min()) if len(t) else None,
            "max_step_time_s": float(t.max()) if len(t) else None,
            "peak_bytes": float(p.mean()) if len(p) else None,
            "peak_bytes_min": int(p.min()) if len(p) else None,
            "peak_bytes_max": int(p.max()) if len(p) else None,
            "fits": int(g["fits_budget"].sum()),
            "semantic_pass": int(g["semantic_pass"].sum()),
            "n_errors": int(g["n_errors"].sum()),
            "budget_bytes": int(budget_bytes[cell]) if budget_bytes and cell in budget_bytes
            else None,
        })
    return out


def compare(rows: pd.DataFrame, comparisons: Sequence[Comparison], *, seed: int = 0,
            n_resamples: int = N_RESAMPLES, method: str = "percentile") -> list[dict]:
    """Estimate every prespecified comparison with Bonferroni-adjusted bootstrap intervals.

    Args:
        rows: raw timing rows (see :func:`process_means`).
        comparisons: the cohort's prespecified comparisons (frozen before measurement).
        seed: bootstrap seed; comparison ``i`` and metric ``j`` use ``seed + 2*i + j``.
        n_resamples: bootstrap draws per interval (paper: 20,000).
        method: ``scipy.stats.bootstrap`` method (``"percentile"`` or ``"BCa"``).

    Returns:
        One dict per comparison: ``comparison`` (``"joint/eager_whole"``), ``cell``,
        ``time_ratio`` (geometric mean of process ratios), ``ci`` ([lo, hi] of the time
        ratio), ``peak_ratio``, ``peak_ci``, ``fits`` ({method: processes within budget}),
        ``n_processes`` (paired, feasible), ``confidence_level``, ``primary`` metrics,
        ``point_interval`` ({metric: bool}, identical observed values), ``n_resamples``,
        ``note`` (why a ratio is missing, e.g. a method without a feasible policy).
        Ratios are None (JSON null) when a method has no feasible policy in any process.

    References:
        Paper §11, Table 8.
    """
    means = process_means(rows)
    level = bonferroni_level(family_size(comparisons))
    out = []
    for i, c in enumerate(comparisons):
        entry: dict[str, Any] = {"comparison": c.name, "cell": c.cell}
        pts: dict[str, Any] = {}
        for j, metric in enumerate(METRICS):
            r = paired_ratios(means, c.cell, c.numerator, c.denominator, metric)
            est = bootstrap_ratio(r.to_numpy(), confidence_level=level, seed=seed + 2 * i + j,
                                  n_resamples=n_resamples, method=method)
            pts[metric] = est
        sub = means[means["cell"] == c.cell]
        fits = {m: int(sub[sub["method"] == m]["fits_budget"].sum())
                for m in (c.numerator, c.denominator)}
        infeasible = [m for m in (c.numerator, c.denominator)
                      if not sub[(sub["method"] == m) & sub["feasible"]].shape[0]]
        note = ""
        if infeasible:  # never an infinite time: the ratio does not exist
            note = (f"{', '.join(infeasible)}: no feasible policy under the logical budget "
                    "(static model) in any process; no measured ratio")
        entry.update({
            "note": note,
            "time_ratio": _num(pts["time"].point),
            "ci": [_num(pts["time"].ci_low), _num(pts["time"].ci_high)],
            "peak_ratio": _num(pts["peak"].point),
            "peak_ci": [_num(pts["peak"].ci_low), _num(pts["peak"].ci_high)],
            "fits": fits,
            "n_processes": pts["time"].n_processes,
            "n_processes_peak": pts["peak"].n_processes,
            "confidence_level": level,
            "primary": list(c.primary),
            "point_interval": {m: pts[m].degenerate for m in METRICS},
            "n_resamples": {m: pts[m].n_resamples for m in METRICS},
        })
        out.append(entry)
    return out


def _num(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def comparisons_from(records: Iterable[Mapping[str, Any]]) -> list[Comparison]:
    """Rebuild a list of :class:`Comparison` from dicts (e.g. a sidecar's config)."""
    return [Comparison.from_dict(d) for d in records]
