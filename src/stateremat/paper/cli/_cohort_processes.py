"""CLI: ``stateremat cohort processes`` (independent-process cohorts, paper §11) and the
hidden per-process entry point ``stateremat cohort process-worker``."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Optional

import typer

from stateremat._shared.checks import check_device, in_range, nonempty_path

from ._app import (check_out_dir, check_preset, cohort_app, fail, fail_from, guarded, parse_budget,
                   run_owns)
from ._bench import check_workload_memory
from ._limits import (MAX_JOBS, MAX_PROCESSES, MAX_SEED, MAX_STEPS, MAX_THREADS, MAX_TIMEOUT_S,
                      MAX_WARMUPS, check_rows)
from ..._shared.progress import progress_bar


_API = "stateremat cohort processes"


@cohort_app.command("processes")
def processes(
    experiment: str = typer.Option(..., "--experiment",
                                   help="fair44 | pressure32 | workloads3 (paper §11)."),
    n_processes: int = typer.Option(..., "--processes", callback=in_range(
        1, MAX_PROCESSES, "the paper uses 50"), help=f"Independent processes N, 1 to "
        f"{MAX_PROCESSES:,}."),
    preset: str = typer.Option("cpu", "--preset", help="Shapes preset: cpu, cpu-faithful (cpu with "
                                "state / 64: the paper's share of state copies in a step), h100 or tiny (tests)."),
    out: Path = typer.Option(..., "--out", parser=nonempty_path, help="Run folder (rerun to resume)."),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", callback=in_range(1, MAX_JOBS, "omit it for cores // threads"),
        help=f"Concurrent local processes, 1 to {MAX_JOBS:,} (default: cores // threads on "
        "cpu, 1 on cuda)."),
    threads: int = typer.Option(1, "--threads", callback=in_range(
        1, MAX_THREADS, "1 avoids oversubscription"), help=f"CPU threads per process, 1 to "
        f"{MAX_THREADS:,}."),
    dask: Optional[str] = typer.Option(
        None, "--dask", help="Dask scheduler address, host:port or tcp://host:port (e.g. "
        "tcp://host:8786; tcp only: other schemes need a configured Client from Python); "
        "checked first, refused unless a Dask scheduler answers within 5 s."),
    warmups: Optional[int] = typer.Option(None, "--warmups", callback=in_range(
        0, MAX_WARMUPS, "omit it for the experiment's count"),
        help=f"Warmup steps per method, 0 to {MAX_WARMUPS:,}."),
    steps: Optional[int] = typer.Option(None, "--steps", callback=in_range(
        1, MAX_STEPS, "omit it for the experiment's count"),
        help=f"Measured steps per method, 1 to {MAX_STEPS:,}."),
    seed: int = typer.Option(0, "--seed", callback=in_range(0, MAX_SEED, "the paper uses 0"),
                             help=f"Base seed of the per-process method orders, 0 to {MAX_SEED}."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    timeout_s: Optional[float] = typer.Option(
        None, "--timeout-s", callback=in_range(0, MAX_TIMEOUT_S, "omit it to wait for every "
                                               "process", lo_open=True),
        help=f"Kill a process after this many seconds, > 0 and at most {MAX_TIMEOUT_S:,.0f} "
        "(a week)."),
    budget: Optional[str] = typer.Option(
        None, "--budget", help="Override the experiment's logical budget (bytes or KiB/MiB/GiB), "
        "e.g. 46MiB; recorded in the cohort config. Default: the paper's budget scaled by the "
        "preset; fair44 at cpu scale uses 44/46.063 of the frozen card's all-eager peak."),
    profile: Optional[Path] = typer.Option(
        None, "--profile", parser=nonempty_path, help="Folder of <cell>.json profile cards to freeze (default: "
        "measure each cell's card once, before any process starts)."),
) -> None:
    """Launch N fresh interpreters, each timing every method; rows go to OUT/cohort_timing.

    Ctrl-C (or SIGTERM) stops launching, terminates the running processes and keeps every
    finished one; rerunning the same command resumes.
    """
    from ..cohort import (EXPERIMENTS, STATUS_TABLE, TIMING_TABLE, check_dask_address,
                          run_process_cohort)

    if experiment not in EXPERIMENTS:
        raise fail(f"{_API}: --experiment must be one of {', '.join(EXPERIMENTS)}, got "
                   f"{experiment!r}. Tip: fair44 is the 44 GiB fair-control cohort.")
    check_preset(_API, preset)
    budget_bytes = parse_budget(_API, budget)
    check_device(_API, device)
    check_out_dir(_API, out, owns=run_owns(TIMING_TABLE, STATUS_TABLE, extra=("profile",)))
    if dask is not None:
        try:
            check_dask_address(dask, _API)
        except ValueError as exc:
            raise fail_from(_API, exc) from None
    if profile is not None and not profile.is_dir():
        raise fail(f"{_API}: --profile {str(profile)!r} is not a folder. Tip: pass a folder "
                   "holding <cell>.json cards, or omit it to measure them here.")
    # processes running at once here (as run_process_cohort picks jobs); on Dask they run elsewhere
    concurrent = 1 if dask is not None else min(n_processes, jobs or (
        1 if device.startswith("cuda") else max(1, (os.cpu_count() or 1) // threads)))
    check_workload_memory(_API, experiment, preset, device, concurrent)
    spec = _spec(experiment, preset)
    rows = n_processes * sum(len(c.methods) * (c.steps if steps is None else steps)
                             for c in spec.cells)
    check_rows(_API, "cohort_timing", rows, f"--processes {n_processes} x methods x steps")
    with guarded(_API, out), progress_bar() as bar:
        res = run_process_cohort(out, experiment, n_processes, preset=preset, warmups=warmups,
                                 steps=steps, jobs=jobs, threads=threads, dask_address=dask,
                                 seed=seed, device=device, timeout_s=timeout_s,
                                 profile_dir=profile, budget_bytes=budget_bytes, progress=bar,
                                 on_stop="return")
    typer.echo(f"cohort {experiment}: {res['already_done']} processes already done, ran "
               f"{res['ran']}, ok {res['ok']}, failed {len(res['failed'])} -> {out}")
    if res["interrupted"]:
        signum = getattr(signal, res["interrupted"])
        raise fail(f"{_API}: stopped by {res['interrupted']}: launched nothing more, terminated "
                   f"{len(res['stopped'])} running process(es) {res['stopped']}; the rows of "
                   f"{res['already_done'] + res['ok']} finished processes are kept in {out} "
                   f"({res['not_started']} never started). Tip: rerun the same command to "
                   "resume.", code=128 + signum)
    if res["failed"]:
        raise fail(f"{_API}: processes {res['failed']} failed (exit codes and stderr tails in "
                   f"{out}/cohort_processes). Tip: rerun the same command to retry only those; "
                   "finished processes are kept.", code=1)
    _fail_on_error_rows(out)


def _fail_on_error_rows(out: Path) -> None:
    """Exit 1 when a process finished but a method in it raised (its rows carry the error)."""
    from ..cohort import TIMING_TABLE
    from ..report import check_complete

    st = check_complete(out).get(TIMING_TABLE)
    if st is not None and st.problem:  # rows that cannot be read cannot say the run succeeded
        raise fail(f"{_API}: the processes finished but their rows cannot be read: {st.problem}", code=2)
    if st is None or not st.why:
        return
    (p, cell, method), why = next(iter(st.why.items()))
    raise fail(f"{_API}: {len(st.why)} (process, cell, method) unit(s) ran but raised, e.g. process {p}, "
               f"cell {cell!r}, method {method!r}: {why}. Their rows are kept and `stateremat report "
               f"{out}` lists them as incomplete (a raised method is a failure, never infeasible). Tip: "
               "fix the cause, then run the cohort into a new --out folder (a rerun here counts those "
               "processes as done).", code=1)


def _spec(experiment: str, preset: str):
    from ..bench import experiment_spec

    return experiment_spec(experiment, preset)


@cohort_app.command("process-worker", hidden=True,
                    context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                      "help_option_names": []})
def process_worker(ctx: typer.Context) -> None:
    """One cohort process (launched by ``cohort processes``; not for direct use)."""
    from ..cohort import worker_main

    raise typer.Exit(worker_main(list(ctx.args)))
