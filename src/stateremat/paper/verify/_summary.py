"""Summaries recomputed from stored raw rows (never from in-memory results of a run).

Summaries count distinct units: rows repeating a key (e.g. two runs that wrote the same
folder before the records table had a writer lock) are dropped, keeping the last written
(parts are read in name order, i.e. write order), so counts never exceed ``programs``.

References: paper §6 (finite suites), §7 and Table 3 (engines, joint alias).
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

from ..._shared.checks import MAX_SEED
from ...contract import Outcome
from ..limits import MAX_PROGRAMS, MAX_STUDY_SEEDS
from ..records import declare_table
from ..records import (below_config, config_value, implies, in_config, int_list, integer,
                       number, one_of)
from ._families import FAMILIES

#: The engines of the study (``reference.engines.ENGINES``; named here so readers need not
#: import them) and the joint-alias dims (``_study.ALIAS_DIMS``).
ENGINE_NAMES = ("eager", "guarded", "readset", "region", "whole")
ALIAS_DIMS = (32, 64)


FINITE_KEY = ("suite", "seed", "program", "check")
ENGINES_KEY = ("seed", "program", "check", "engine")
ALIAS_KEY = ("seed", "pattern", "dim", "check", "engine")

#: Row schemas of the three verify tables (names, types; key columns never null).
FINITE_COLUMNS = [
    ("suite", pa.string()), ("program", pa.int64()), ("check", pa.string()),
    ("seed", pa.int64()), ("program_seed", pa.string()), ("family", pa.string()),
    ("dims", pa.int64()), ("n_ops", pa.int64()), ("outcome", pa.string()),
    ("max_error", pa.float64()), ("coordinates", pa.int64()), ("detected", pa.bool_()),
    ("bytes_differing", pa.int64()), ("message", pa.string()), ("source_hash", pa.string()),
    ("segment_random_ops", pa.int64()),
]
ENGINES_COLUMNS = [
    ("family", pa.string()), ("dims", pa.int64()), ("n_ops", pa.int64()),
    ("n_segments", pa.int64()), ("state_bytes", pa.int64()), ("source_hash", pa.string()),
    ("coordinates", pa.int64()), ("max_error", pa.float64()), ("retained_bytes", pa.int64()),
    ("workspace_bytes", pa.int64()), ("repeat_ok", pa.bool_()),
    ("start_state_checked", pa.bool_()), ("structural_checks", pa.string()),
    ("message", pa.string()), ("seed", pa.int64()), ("program", pa.int64()),
    ("program_seed", pa.string()), ("check", pa.string()), ("engine", pa.string()),
    ("outcome", pa.string()),
]
ALIAS_COLUMNS = [
    ("family", pa.string()), ("n_ops", pa.int64()), ("n_segments", pa.int64()),
    ("state_bytes", pa.int64()), ("source_hash", pa.string()), ("coordinates", pa.int64()),
    ("max_error", pa.float64()), ("retained_bytes", pa.int64()),
    ("workspace_bytes", pa.int64()), ("repeat_ok", pa.bool_()),
    ("start_state_checked", pa.bool_()), ("structural_checks", pa.string()),
    ("message", pa.string()), ("seed", pa.int64()), ("pattern", pa.string()),
    ("dim", pa.int64()), ("program_seed", pa.string()), ("check", pa.string()),
    ("engine", pa.string()), ("outcome", pa.string()),
]
_OUTCOMES = one_of(*(str(o) for o in Outcome))
_SIZES = ("dims", "n_ops", "n_segments", "state_bytes", "coordinates", "retained_bytes",
          "workspace_bytes", "bytes_differing", "dim")


def _sizes(columns) -> dict:
    """Counts and byte sizes among ``columns``: finite and non-negative."""
    return {c: number(0) for c, _ in columns if c in _SIZES}


_CONTROLS = ("final_storage_control", "wrong_rng")


def _says_detected(df: pd.DataFrame):
    """Rows whose ``detected`` is given: a control check that ran (M or D), or any set."""
    ran = df["check"].isin(_CONTROLS) & df["outcome"].isin(("M", "D"))
    return (df["detected"].notna() | ran).to_numpy(dtype=bool)


def _detected_is_divergence(df: pd.DataFrame):
    det = df["detected"].astype("boolean")
    return (det.notna() & (det.fillna(False) == (df["outcome"] == "D"))).to_numpy(dtype=bool)


#: Value rules (checked on every read, against the run's sidecar config); a check that measures
#: no error (or a program outside the supported domain) writes NaN for it. A control's
#: ``detected`` is its outcome in other words (D: detected), so the two agree.
FINITE_VALUES = {
    "detected": implies("true where the outcome is D and false where it is M (a control that "
                        "ran says it)", _says_detected, _detected_is_divergence),
    **_sizes(FINITE_COLUMNS), "suite": one_of("derivative", "byte"), "family": one_of("derivative", "byte"),
    "check": one_of("scalar_output", "gradient", "final_storage_control", "complex_step",
                    "snapshot_replay", "region_undo", "wrong_rng"),
    "outcome": _OUTCOMES, "seed": config_value("seed"), "program": below_config("programs"),
    "max_error": number(0, missing={"check": ("snapshot_replay", "region_undo", "wrong_rng"),
                                    "outcome": ("unsupported",)}),
    "segment_random_ops": number(0, missing=True),
}
_STUDY_VALUES = {
    "family": one_of(*FAMILIES), "outcome": _OUTCOMES,
    "engine": one_of("", *ENGINE_NAMES),
    "max_error": number(0, missing={"check": ("stored_operations", "integer_write_gradient"),
                                    "outcome": ("unsupported",)}),
}
ENGINES_VALUES = {**_sizes(ENGINES_COLUMNS), **_STUDY_VALUES, "check": one_of("recovery", "complex_step"),
                  "seed": config_value("seed"), "program": below_config("programs")}
ALIAS_VALUES = {**_sizes(ALIAS_COLUMNS), **_STUDY_VALUES, "pattern": one_of(*FAMILIES), "dim": one_of(*ALIAS_DIMS),
                "check": one_of("recovery", "stored_operations", "integer_write_gradient"),
                "seed": in_config("seeds")}
#: Sidecar config fields, checked before a reader sizes its work from them.
PROGRAMS_CONFIG = {"programs": integer(1, MAX_PROGRAMS), "seed": integer(0, MAX_SEED)}
ALIAS_CONFIG = {"seeds": int_list(0, MAX_SEED, MAX_STUDY_SEEDS)}
declare_table("finite", FINITE_COLUMNS, FINITE_KEY, required=("outcome",),
              values=FINITE_VALUES, config=PROGRAMS_CONFIG)
declare_table("engines", ENGINES_COLUMNS, ENGINES_KEY, required=("outcome",),
              values=ENGINES_VALUES, config=PROGRAMS_CONFIG)
declare_table("alias", ALIAS_COLUMNS, ALIAS_KEY, required=("outcome",), values=ALIAS_VALUES,
              config=ALIAS_CONFIG)


def distinct(rows: pd.DataFrame, key) -> pd.DataFrame:
    """``rows`` without repeated keys, keeping the last row of each key (a defensive reader)."""
    if rows.empty:
        return rows
    return rows.drop_duplicates(subset=list(key), keep="last").reset_index(drop=True)


def _count(df: pd.DataFrame, check: str, outcome: str | None = None, detected: bool | None = None) -> int:
    sel = df[df["check"] == check]
    if outcome is not None:
        sel = sel[sel["outcome"] == outcome]
    if detected is not None:
        sel = sel[sel["detected"].astype("boolean").fillna(False) == detected]
    return int(len(sel))


def _max(df: pd.DataFrame, check: str) -> float:
    sel = df.loc[df["check"] == check, "max_error"]
    return float(sel.max()) if len(sel) else float("nan")


def summarise_finite(rows: pd.DataFrame) -> dict:
    """Summary of the finite suites from their raw rows (table ``finite``).

    Args:
        rows: every row written by ``stateremat verify finite`` (columns ``suite``,
            ``program``, ``check``, ``outcome``, ``max_error``, ``coordinates``, ``detected``).

    Returns:
        ``{"derivative_suite": {...}, "byte_suite": {...}, "complex_step": {...},
        "outcomes": {suite: {check: {outcome: count}}}}``.
    """
    rows = distinct(rows, FINITE_KEY)
    d = rows[rows["suite"] == "derivative"]
    b = rows[rows["suite"] == "byte"]
    cs = d[d["check"] == "complex_step"]
    outcomes: dict = {}
    for (suite, check, outcome), n in rows.groupby(["suite", "check", "outcome"]).size().items():
        outcomes.setdefault(suite, {}).setdefault(check, {})[outcome] = int(n)
    return {
        "derivative_suite": {
            "programs": int(d["program"].nunique()),
            "scalar_outputs_exact": _count(d, "scalar_output", "M"),
            "gradients_matched": _count(d, "gradient", "M"),
            "max_grad_error": _max(d, "gradient"),
            "final_storage_control_detected": _count(d, "final_storage_control", detected=True),
            "unsupported": int((d["outcome"] == "unsupported").sum()),
        },
        "byte_suite": {
            "programs": int(b["program"].nunique()),
            "snapshot_replay_match": _count(b, "snapshot_replay", "M"),
            "region_undo_match": _count(b, "region_undo", "M"),
            "wrong_rng_detected": _count(b, "wrong_rng", detected=True),
            # wrong-RNG programs whose replayed segment draws randomness (all, by construction)
            "wrong_rng_segments_drawing": int(
                (pd.to_numeric(b.loc[b["check"] == "wrong_rng", "segment_random_ops"]
                               if "segment_random_ops" in b else pd.Series(dtype=float),
                               errors="coerce") > 0).sum()),
            "wrong_rng_detected_by_state_only": int(
                b[(b["check"] == "wrong_rng") & (b["bytes_differing"] == 0)
                  & b["detected"].astype("boolean").fillna(False)].shape[0]),
        },
        "complex_step": {
            "programs": int(len(cs)),
            "coordinates": int(cs["coordinates"].sum()) if len(cs) else 0,
            "max_error": float(cs["max_error"].max()) if len(cs) else float("nan"),
            "matched": int((cs["outcome"] == "M").sum()),
        },
        "outcomes": outcomes,
    }


def summarise_engines(rows: pd.DataFrame) -> dict:
    """Summary of the semantic study from its raw rows (table ``engines``).

    Returns:
        programs, engines, recoveries checked/matched, max gradient error, complex step,
        total ``retained_bytes`` per engine (and per family), peak ``workspace_bytes`` per
        engine, outcome counts, and the queue family's region/whole retained-bytes ratio.
    """
    rows = distinct(rows, ENGINES_KEY)
    rec = rows[rows["check"] == "recovery"]
    cs = rows[rows["check"] == "complex_step"]
    engines = list(dict.fromkeys(rec["engine"]))
    by_family = {f: {e: int(v) for e, v in g.groupby("engine", sort=False)["retained_bytes"].sum().items()}
                 for f, g in rec.groupby("family")}
    q = by_family.get("queue", {})
    return {
        "programs": int(rows["program"].nunique()),
        "engines": engines,
        "recoveries_checked": int(len(rec)),
        "recoveries_matched": int((rec["outcome"] == "M").sum()),
        "unsupported": int((rec["outcome"] == "unsupported").sum()),
        "max_grad_error": float(rec["max_error"].max()) if len(rec) else float("nan"),
        "complex_step": {
            "programs": int(len(cs)),
            "coordinates": int(cs["coordinates"].sum()) if len(cs) else 0,
            "max_error": float(cs["max_error"].max()) if len(cs) else float("nan"),
            "matched": int((cs["outcome"] == "M").sum()),
        },
        "retained_bytes": {e: int(rec.loc[rec["engine"] == e, "retained_bytes"].sum()) for e in engines},
        "retained_bytes_by_family": by_family,
        "queue_region_over_whole_retained": (q["region"] / q["whole"]) if q.get("whole") else None,
        "workspace_bytes_max": {e: int(rec.loc[rec["engine"] == e, "workspace_bytes"].max())
                                for e in engines},
        "outcomes": {e: {str(o): int(n) for o, n in g["outcome"].value_counts().items()}
                     for e, g in rec.groupby("engine", sort=False)},
        "structural_checks": _structural(rec),
    }


def _structural(rec: pd.DataFrame) -> dict:
    """Per engine, the checks that were structural (equal by construction) on some row."""
    if "structural_checks" not in rec:
        return {}
    out = {}
    for e, g in rec.groupby("engine", sort=False):
        out[e] = sorted({c for v in g["structural_checks"].dropna() for c in str(v).split(",") if c})
    return out


def summarise_alias(rows: pd.DataFrame) -> dict:
    """Summary of the joint-alias study from its raw rows (table ``alias``)."""
    rows = distinct(rows, ALIAS_KEY)
    rec = rows[rows["check"] == "recovery"]
    ops = rows[rows["check"] == "stored_operations"]
    iw = rows[rows["check"] == "integer_write_gradient"]
    inputs = rows[["seed", "pattern", "dim"]].drop_duplicates()
    return {
        "inputs": int(len(inputs)),
        "supported_recoveries": int((rec["outcome"] != "unsupported").sum()),
        "matched": int((rec["outcome"] == "M").sum()),
        "unsupported": int((iw["outcome"] == "unsupported").sum()),
        "integer_writes_not_refused": int((iw["outcome"] != "unsupported").sum()),
        "max_grad_error": float(rec["max_error"].max()) if len(rec) else float("nan"),
        "stored_operations": int(ops["coordinates"].sum()),
        "stored_operations_consistent": int((ops["outcome"] == "M").sum()),
        "patterns": sorted(rows["pattern"].unique().tolist()),
        "dims": sorted(int(d) for d in rows["dim"].unique()),
        "retained_bytes": {e: int(g["retained_bytes"].sum()) for e, g in rec.groupby("engine", sort=False)},
        "structural_checks": _structural(rec),
    }
