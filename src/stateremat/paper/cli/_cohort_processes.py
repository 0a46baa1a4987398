"""CLI: ``stateremat cohort processes`` (independent-process cohorts, paper §11) and the
hidden per-process entry point ``stateremat cohort process-worker``."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._app import check_out_dir, cohort_app, fail
from ._progress import progress_bar


@cohort_app.command("processes")
def processes(
    experiment: str = typer.Option(..., "--experiment",
                                   help="fair44 | pressure32 | workloads3 (paper §11)."),
    n_processes: int = typer.Option(..., "--processes", help="Independent processes N."),
    preset: str = typer.Option("cpu", "--preset", help="Shapes preset: cpu or h100."),
    out: Path = typer.Option(..., "--out", help="Run folder (rerun to resume)."),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", help="Concurrent local processes (default: cores // threads on cpu, "
        "1 on cuda)."),
    threads: int = typer.Option(1, "--threads", help="CPU threads per process."),
    dask: Optional[str] = typer.Option(None, "--dask",
                                       help="Dask scheduler address, e.g. tcp://host:8786."),
    warmups: Optional[int] = typer.Option(None, "--warmups", help="Warmup steps per method."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Measured steps per method."),
    seed: int = typer.Option(0, "--seed", help="Base seed of the per-process method orders."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    timeout_s: Optional[float] = typer.Option(None, "--timeout-s",
                                              help="Kill a process after this many seconds."),
    budget: Optional[str] = typer.Option(
        None, "--budget", help="Override the experiment's logical budget (bytes or KiB/MiB/GiB), "
        "e.g. 46MiB; recorded in the cohort config. Default: the paper's budget scaled by the "
        "preset; fair44 at cpu scale uses 44/46.063 of the frozen card's all-eager peak."),
    profile: Optional[Path] = typer.Option(
        None, "--profile", help="Folder of <cell>.json profile cards to freeze (default: "
        "measure each cell's card once, before any process starts)."),
) -> None:
    """Launch N fresh interpreters, each timing every method; rows go to OUT/cohort_timing."""
    from ...contract import ProfileCardError, RecordsError
    from ..cohort import EXPERIMENTS, run_process_cohort

    if experiment not in EXPERIMENTS:
        raise fail(f"stateremat cohort processes: --experiment must be one of "
                   f"{', '.join(EXPERIMENTS)}, got {experiment!r}. Tip: fair44 is the 44 GiB "
                   "fair-control cohort.")
    for name, v, lo in (("--processes", n_processes, 1), ("--jobs", jobs, 1),
                        ("--warmups", warmups, 0), ("--steps", steps, 1),
                        ("--threads", threads, 1)):
        if v is not None and v < lo:
            raise fail(f"stateremat cohort processes: {name} must be >= {lo}, got {v}. "
                       "Tip: see --help.")
    from ...contract import parse_size

    if timeout_s is not None and not timeout_s > 0:
        raise fail(f"stateremat cohort processes: --timeout-s must be > 0, got {timeout_s}. "
                   "Tip: omit it to wait for every process.")
    if not (device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise fail(f"stateremat cohort processes: --device must be cpu, cuda or cuda:N, got "
                   f"{device!r}. Tip: use cpu here.")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise fail("stateremat cohort processes: --device cuda, but torch sees no CUDA "
                       "device. Tip: use --device cpu.")
    check_out_dir("stateremat cohort processes", out)
    try:
        budget_bytes = None if budget is None else parse_size(budget)
    except ValueError as exc:
        raise fail(f"stateremat cohort processes: --budget: {exc}. Tip: e.g. --budget 46MiB.")
    if budget_bytes is not None and budget_bytes <= 0:
        raise fail("stateremat cohort processes: --budget must be positive. Tip: e.g. --budget 46MiB.")
    try:
        with progress_bar() as bar:
            res = run_process_cohort(out, experiment, n_processes, preset=preset, warmups=warmups,
                                     steps=steps, jobs=jobs, threads=threads, dask_address=dask,
                                     seed=seed, device=device, timeout_s=timeout_s,
                                     profile_dir=profile, budget_bytes=budget_bytes, progress=bar)
    except (RecordsError, ProfileCardError, ValueError) as exc:
        raise fail(str(exc))
    typer.echo(f"cohort {experiment}: {res['already_done']} processes already done, ran "
               f"{res['ran']}, ok {res['ok']}, failed {len(res['failed'])} -> {out}")
    if res["failed"]:
        raise fail(f"stateremat cohort processes: processes {res['failed']} failed (exit codes "
                   f"and stderr tails in {out}/cohort_processes). Tip: rerun the same command "
                   "to retry only those; finished processes are kept.", code=1)


@cohort_app.command("process-worker", hidden=True,
                    context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                      "help_option_names": []})
def process_worker(ctx: typer.Context) -> None:
    """One cohort process (launched by ``cohort processes``; not for direct use)."""
    from ..cohort import worker_main

    raise typer.Exit(worker_main(list(ctx.args)))
