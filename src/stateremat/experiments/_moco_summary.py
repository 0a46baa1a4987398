"""Summary of a dense-queue run, recomputed from the raw ``moco`` rows and the score files.

Separate from the runner on purpose (DESIGN.md, "Records"): nothing here sees the running
process's memory, only what is on disk.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import atomic_write_json, read_records

__all__ = ["KEY", "METHODS", "TABLE", "summarize", "write_summary"]

TABLE = "moco"
KEY = ("seed", "method")
#: The seven methods of paper §12, in Table 9's row order (torch-free, so importing is cheap).
METHODS = ("eager", "whole", "regions", "functional", "deferred", "state_agnostic", "joint")


def summarize(out_dir: str | os.PathLike) -> dict[str, Any]:
    """Recompute the summary from the raw rows and the score files (never from memory).

    ``scores_sha256`` is re-hashed from each score file on disk; a file missing or differing from
    its row's hash counts as a mismatch. ``identical_within_seed`` is true only if every seed has
    all its recorded methods finished and one single hash among them.

    Returns:
        ``{"dataset", "seeds", "methods": [{"method", "seed", "peak_bytes", "encoder_time_s",
        "test_accuracy", "test_cross_entropy", "scores_sha256", "policy"}], "identical_within_seed"}``.
    """
    out_dir = Path(out_dir)
    df = read_records(out_dir, TABLE)
    if df.empty:
        return {"dataset": None, "seeds": [], "methods": [], "identical_within_seed": False}
    # latest row per key, a finished row over a failed one
    df = df.assign(_ok=(df["outcome"] == "ok").astype(int), _order=range(len(df)))
    df = df.sort_values(["_ok", "_order"]).groupby(list(KEY), as_index=False).tail(1)
    order = {m: i for i, m in enumerate(METHODS)}
    df = df.assign(_m=df["method"].map(order)).sort_values(["seed", "_m"])
    entries, identical = [], True
    for _, r in df.iterrows():
        sha = None
        if r["outcome"] == "ok":
            f = out_dir / str(r["scores_file"])
            sha = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else None
            if sha != r["scores_sha256"]:
                sha = None
        entries.append({"method": r["method"], "seed": int(r["seed"]),
                        "peak_bytes": _num(r.get("peak_bytes"), int),
                        "encoder_time_s": _num(r.get("encoder_time_s"), float),
                        "test_accuracy": _num(r.get("test_accuracy"), float),
                        "test_cross_entropy": _num(r.get("test_cross_entropy"), float),
                        "scores_sha256": sha,
                        "policy": json.loads(r["policy"]) if isinstance(r.get("policy"), str) else None})
    seeds = sorted({e["seed"] for e in entries})
    for s in seeds:
        hashes = [e["scores_sha256"] for e in entries if e["seed"] == s]
        identical &= None not in hashes and len(set(hashes)) == 1
    datasets = sorted(set(df["dataset"].dropna()))
    return {"dataset": datasets[0] if len(datasets) == 1 else datasets, "seeds": seeds,
            "methods": entries, "identical_within_seed": bool(identical)}


def _num(v: Any, kind: type) -> Any:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return kind(v)


def write_summary(out_dir: str | os.PathLike) -> dict[str, Any]:
    """:func:`summarize` and write it atomically to ``out_dir/summary.json``."""
    summary = summarize(out_dir)
    atomic_write_json(Path(out_dir) / "summary.json", summary)
    return summary
