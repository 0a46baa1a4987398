"""Summaries recomputed from stored raw rows (never from in-memory results of a run).

Summaries count distinct units: rows repeating a key (e.g. two runs that wrote the same
folder before the records table had a writer lock) are dropped, keeping the last written
(parts are read in name order, i.e. write order), so counts never exceed ``programs``.

References: paper §6 (finite suites), §7 and Table 3 (engines, joint alias).
"""
from __future__ import annotations

import pandas as pd

from ..records import table_spec

#: The three tables' keys (their rows are declared in ``records.tables``, below this wing).
FINITE_KEY, ENGINES_KEY, ALIAS_KEY = (table_spec(t).key for t in ("finite", "engines", "alias"))


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
