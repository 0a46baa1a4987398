"""CLI commands: ``stateremat bench calibrate|pressure|fair`` (registered on import)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._app import bench_app, check_out_dir, fail
from ._progress import progress_bar


def run_bench(name: str, out: Path, preset: str = "cpu", device: str = "cpu",
              warmups: Optional[int] = None, steps: Optional[int] = None,
              budget: Optional[str] = None, *, api: Optional[str] = None,
              show_paths: bool = True) -> None:
    """Check the options, run experiment ``name`` under a progress bar and print its table.

    Args:
        name: ``calibrate``, ``pressure`` or ``fair``.
        out: run folder (rerun to resume).
        preset: ``cpu`` or ``h100``.
        device: ``cpu`` or ``cuda[:i]``.
        warmups, steps: per-method overrides (None: the spec's).
        budget: logical budget override, bytes or KiB/MiB/GiB (None: the paper's rule).
        api: command name for error messages (default ``stateremat bench NAME``).
        show_paths: also print where rows, summary and tables went.

    Raises:
        typer.Exit: bad input (code 2), before anything is written.
    """
    from ...contract import RecordsError, parse_size

    api = api or f"stateremat bench {name}"
    try:
        budget_bytes = None if budget is None else parse_size(budget)
    except ValueError as exc:
        raise fail(f"{api}: --budget: {exc}. Tip: e.g. --budget 46MiB.")
    if budget_bytes is not None and budget_bytes <= 0:
        raise fail(f"{api}: --budget must be positive, got {budget!r}. Tip: e.g. --budget 46MiB.")
    if steps is not None and steps < 1:
        raise fail(f"{api}: --steps must be >= 1, got {steps}. Tip: omit it for the preset's count.")
    if warmups is not None and warmups < 0:
        raise fail(f"{api}: --warmups must be >= 0, got {warmups}. Tip: omit it for the preset's count.")
    check_out_dir(api, out)

    if preset not in ("cpu", "h100", "tiny"):
        raise fail(f"--preset {preset!r}: expected cpu or h100. Tip: cpu runs here in minutes.")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise fail("--device cuda: no CUDA device is visible. Tip: use --device cpu here.")
    elif device != "cpu":
        raise fail(f"--device {device!r}: expected cpu or cuda[:i].")
    from ..bench import run_experiment

    try:
        with progress_bar() as bar:
            run_experiment(name, out, preset=preset, device=device, warmups=warmups, steps=steps,
                           budget_bytes=budget_bytes, progress=bar)
    except RecordsError as exc:
        raise fail(str(exc))
    typer.echo((out / "tables.md").read_text())  # the table, rendered once, as written
    if show_paths:
        typer.echo(f"rows: {out / 'bench'}  summary: {out / 'summary.json'}  tables: {out / 'tables.md'}")


_OUT = typer.Option(..., "--out", help="run folder (rerun with the same folder to resume)")
_PRESET = typer.Option("cpu", help="cpu (paper shapes and budgets / 1024; fair: the paper's "
                       "budget/eager-peak ratio) or h100")
_DEVICE = typer.Option("cpu", help="cpu, or cuda for the GPU path")
_WARM = typer.Option(None, help="override warmup steps per method")
_STEPS = typer.Option(None, help="override measured steps per method")
_BUDGET = typer.Option(None, help="override the scaled paper budget, e.g. 46MiB (recorded)")


@bench_app.command("calibrate")
def calibrate(out: Path = _OUT, preset: str = _PRESET, device: str = _DEVICE,
        warmups: Optional[int] = _WARM, steps: Optional[int] = _STEPS,
        budget: Optional[str] = _BUDGET) -> None:
    """24-shape calibration grid, six methods, scaled 20 GiB budget (§8, Table 10)."""
    run_bench("calibrate", out, preset, device, warmups, steps, budget)


@bench_app.command("pressure")
def pressure(out: Path = _OUT, preset: str = _PRESET, device: str = _DEVICE,
        warmups: Optional[int] = _WARM, steps: Optional[int] = _STEPS,
        budget: Optional[str] = _BUDGET) -> None:
    """Four activation-pressure cells, six methods, scaled 32 GiB (§9, Tables 4 and 5)."""
    run_bench("pressure", out, preset, device, warmups, steps, budget)


@bench_app.command("fair")
def fair(out: Path = _OUT, preset: str = _PRESET, device: str = _DEVICE,
        warmups: Optional[int] = _WARM, steps: Optional[int] = _STEPS,
        budget: Optional[str] = _BUDGET) -> None:
    """Large/sparse cell, all seven methods, 44 GiB budget (§10, Table 6); at cpu scale 44/46.063
    of the card's predicted all-eager peak, the paper's budget/eager ratio."""
    run_bench("fair", out, preset, device, warmups, steps, budget)
