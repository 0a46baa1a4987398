"""CLI commands: ``stateremat bench calibrate|pressure|fair`` (registered on import)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stateremat._shared.checks import check_device, check_memory, in_range, nonempty_path

from ._app import bench_app, check_out_dir, check_preset, guarded, parse_budget, run_owns
from ._limits import MAX_STEPS, MAX_WARMUPS
from ..._shared.progress import progress_bar


def check_workload_memory(api: str, experiment: str, preset: str, device: str, concurrent: int = 1) -> None:
    """Refuse an experiment whose largest cell would not fit the device's memory (estimate),
    times ``concurrent`` processes running it at once on this machine (``cohort processes --jobs``)."""
    from ..bench import experiment_spec

    cfg = max((c.config for c in experiment_spec(experiment, preset).cells),
              key=lambda c: c.estimated_peak_bytes)
    what = f"--preset {preset} (its largest cell, one training step)"
    tip = "use --preset cpu here, h100 on an 80+ GiB GPU"
    if concurrent > 1:
        what += f" x {concurrent:,} concurrent processes (--jobs)"
        tip = "lower --jobs; " + tip
    check_memory(api, what, cfg.estimated_peak_bytes * concurrent, device, tip=tip)


def run_bench(name: str, out: Path, preset: str = "cpu", device: str = "cpu",
              warmups: Optional[int] = None, steps: Optional[int] = None,
              budget: Optional[str] = None, *, api: Optional[str] = None,
              show_paths: bool = True) -> None:
    """Check the options, run experiment ``name`` under a progress bar and print its table.

    Args:
        name: ``calibrate``, ``pressure`` or ``fair``.
        out: run folder (rerun to resume).
        preset: ``cpu``, ``cpu-faithful``, ``h100`` or ``tiny``.
        device: ``cpu`` or ``cuda[:i]``.
        warmups, steps: per-method overrides (None: the spec's).
        budget: logical budget override, bytes or KiB/MiB/GiB (None: the paper's rule).
        api: command name for error messages (default ``stateremat bench NAME``).
        show_paths: also print where rows, summary and tables went.

    Raises:
        typer.Exit: bad input (code 2), before anything is written.
    """
    api = api or f"stateremat bench {name}"
    check_preset(api, preset)
    budget_bytes = parse_budget(api, budget)
    check_device(api, device)
    check_out_dir(api, out, owns=run_owns("bench", extra=("cards",)))
    check_workload_memory(api, name, preset, device)
    from ..bench import run_experiment

    with guarded(api, out), progress_bar() as bar:
        run_experiment(name, out, preset=preset, device=device, warmups=warmups, steps=steps,
                       budget_bytes=budget_bytes, progress=bar)
    typer.echo((out / "tables.md").read_text())  # the table, rendered once, as written
    if show_paths:
        typer.echo(f"rows: {out / 'bench'}  summary: {out / 'summary.json'}  tables: {out / 'tables.md'}")


_OUT = typer.Option(..., "--out", parser=nonempty_path, help="run folder (rerun with the same folder to resume)")
_PRESET = typer.Option("cpu", help="cpu (paper shapes and budgets / 1024; fair: the paper's "
                       "budget/eager-peak ratio), cpu-faithful (cpu with state / 64: the paper's "
                       "share of state copies in a step, for time), h100, or tiny (bytes / 2^16, for tests)")
_DEVICE = typer.Option("cpu", help="cpu, or cuda[:N] for the GPU path")
_WARM = typer.Option(None, callback=in_range(0, MAX_WARMUPS, "omit it for the preset's count"),
                     help=f"override warmup steps per method, 0 to {MAX_WARMUPS:,}")
_STEPS = typer.Option(None, callback=in_range(1, MAX_STEPS, "omit it for the preset's count"),
                      help=f"override measured steps per method, 1 to {MAX_STEPS:,}")
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
