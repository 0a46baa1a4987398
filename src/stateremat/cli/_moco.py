"""CLI commands: moco (registered on import)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._app import app_app, fail


@app_app.command("moco")
def moco(
    preset: str = typer.Option("cpu", help="tiny | cpu | paper (paper: GPU + CIFAR-100 --data)."),
    seeds: str = typer.Option("2701:2703", help="Half-open seed range A:B."),
    out: Path = typer.Option(..., help="Run folder (resumable: rerun with the same --out)."),
    data: Optional[Path] = typer.Option(None, help="CIFAR-100 python folder, or a Fashion-MNIST "
                                        "folder; default: the Debian package files."),
    dataset: Optional[str] = typer.Option(None, help="Override the preset's dataset: "
                                          "fashion-mnist | cifar-100 | digits."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: cuda when present)."),
    methods: Optional[str] = typer.Option(None, help="Comma-separated subset of the seven methods."),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads (1 is fastest on a "
                                          "shared, oversubscribed machine); recorded in the rows."),
) -> None:
    """Dense-queue MoCo application: seven methods per seed, linear probe, summary.json (§12)."""
    from dataclasses import replace

    from ..contract import RecordsError, parse_seed_range
    from ..experiments._moco_app import PRESETS, run_moco
    from ..experiments._moco_app import METHODS

    if preset not in PRESETS:
        raise fail(f"app moco: unknown --preset {preset!r}; expected one of {sorted(PRESETS)}. "
                   "Tip: use cpu here, paper on a GPU with --data.")
    try:
        seed_list = parse_seed_range(seeds)
    except ValueError as exc:
        raise fail(f"app moco: bad --seeds {seeds!r}: {exc}")
    chosen = tuple(m.strip() for m in methods.split(",")) if methods else METHODS
    bad = [m for m in chosen if m not in METHODS]
    if bad:
        raise fail(f"app moco: unknown methods {bad}; expected a subset of {list(METHODS)}. "
                   "Tip: omit --methods to run all seven.")
    cfg = PRESETS[preset] if dataset is None else replace(PRESETS[preset], dataset=dataset)
    try:
        summary = run_moco(cfg, seed_list, out, data=data, device=device, methods=chosen,
                           threads=threads)
    except (FileNotFoundError, RecordsError) as exc:
        raise fail(str(exc))
    except ValueError as exc:
        raise fail(str(exc))
    n_ok = sum(m["scores_sha256"] is not None for m in summary["methods"])
    typer.echo(f"dataset {summary['dataset']}: {n_ok}/{len(summary['methods'])} method runs "
               f"finished; identical_within_seed={summary['identical_within_seed']}; "
               f"summary: {Path(out) / 'summary.json'}")
    if not summary["identical_within_seed"]:
        raise typer.Exit(1)
