"""Per-process means and paired per-process ratios from raw timing rows (paper §11).

The independent unit is a process: nested steps inside one process do not add to the
sample size. Every method is summarised per process first, then methods are paired within
each process.
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pandas as pd

from ..records import RecordsError

#: Columns :func:`process_means` needs in the raw rows.
REQUIRED_COLUMNS = ("process", "cell", "method", "step", "step_time_s", "peak_bytes",
                    "fits_budget", "feasible")

#: Metric name -> column of :func:`process_means`' result.
METRICS = {"time": "mean_step_time_s", "peak": "peak_bytes"}


def process_means(rows: pd.DataFrame) -> pd.DataFrame:
    """Summarise raw timing rows to one row per (cell, process, method).

    Args:
        rows: raw rows, one per measured step, with columns ``process`` (int), ``cell``
            (str), ``method`` (str), ``step`` (int), ``step_time_s`` (float seconds, null
            for a method without a feasible policy), ``peak_bytes`` (int bytes),
            ``fits_budget`` (bool), ``feasible`` (bool).

    Returns:
        DataFrame with columns ``cell, process, method, feasible, n_errors`` (steps that
        raised), ``semantic_pass`` (every row's ``semantic_checks == "pass"``; True when the
        column is absent), ``n_steps``, ``mean_step_time_s`` (arithmetic mean over the measured steps; NaN when infeasible,
        never infinite), ``peak_bytes`` (maximum over steps) and ``fits_budget`` (every
        step within the logical budget; False when infeasible).

    Raises:
        RecordsError: if a required column is missing.

    References:
        Paper §11 ("Inference pairs methods within process").
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in rows.columns]
    if missing:
        raise RecordsError(f"stateremat.paper.stats.process_means: raw rows lack columns {missing}; "
                           f"got {sorted(rows.columns)}. Tip: pass the cohort's raw "
                           "'cohort_timing' rows (read_records(dir, 'cohort_timing')).")
    df = rows.copy()
    df["feasible"] = df["feasible"].astype(bool)
    # An infeasible method has no executed policy: its time is unknown, not infinite.
    df["step_time_s"] = pd.to_numeric(df["step_time_s"], errors="coerce").where(df["feasible"])
    df["peak_bytes"] = pd.to_numeric(df["peak_bytes"], errors="coerce").where(df["feasible"])
    df["fits_budget"] = df["fits_budget"].fillna(False).astype(bool) & df["feasible"]
    # A step that raised keeps its row (error text, no time); it is counted, not averaged.
    err = df["error"] if "error" in df else pd.Series("", index=df.index)
    df["_error"] = err.fillna("").astype(str).str.len() > 0
    checks = df["semantic_checks"] if "semantic_checks" in df else pd.Series("pass", index=df.index)
    df["_checks_pass"] = checks.fillna("").astype(str) == "pass"
    g = df.groupby(["cell", "process", "method"], sort=True)
    out = g.agg(feasible=("feasible", "all"),
                n_errors=("_error", "sum"),
                semantic_pass=("_checks_pass", "all"),
                n_steps=("step_time_s", "count"),
                mean_step_time_s=("step_time_s", "mean"),
                peak_bytes=("peak_bytes", "max"),
                fits_budget=("fits_budget", "all")).reset_index()
    return out


def paired_ratios(means: pd.DataFrame, cell: str, numerator: str, denominator: str,
                  metric: str = "time") -> pd.Series:
    """Per-process ratio ``numerator / denominator`` of one metric, paired within process.

    Args:
        means: output of :func:`process_means`.
        cell: experiment cell name.
        numerator, denominator: method names, e.g. ``"joint"`` and ``"eager_whole"``.
        metric: ``"time"`` (mean step seconds) or ``"peak"`` (peak bytes).

    Returns:
        Series of float ratios indexed by process, only for processes where both methods are
        feasible with a finite positive value (unpaired processes are dropped, never
        imputed). Empty if there are none.

    Raises:
        ValueError: on an unknown metric.
    """
    if metric not in METRICS:
        raise ValueError(f"stateremat.paper.stats.paired_ratios: metric must be one of "
                         f"{sorted(METRICS)}, got {metric!r}. Tip: use 'time' or 'peak'.")
    col = METRICS[metric]
    sub = means[means["cell"] == cell]
    a = sub[sub["method"] == numerator].set_index("process")[col].astype(float)
    b = sub[sub["method"] == denominator].set_index("process")[col].astype(float)
    both = pd.concat({"a": a, "b": b}, axis=1, join="inner").dropna()
    both = both[(both["a"] > 0) & (both["b"] > 0) & np.isfinite(both).all(axis=1)]
    return (both["a"] / both["b"]).rename(f"{numerator}/{denominator}").sort_index()


def geometric_mean(values: Iterable[float]) -> float:
    """Geometric mean ``exp(mean(log x))`` of positive values; NaN for an empty input.

    Raises:
        ValueError: if a value is not finite and positive.
    """
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return math.nan
    if not np.all(np.isfinite(x) & (x > 0)):
        raise ValueError(f"stateremat.paper.stats.geometric_mean: values must be finite and > 0, "
                         f"got {x.tolist()}. Tip: drop unpaired/infeasible processes first.")
    return float(np.exp(np.mean(np.log(x))))
