"""``summary.json`` of a bench run, recomputed from the raw rows only (DESIGN.md "Records").

Per cell and method: the policy, feasibility, measured peak (max over measured steps), mean and
median synchronized step time, whether the measured peak fits the logical budget, the semantic
check outcome, and the static model's predictions.
"""
from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from ..records.tables import BENCH_TABLE as TABLE  # its rows are declared there, below the bench
from ._spec import METHODS


def _num(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


def _int(v: Any) -> int | None:
    v = _num(v)
    return None if v is None else int(v)


def summarize(rows: pd.DataFrame) -> dict:
    """Recompute the run summary from raw rows.

    Args:
        rows: the ``bench`` records of one experiment (every method, step and cell).

    Returns:
        ``{"experiment", "preset", "budget_bytes", "cells": [{"cell", ..., "methods": [{"method",
        "policy", "feasible", "peak_bytes", "step_time_s", "step_time_median_s", "steps",
        "fits_budget", "semantic_checks", "predicted_peak_bytes", "predicted_time_s",
        "error"}]}]}``. ``step_time_s`` is the mean over measured steps (paper tables);
        infeasible methods have ``policy``/``peak_bytes``/``step_time_s`` null.

    Raises:
        ValueError: if ``rows`` is empty.
    """
    if rows.empty:
        raise ValueError("summarize: no rows. Tip: run `stateremat bench ... --out DIR` first.")
    first = rows.iloc[0]
    out = {"experiment": str(first["experiment"]), "preset": str(first["preset"]),
           "budget_bytes": int(first["budget_bytes"]), "memory_method": str(first["memory_method"]),
           "device": str(first["device"]), "cells": []}
    for cell, cdf in rows.groupby("cell", sort=False):
        c0 = cdf.iloc[0]
        entry = {"cell": cell, "workload": str(c0["workload"]), "state_bytes": int(c0["state_bytes"]),
                 "write_fraction": float(c0["write_fraction"]),
                 "live_versions": int(c0["live_versions"]), "width": int(c0["width"]),
                 "batch": int(c0["batch"]), "budget_bytes": int(c0["budget_bytes"]),
                 "budget_rule": str(c0["budget_rule"]) if "budget_rule" in c0.index else None,
                 "min_eager_whole_peak_bytes": _int(c0["min_eager_whole_peak_bytes"]),
                 "min_joint_peak_bytes": _int(c0["min_joint_peak_bytes"]),
                 "profile_hash": str(c0["profile_hash"]), "methods": []}
        if entry["budget_rule"] is None:  # rows of older runs do not record it (a fixed budget):
            del entry["budget_rule"]      # readers default to "fixed"; the summary keeps their shape
        present = list(dict.fromkeys(cdf["method"]))
        for m in [m for m in METHODS if m in present]:
            mdf = cdf[cdf["method"] == m]
            measured = mdf[(mdf["step"] >= 0)]
            times = pd.to_numeric(measured["step_time_s"], errors="coerce").dropna()
            peaks = pd.to_numeric(measured["peak_bytes"], errors="coerce").dropna()
            m0 = mdf.iloc[0]
            feasible = bool(m0["feasible"])
            peak = int(peaks.max()) if len(peaks) else None
            policy = m0["policy"]
            errors = sorted({e for e in mdf["error"].fillna("") if e})
            entry["methods"].append({
                "method": m,
                "policy": json.loads(policy) if isinstance(policy, str) and policy else None,
                "feasible": feasible,
                "peak_bytes": peak,
                "step_time_s": float(times.mean()) if len(times) else None,
                "step_time_median_s": float(times.median()) if len(times) else None,
                "steps": int(len(times)),
                "fits_budget": bool(peak is not None and peak <= int(c0["budget_bytes"])),
                "semantic_checks": "fail" if (mdf["semantic_checks"] == "fail").any() or errors
                else ("pass" if (mdf["semantic_checks"] == "pass").all() else "not_run"),
                "semantic_detail": str(m0["semantic_detail"] or ""),
                "predicted_peak_bytes": _int(m0["predicted_peak_bytes"]),
                "predicted_time_s": _num(m0["predicted_time_s"]),
                "error": "; ".join(errors),
            })
        out["cells"].append(entry)
    return out
