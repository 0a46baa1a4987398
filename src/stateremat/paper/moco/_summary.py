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

from ..._shared.io import atomic_write_json
from ..records import read_records, read_sidecar, refuse_units_outside, table_spec
from ..records.tables import MOCO_METHODS as METHODS, MOCO_TABLE as TABLE

__all__ = ["KEY", "METHODS", "TABLE", "failed_runs", "score_file_problem", "summarize",
           "write_summary"]

#: The moco table's key. Its rows and the seven methods of paper §12 (in Table 9's row order)
#: are declared in ``records.tables``, below this wing (torch-free, so importing is cheap).
KEY = table_spec(TABLE).key


#: The columns naming one unit of a moco run (one encoder trained).
UNIT = ("seed", "method")


def launch_units(doc: dict) -> set[tuple[int, str]] | None:
    """Every ``(seed, method)`` some launch of the run asked for (the sidecar document's
    ``launches``); None for runs written before launches were recorded."""
    launches = doc.get("launches")
    if not launches:
        return None
    return {(int(s), m) for ln in launches for s in ln["seeds"] for m in ln["methods"]}


def refuse_foreign_rows(out_dir: str | os.PathLike) -> None:
    """Before a resume: refuse rows of a ``(seed, method)`` no launch of the run asked for (a
    resume would keep them for good; ``report`` refuses to count them the same way).

    Raises:
        RecordsError: naming the first part holding such rows.
    """
    sidecar = Path(out_dir) / f"{TABLE}.json"
    if sidecar.is_file():
        refuse_units_outside(out_dir, TABLE, UNIT, launch_units(read_sidecar(sidecar)), "(seed, method)")


def _latest_rows(out_dir: Path):
    """The latest raw row per ``(seed, method)``, a finished row over a failed one, in
    Table 9's method order (empty frame when there are no rows)."""
    df = read_records(out_dir, TABLE)
    if df.empty:
        return df
    df = df.assign(_ok=(df["outcome"] == "ok").astype(int), _order=range(len(df)))
    df = df.sort_values(["_ok", "_order"]).groupby(list(KEY), as_index=False).tail(1)
    order = {m: i for i, m in enumerate(METHODS)}
    return df.assign(_m=df["method"].map(order)).sort_values(["seed", "_m"])


def score_file_problem(out_dir: str | os.PathLike, row: Any) -> str | None:
    """What is wrong with the score file of a finished row, or None when it matches its hash.

    Args:
        out_dir: run folder.
        row: a finished ``moco`` row (``scores_file``, ``scores_sha256``).

    Returns:
        ``"<file> is missing"``, ``"<file> differs from its row's hash"`` (the file changed, or
        is not the scores this row wrote), or None.
    """
    name = str(row["scores_file"])
    f = Path(out_dir) / name
    if not f.is_file():
        return f"score file {name} is missing"
    try:
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
    except OSError as exc:
        return f"score file {name} cannot be read ({exc.strerror or exc})"
    if sha != row["scores_sha256"]:
        return f"score file {name} differs from its row's hash"
    return None


def summarize(out_dir: str | os.PathLike) -> dict[str, Any]:
    """Recompute the summary from the raw rows and the score files (never from memory).

    ``scores_sha256`` is re-hashed from each score file on disk; a file missing or differing from
    its row's hash is a *score file mismatch*: its ``scores_sha256`` is None and its ``status``
    says so (``"ok"``, ``"failed"`` or ``"score file mismatch"``).

    ``identical_within_seed`` is three-valued, because a subset of methods cannot show identity
    across the seven: ``False`` if any seed has a failed run or two distinct hashes among its
    intact score files; else ``None`` (JSON null) unless every seed has all seven methods
    recorded with intact score files (a missing or changed file is a storage problem, not a
    result: identity is then not assessed); else ``True`` — all over the seeds every method
    ran (:func:`shared_seeds`; when some method ran seeds others lack, ``seeds_compared`` lists
    the shared seeds and ``not_compared`` maps each such method to the seeds left out).
    ``methods_compared`` maps each seed (as a string) to the number of
    methods whose hashes were compared (finished, file matching its row).

    Returns:
        ``{"dataset", "seeds", "methods": [{"method", "seed", "peak_bytes", "encoder_time_s",
        "test_accuracy", "test_cross_entropy", "scores_sha256", "policy", "status"}],
        "identical_within_seed": true|false|null, "methods_compared": {seed: count}}``, plus
        ``"seeds_compared"`` and ``"not_compared": {method: [seed]}`` when coverage is uneven.

    References:
        Paper §12, Table 9: byte-identical test scores across the seven methods of one seed.
    """
    out_dir = Path(out_dir)
    df = _latest_rows(out_dir)
    if df.empty:
        return {"dataset": None, "seeds": [], "methods": [], "identical_within_seed": None,
                "methods_compared": {}}
    entries = []
    for _, r in df.iterrows():
        sha, status = None, "failed"
        if r["outcome"] == "ok":
            bad = score_file_problem(out_dir, r)
            status = "ok" if bad is None else "score file mismatch"
            sha = r["scores_sha256"] if bad is None else None
        entries.append({"method": r["method"], "seed": int(r["seed"]),
                        "peak_bytes": _num(r.get("peak_bytes"), int),
                        "encoder_time_s": _num(r.get("encoder_time_s"), float),
                        "test_accuracy": _num(r.get("test_accuracy"), float),
                        "test_cross_entropy": _num(r.get("test_cross_entropy"), float),
                        "scores_sha256": sha,
                        "policy": (json.loads(r["policy"]) if isinstance(r.get("policy"), str)
                                   else None),
                        "status": status})
    seeds = sorted({e["seed"] for e in entries})
    shared, outside = shared_seeds(entries)
    broken, complete, compared = False, bool(shared), {}
    for s in seeds:
        es = [e for e in entries if e["seed"] == s]
        compared[str(s)] = sum(e["status"] == "ok" for e in es)
        if s not in shared:
            continue   # not every method ran it: outside the comparison
        hashes = {e["scores_sha256"] for e in es if e["status"] == "ok"}
        broken |= any(e["status"] == "failed" for e in es) or len(hashes) > 1
        complete &= {e["method"] for e in es if e["status"] != "score file mismatch"} == set(METHODS)
    identical = False if broken else (True if complete else None)
    datasets = sorted(set(df["dataset"].dropna()))
    out = {"dataset": datasets[0] if len(datasets) == 1 else datasets, "seeds": seeds,
           "methods": entries, "identical_within_seed": identical, "methods_compared": compared}
    if outside:   # uneven coverage: say which seeds the comparison is over, and what is left out
        out["seeds_compared"] = shared
        out["not_compared"] = outside
    return out


def shared_seeds(entries: list[dict[str, Any]]) -> tuple[list[int], dict[str, list[int]]]:
    """The seeds every method with rows ran, and per method the seeds it ran outside them.

    Methods are compared over the seeds they all share (a launch with ``--methods eager`` for a
    new seed adds an eager row only: that seed is left out of every mean and of the identity
    check, and named).

    Returns:
        ``(shared seeds, {method: [seeds outside the shared set]})`` (methods with none left out
        are omitted), in Table 9's method order.
    """
    by_method: dict[str, set[int]] = {}
    for e in entries:
        by_method.setdefault(e["method"], set()).add(e["seed"])
    shared = set.intersection(*by_method.values()) if by_method else set()
    order = {m: i for i, m in enumerate(METHODS)}
    outside = {m: sorted(ss - shared) for m, ss in sorted(by_method.items(),
                                                         key=lambda kv: order.get(kv[0], 99))
               if ss - shared}
    return sorted(shared), outside


def failed_runs(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The latest row of every ``(seed, method)`` that did not finish, from the raw rows.

    Returns:
        ``[{"seed", "method", "error_type", "error"}]`` in Table 9's order (``error`` in full).
    """
    df = _latest_rows(Path(out_dir))
    if df.empty:
        return []
    bad = df[df["outcome"] != "ok"]
    return [{"seed": int(r["seed"]), "method": r["method"], "error_type": r.get("error_type"),
             "error": r.get("error")} for _, r in bad.iterrows()]


def _num(v: Any, kind: type) -> Any:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return kind(v)


def write_summary(out_dir: str | os.PathLike,
                  dest: str | os.PathLike | None = None) -> dict[str, Any]:
    """:func:`summarize` and write it atomically to ``dest/summary.json`` (default ``out_dir``)."""
    summary = summarize(out_dir)
    atomic_write_json(Path(dest or out_dir) / "summary.json", summary)
    return summary
