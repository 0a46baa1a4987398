"""Summary of the replay-semantics cohort, recomputed from the raw rows only.

Separate from the runner on purpose (DESIGN.md, "Records"): every count here is derived
from the Parquet rows, so a summary can be regenerated and audited at any time.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..records import RecordsError
from ..records import read_records

#: Row order and labels of the paper's Table 2 (backend, method) -> label.
TABLE_ORDER: dict[tuple[str, str], str] = {
    ("torch", "functional_reference"): "Torch functional reference",
    ("torch", "native_eager"): "Torch native eager",
    ("torch", "reentrant"): "Torch reentrant",
    ("torch", "nonreentrant"): "Torch nonreentrant",
    ("torch", "reentrant_rng_unpreserved"): "Torch reentrant, RNG unpreserved",
    ("torch", "nonreentrant_rng_unpreserved"): "Torch nonreentrant, RNG unpreserved",
    ("torch", "stateremat_transactional"): "Torch transactional nonreentrant (stateremat)",
    ("jax", "functional_reference"): "JAX functional reference",
    ("jax", "functional_checkpoint"): "JAX functional checkpoint",
    ("jax", "native_inplace_eager"): "JAX native in-place eager",
    ("jax", "native_inplace_checkpoint"): "JAX native in-place checkpoint",
    ("jax", "impure_holder_eager"): "JAX impure-holder eager",
    ("jax", "impure_holder_checkpoint"): "JAX impure-holder checkpoint",
    ("jax", "stateremat_jax_checkpoint"): "JAX stateremat.jax.checkpoint (extension)",
}
_OUTCOMES = ("M", "R", "D")


def _counts(df: pd.DataFrame, by: list[str]) -> list[dict]:
    if df.empty:
        return []
    rank = {k: i for i, k in enumerate(TABLE_ORDER)}
    out = []
    for key, g in df.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        vc = g["outcome"].value_counts()
        row.update({o: int(vc.get(o, 0)) for o in _OUTCOMES})
        other = int(len(g) - sum(row[o] for o in _OUTCOMES))
        if other:
            row["unsupported"] = other
        out.append(row)
    out.sort(key=lambda r: (rank.get((r["backend"], r["method"]), len(rank)),
                            r["backend"], r["method"], r.get("family", "")))
    return out


def summarize_frame(df: pd.DataFrame) -> dict:
    """Counts of outcomes per (backend, method), and per family, from raw rows ``df``."""
    if not df.empty:
        dup = df.duplicated(["backend", "method", "family", "seed", "dtype"]).sum()
        if dup:
            raise RecordsError(f"stateremat semantics summary: {dup} duplicated rows (same "
                               "backend, method, family, seed, dtype); expected none. Tip: "
                               "a run folder was written by two runs at once; rerun into a "
                               "new --out.")
    return {
        "records": int(len(df)),
        "table": _counts(df, ["backend", "method"]),
        "by_family": _counts(df, ["backend", "method", "family"]),
    }


def summarize_semantics(out_dir: str | Path) -> dict:
    """Summary of a cohort run folder, recomputed from its raw rows.

    Returns:
        ``{"records": n, "table": [{"backend", "method", "M", "R", "D"}, ...],
        "by_family": [...], "extension": {...same for stateremat.jax.checkpoint rows...}}``
        (an ``"unsupported"`` count appears only where such rows exist).

    Raises:
        RecordsError: the rows contain duplicated keys, or a part is unreadable.
    """
    from ._runner import EXTENSION_TABLE, SEMANTICS_TABLE

    summary = summarize_frame(read_records(out_dir, SEMANTICS_TABLE))
    summary["extension"] = summarize_frame(read_records(out_dir, EXTENSION_TABLE))
    return summary
