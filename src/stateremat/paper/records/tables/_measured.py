"""Value rules of a measured step row, shared by the ``bench`` and ``cohort_timing`` tables.

Torch-free (the tables are declared where readers need no torch). A step that did not run (an
infeasible method's ``step = -1`` row, or a step that raised: ``error`` set) has no time or
peak; every other step has both, finite and non-negative.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from .._values import Rule, all_of, implies, marker_alone, number, one_of, set_text, step_index

_UNMEASURED = {"step": (-1,), "error": set_text}

#: column -> rule, for the columns both tables share.
MEASURED_VALUES = {
    "step": number(-1), "step_time_s": number(0, missing=_UNMEASURED),
    "peak_bytes": number(0, missing=_UNMEASURED),
    "predicted_peak_bytes": number(0, missing=True), "predicted_time_s": number(0, missing=True),
    "min_eager_whole_peak_bytes": number(0, missing=True),
    "min_joint_peak_bytes": number(0, missing=True),
    "semantic_checks": one_of("not_run", "pass", "fail"),
    "semantic_max_error": number(0, missing=True),
    **{c: number(0, missing=True) for c in ("state_bytes", "live_versions", "segments", "width",
                                             "batch", "granularity_bytes")},
    "write_fraction": number(0, 1, missing=True), "dropout": number(0, 1, missing=True),
}


def _policy_fits(df: pd.DataFrame) -> np.ndarray:
    """Rows whose policy (a JSON list, one choice per segment) has one choice per segment
    (true where either is not given)."""
    if "segments" not in df.columns:
        return np.ones(len(df), dtype=bool)
    ok = []
    for p, n in zip(df["policy"], df["segments"]):
        if not isinstance(p, str) or not p or pd.isna(n):
            ok.append(True)
            continue
        try:
            choices = json.loads(p)
        except ValueError:
            ok.append(False)
            continue
        ok.append(isinstance(choices, list) and len(choices) == int(n))
    return np.asarray(ok, dtype=bool)


def _text(df: pd.DataFrame, c: str) -> pd.Series:
    return df[c].fillna("").astype(str) if c in df.columns else pd.Series([""] * len(df))


#: The semantic checks' tolerance per dtype (max relative error; the bench's checks use it):
#: a method whose checks pass has no larger error in any dtype.
SEMANTIC_RTOL = {"float32": 1e-5, "float64": 1e-12}
_LOADAVG = r"\d+\.\d+ \d+\.\d+ \d+\.\d+ \d+/\d+ \d+|unavailable"


def _num(df: pd.DataFrame, c: str) -> pd.Series:
    """Column ``c`` as floats (all NaN where the rows do not give it)."""
    if c not in df.columns:
        return pd.Series(np.nan, index=df.index, dtype="float64")
    return pd.to_numeric(df[c], errors="coerce").astype("float64")


def _fits_agrees(df: pd.DataFrame) -> np.ndarray:
    """Rows whose fits_budget says whether peak_bytes is at most budget_bytes (true where the
    rows give no budget: nothing to compare)."""
    if "budget_bytes" not in df.columns or "peak_bytes" not in df.columns:
        return np.ones(len(df), dtype=bool)
    peak, budget = _num(df, "peak_bytes"), _num(df, "budget_bytes")
    fits = (peak.notna() & (peak <= budget)).to_numpy(dtype=bool)
    return df["fits_budget"].fillna(False).astype(bool).to_numpy(dtype=bool) == fits


#: Rules across a row's columns, for both tables.
ROW_RULES = {
    "fits_budget": implies(
        "true exactly where the row's peak_bytes is at most its budget_bytes", lambda df: True,
        _fits_agrees),
    "error": implies("empty in a row that has a step time (a step that raised has none)",
                     lambda df: (_text(df, "error") != "").to_numpy(),
                     lambda df: _num(df, "step_time_s").isna().to_numpy()),
    "loadavg": implies("the machine's /proc/loadavg line (or 'unavailable')",
                       lambda df: df["loadavg"].notna().to_numpy(dtype=bool),
                       lambda df: _text(df, "loadavg").str.fullmatch(_LOADAVG).to_numpy(dtype=bool)),
    "semantic_max_error": implies(
        f"at most {max(SEMANTIC_RTOL.values()):g} (the checks' tolerance) where semantic_checks "
        "is 'pass'", lambda df: (_text(df, "semantic_checks") == "pass").to_numpy(),
        lambda df: (_num(df, "semantic_max_error") <= max(SEMANTIC_RTOL.values())).to_numpy()),
    # (a row that raised keeps the policy it was given: a plan for another card is what raised)
    "policy": implies("a JSON list with one choice per segment, in a row that did not raise",
                      lambda df: (_text(df, "error") == "").to_numpy(), _policy_fits),
    "memory_method": implies(
        "a cuda_* method only on a cuda device",
        lambda df: _text(df, "memory_method").str.startswith("cuda").to_numpy(),
        lambda df: _text(df, "device").str.startswith("cuda").to_numpy()),
    "feasible": implies("true in a row that measured a step (step >= 0)",
                        lambda df: (_num(df, "step") >= 0).to_numpy(dtype=bool),
                        lambda df: df["feasible"].fillna(False).astype(bool).to_numpy()),
}
#: Columns one value for all rows of a method in a cell (its plan and semantic checks) ...
METHOD_CONSTANT = ("method", "feasible", "policy", "predicted_peak_bytes", "predicted_time_s",
                   "semantic_checks", "semantic_max_error", "semantic_detail")
#: ... of a cell (its budget, profile, workload), and of a run (where it was measured).
CELL_CONSTANT = ("experiment", "preset", "budget_bytes", "budget_rule", "profile_hash",
                 "source_hash", "memory_method", "device", "dtype", "min_eager_whole_peak_bytes",
                 "min_joint_peak_bytes", "workload", "state_bytes", "write_fraction",
                 "live_versions", "segments", "width", "batch", "granularity_bytes", "dropout",
                 "seed")
RUN_CONSTANT = ("memory_method", "device")


def step_rule(by: tuple[str, ...], cell: str | None = None) -> Rule:
    """A measured row's step: ``-1`` (an infeasible method's one row, nothing measured) or in
    ``[0, steps)`` of the run's config (with ``cell``: of the row's cell's config entry)."""
    return all_of(number(-1), step_index("steps", by=cell),
                  marker_alone(-1, by=by, flag="feasible"))
