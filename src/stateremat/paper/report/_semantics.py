"""Table 2-style markdown for the Torch/JAX replay-semantics cohort, from raw rows only."""
from __future__ import annotations

from pathlib import Path

from ..._shared.io import atomic_write_bytes
from ..records import read_records
from ._registry import Expected, register_reporter

#: The paper's Table 2 (torch 2.8.0+cu126 on H100), quoted for side-by-side comparison only.
PAPER_TABLE2: dict[tuple[str, str], tuple[int, int, int]] = {
    ("torch", "functional_reference"): (500, 0, 0),
    ("torch", "native_eager"): (400, 100, 0),
    ("torch", "reentrant"): (200, 100, 200),
    ("torch", "nonreentrant"): (200, 100, 200),
    ("torch", "reentrant_rng_unpreserved"): (0, 100, 400),
    ("torch", "nonreentrant_rng_unpreserved"): (0, 100, 400),
    ("torch", "stateremat_transactional"): (400, 100, 0),
    ("jax", "functional_reference"): (500, 0, 0),
    ("jax", "functional_checkpoint"): (500, 0, 0),
    ("jax", "native_inplace_eager"): (0, 500, 0),
    ("jax", "native_inplace_checkpoint"): (0, 500, 0),
    ("jax", "impure_holder_eager"): (200, 0, 0),
    ("jax", "impure_holder_checkpoint"): (0, 200, 0),
}


def _markdown(title: str, summary: dict, with_paper: bool) -> str:
    from ..semantics import TABLE_ORDER

    head = "| Backend / execution | M | R | D |" + (" paper M | paper R | paper D |"
                                                    if with_paper else "")
    sep = "|---|---:|---:|---:|" + ("---:|---:|---:|" if with_paper else "")
    lines = [f"## {title}", "", f"{summary['records']} records. M: matches the functional "
             "reference in outputs, both backward passes, final visible state and RNG state "
             "(float64 bitwise, float32 within 1e-6 relative); R: framework raised; D: ran "
             "and differs." + (" Paper columns: the paper's Table 2 (50 seeds, torch 2.8.0+cu126, "
             "H100), for comparison only." if with_paper else ""), "", head, sep]
    for r in summary["table"]:
        label = TABLE_ORDER.get((r["backend"], r["method"]), f"{r['backend']} {r['method']}")
        extra = f" (+{r['unsupported']} unsupported)" if r.get("unsupported") else ""
        cells = [f"{label}{extra}", r["M"], r["R"], r["D"]]
        if with_paper:
            cells += PAPER_TABLE2.get((r["backend"], r["method"]), ("–", "–", "–"))
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "Per family:", "", "| backend | method | family | M | R | D |",
              "|---|---|---|---:|---:|---:|"]
    lines += [f"| {r['backend']} | {r['method']} | {r['family']} | {r['M']} | {r['R']} | "
              f"{r['D']} |" for r in summary["by_family"]]
    return "\n".join(lines) + "\n"


def expected_semantics(doc: dict, out_dir: Path) -> Expected:
    """Every (backend, method, family, seed, dtype) of the configured seeds in this table."""
    from ..semantics import KEY, cohort_units

    table = doc.get("table")
    units = [u.key for u in cohort_units(doc["config"]["seeds"]) if u.table == table]
    return Expected(tuple(KEY), units, None, "(backend, method, family, seed, dtype)")


@register_reporter("semantics", outputs=("semantics.md",), expected=expected_semantics)
def report_semantics(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Write ``semantics.md``: the Table 2 counts beside the paper's, and per-family counts.

    Raises:
        RecordsError: duplicated or unreadable rows.
    """
    from ..semantics import summarize_frame

    summary = summarize_frame(read_records(out_dir, "semantics"))
    path = Path(dest or out_dir) / "semantics.md"
    atomic_write_bytes(path, _markdown("Replay semantics cohort (paper Table 2)", summary,
                                       True).encode())
    return [path]


@register_reporter("semantics_stateremat_jax", outputs=("semantics_stateremat_jax.md",),
                   expected=expected_semantics)
def report_semantics_extension(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Write ``semantics_stateremat_jax.md``: outcomes of ``stateremat.jax.checkpoint``."""
    from ..semantics import summarize_frame

    summary = summarize_frame(read_records(out_dir, "semantics_stateremat_jax"))
    path = Path(dest or out_dir) / "semantics_stateremat_jax.md"
    atomic_write_bytes(path, _markdown("stateremat.jax.checkpoint on the same conditions "
                                       "(extension)", summary, False).encode())
    return [path]
