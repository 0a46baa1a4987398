"""CLI commands: cohort semantics (registered on import; ``cohort processes`` lives elsewhere)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._app import check_json_target, check_out_dir, cohort_app, fail
from ._progress import progress_bar


@cohort_app.command("semantics")
def semantics(
    seeds: str = typer.Option("420000:420050", help="Seed keys, half-open A:B (paper: "
                              "420000:420050, 50 seeds = 5,900 records)."),
    out: Path = typer.Option(..., "--out", help="Run folder (resumed if it exists)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary, "
                                             "recomputed from the raw rows, to this file."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    device: str = typer.Option("auto", help="Torch device: auto (CUDA when available), cpu, "
                               "cuda, cuda:N. JAX runs on CPU."),
) -> None:
    """Torch/JAX replay-semantics cohort (paper §5, Table 2): every row kept, resumable."""
    from ...contract import RecordsError, atomic_write_json, parse_seed_range

    try:
        seed_list = list(parse_seed_range(seeds))
    except ValueError as exc:
        raise fail(f"stateremat cohort semantics: --seeds: {exc}. Tip: the paper's seeds are "
                   "420000:420050.")
    if not seed_list:
        raise fail(f"stateremat cohort semantics: --seeds {seeds!r} is empty; expected A:B "
                   "with A < B. Tip: 420000:420050 is the paper's 50 seeds.")
    check_out_dir("stateremat cohort semantics", out)
    check_json_target("stateremat cohort semantics", json_path)
    from ..report import report_semantics, report_semantics_extension
    from ..semantics import resolve_device, run_semantics, summarize_semantics

    try:
        device = resolve_device(device)
    except ValueError as exc:
        raise fail(str(exc))
    try:
        with progress_bar(progress) as bar:
            rep = run_semantics(seed_list, out, progress=bar, device=device)
        summary = summarize_semantics(out)
        paths = report_semantics(out) + report_semantics_extension(out)
    except RecordsError as exc:
        raise fail(str(exc))
    for what, why in rep.unavailable.items():
        typer.echo(f"warning: {what} not run, no rows written: {why}", err=True)
    summary["unavailable"] = rep.unavailable
    if json_path is not None:
        atomic_write_json(json_path, summary)
        paths.append(json_path)
    typer.echo(f"semantics: {summary['records']} records; extension "
               f"(stateremat.jax.checkpoint): {summary['extension']['records']} records; this "
               f"run wrote {sum(rep.written.values())} rows, {rep.skipped_done} were already done")
    for r in summary["table"]:
        typer.echo(f"  {r['backend']:5s} {r['method']:30s} M={r['M']:4d} R={r['R']:4d} "
                   f"D={r['D']:4d}")
    for p in paths:
        typer.echo(f"wrote {p}")
