"""CLI commands: cohort semantics (registered on import; ``cohort processes`` lives elsewhere)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from stateremat._shared.checks import check_device, is_stdout, nonempty_path

from ._app import check_json_target, check_out_dir, cohort_app, guarded, run_owns
from ._limits import MAX_SEED, MAX_STUDY_SEEDS, check_rows, parse_seeds
from ..._shared.progress import progress_bar


@cohort_app.command("semantics")
def semantics(
    seeds: str = typer.Option("420000:420050", help="Seed keys, half-open A:B (one seed N: "
                              "N:N+1; a bare N is refused) (paper: "
                              "420000:420050, 50 seeds = 5,900 records); seeds in "
                              f"[0, {MAX_SEED}], at most {MAX_STUDY_SEEDS:,}."),
    out: Path = typer.Option(..., "--out", parser=nonempty_path, help="Run folder (resumed if it exists)."),
    json_path: Optional[Path] = typer.Option(None, "--json", parser=nonempty_path,
                                             help="Write the summary (- : standard output), "
                                             "recomputed from the raw rows, to this file."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    device: str = typer.Option("auto", help="Torch device: auto (CUDA when available), cpu, "
                               "cuda, cuda:N. JAX runs on CPU."),
) -> None:
    """Torch/JAX replay-semantics cohort (paper §5, Table 2): every row kept, resumable."""
    from ..._shared.io import atomic_write_json

    api = "stateremat cohort semantics"
    seed_list = parse_seeds(api, "--seeds", seeds, MAX_STUDY_SEEDS)
    device = check_device(api, device, auto=True)
    owns = run_owns("semantics", "semantics_stateremat_jax")
    check_out_dir(api, out, owns=owns)
    check_json_target(api, json_path, out, owns)
    check_rows(api, "semantics", 118 * len(seed_list), f"--seeds {seeds}")
    from ..report import report_semantics, report_semantics_extension
    from ..semantics import resolve_device, run_semantics, summarize_semantics

    with guarded(api, out):
        with progress_bar(progress) as bar:
            rep = run_semantics(seed_list, out, progress=bar, device=resolve_device(device))
        summary = summarize_semantics(out)
        paths = report_semantics(out) + report_semantics_extension(out)
    for what, why in rep.unavailable.items():
        typer.echo(f"warning: {what} not run, no rows written: {why}", err=True)
    summary["unavailable"] = rep.unavailable
    if is_stdout(json_path):
        typer.echo(json.dumps(summary, indent=2, default=float))
        return
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
