"""Independent-process cohorts: N fresh interpreters, every method each, raw timing rows kept.

Paper §11. The parent freezes the cohort before any measurement (experiment spec, warmups,
steps, seeds, prespecified comparisons and the profile, all in the records' sidecar) and
launches one fresh Python interpreter per process, locally (``jobs`` at a time) or as Dask
tasks (each task still starts a fresh interpreter on its worker, so processes stay
independent). A child runs every method of every cell in an order shuffled from
``(seed, process)``, writes its rows to one Parquet file and exits; the parent appends them
as one atomic part of the ``cohort_timing`` table. A process therefore counts as finished
exactly when its rows are in that table: a killed or crashed child leaves none, is recorded
as failed in ``cohort_processes`` (exit code, stderr tail) and is re-run on resume; finished
processes are never redone, and every attempt's status row is kept.

Stops (``._launch``): the run folder is locked before anything is written. SIGINT, SIGTERM or
SIGHUP of the parent (or Ctrl-C to its process group) stops launching at once, terminates the
running processes (recorded as ``interrupted``) and keeps every finished process's rows; the
result says which signal stopped it. A ``kill -9`` of the parent takes its children with it
(``PR_SET_PDEATHSIG``); their work folders under ``out_dir/.tmp`` are removed by the next
launch, which re-runs them.

Frozen profile: before launching anything the parent measures (or takes from ``--profile``)
one profile card per cell, stores it in ``out_dir/profile/<cell>.json`` and its hash in the
cohort config; each process receives the card's bytes and plans on it, so the profile digest
is identical across processes (rows carry ``profile_hash``; the report checks it). Every card
must fit its cell (workload and segment names, :func:`check_card_fits`), and a resumed run
refuses a frozen card that is missing or was edited since the sidecar recorded its hash,
before anything is measured or written.

Threads: each process runs with ``threads`` CPU threads (default 1) and ``jobs`` processes run
at once (default cores // threads on CPU, 1 on CUDA). Concurrency changes absolute times;
the report compares ratios of methods paired within one process (the runtime interleaves
them on CPU), which see the same neighbours.

Layout under ``out_dir``: ``cohort_timing/`` + ``.json`` (raw step rows, key
``process, cell, method, step``) and ``cohort_processes/`` + ``.json`` (one row per attempt,
with the ``requested_processes`` N of the launch that made it).
"""
from __future__ import annotations

import io
import os
import shutil
import signal
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..._shared.io import loads_json, source_hash
from .. import Progress, as_progress
from ..records import RecordStore
from ..records import TEMP_DIR, check_resumable, lock_run
from ..records.tables import STATUS_TABLE, TIMING_TABLE
from ._launch import CohortStopped, StopRequest, check_dask_address, dask_results, local_results
from ._tables import check_timing_attempts
from ._process_worker import EXPERIMENTS, method_order as method_order, worker_main as worker_main

_API = "stateremat cohort processes"

#: Prespecified comparisons (paper §11, Table 8): (numerator, denominator, primary metrics).
#: Each metric listed counts once in the cohort's Bonferroni family.
PRESPECIFIED: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    # 44 GiB fair control: joint vs the correctly costed eager/whole planner, time and peak.
    "fair44": (("joint", "eager_whole", ("time", "peak")),),
    # 32 GiB pressure: joint vs fixed regions (time); joint vs state-agnostic (peak).
    "pressure32": (("joint", "regions", ("time",)), ("joint", "state_agnostic", ("peak",))),
    # Three workloads: regions vs whole snapshots, time and peak, in every cell (6 tests).
    "workloads3": (("regions", "whole", ("time", "peak")),),
}


def prespecified_comparisons(experiment: str, cells: Sequence[Any]) -> list[dict[str, Any]]:
    """The cohort's prespecified comparisons, one per cell holding both methods.

    Args:
        experiment: ``fair44``, ``pressure32`` or ``workloads3``.
        cells: the spec's cells (``.name``, ``.methods``).

    Returns:
        JSON-ready dicts ``{"cell", "numerator", "denominator", "primary"}`` (read back by
        ``stateremat.paper.stats.Comparison.from_dict``).
    """
    out = []
    for cell in cells:
        for num, den, primary in PRESPECIFIED[experiment]:
            if num in cell.methods and den in cell.methods:
                out.append({"cell": cell.name, "numerator": num, "denominator": den,
                            "primary": list(primary)})
    return out


def cohort_config(spec: Any, experiment: str, preset: str, *, warmups: int | None,
                  steps: int | None, seed: int, device: str,
                  profile: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The frozen cohort configuration written into both sidecars (resume must match it).

    ``profile`` maps cell -> SHA-256 of its frozen card (``ProfileCard.source_hash``).
    """
    from ..bench import budget_rule

    cells = [{"cell": c.name, "methods": list(c.methods), "budget_bytes": int(c.budget_bytes),
              "budget_rule": budget_rule(c),
              "warmups": int(c.warmups if warmups is None else warmups),
              "steps": int(c.steps if steps is None else steps)} for c in spec.cells]
    return {"experiment": experiment, "preset": preset, "seed": int(seed), "device": device,
            "cells": cells, "comparisons": prespecified_comparisons(experiment, spec.cells),
            "profile": dict(profile) if profile else None}


def freeze_profiles(spec: Any, out_dir: str | os.PathLike, device: str = "cpu",
                    profile_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Freeze one profile card per cell in ``out_dir/profile/<cell>.json``; return their JSON.

    An existing frozen card (a resumed cohort) is reused as it is. Otherwise the card comes
    from ``profile_dir/<cell>.json`` or is measured once, here in the parent, on ``device``.
    Every check comes first, before any card is measured or written: every card (given or
    frozen) must describe its cell's workload and name its segments as that workload does
    (:func:`check_card_fits`); a ``profile_dir`` card that differs from a card this folder froze
    earlier is refused; and in a folder that already holds a run (its sidecar records the
    cards' hashes) a frozen card edited since is refused, as is a missing one unless
    ``profile_dir`` holds exactly the card the run froze.

    Returns:
        ``{cell name: card JSON text}`` — the exact bytes every process plans on.

    Raises:
        ProfileCardError: a card is invalid, does not fit its cell, differs from the frozen
            card of its cell or from the hash the run recorded, or a frozen card is missing.
    """
    from ...contract import ProfileCardError, load_card, save_card

    frozen = Path(out_dir) / "profile"
    recorded = recorded_cards(out_dir)  # None: no run here yet
    given: dict[str, Any] = {}
    differ: list[tuple[Path, Path]] = []
    for cell in spec.cells:   # checks only: nothing is measured or written in this pass
        path = frozen / f"{cell.name}.json"
        rel = f"profile/{cell.name}.json"
        want = (recorded or {}).get(cell.name)
        old = None
        if path.exists():  # a frozen card changed since: refused
            old = load_card(path)
            check_card_fits(old, cell, f"frozen card {rel}")
            if want is not None and old.source_hash() != want:
                raise ProfileCardError(
                    f"{_API}: frozen card {rel} in {str(out_dir)!r} was changed after the run "
                    f"froze it (its hash {old.source_hash()[:12]}… differs from "
                    f"{want[:12]}… recorded in {TIMING_TABLE}.json). Tip: restore the original "
                    "card (or pass --profile with the original cards after removing it), or use "
                    "a new --out folder for another card.")
        elif recorded is not None and profile_dir is None:
            raise ProfileCardError(
                f"{_API}: frozen card {rel} is missing from {str(out_dir)!r}, which already "
                f"holds a run planned on it. Tip: restore it (or pass --profile with the "
                "original cards); nothing was measured or written.")
        if profile_dir is None:
            continue
        src = Path(profile_dir) / f"{cell.name}.json"
        card = load_card(src)
        check_card_fits(card, cell, str(src))
        if old is not None and old.source_hash() != card.source_hash():
            differ.append((src, path))
        elif old is None and want is not None and card.source_hash() != want:
            raise ProfileCardError(
                f"{_API}: {src} is not the card the run in {str(out_dir)!r} froze for cell "
                f"{cell.name!r} (its hash {card.source_hash()[:12]}… differs from {want[:12]}… "
                f"recorded in {TIMING_TABLE}.json; the frozen {rel} is missing). Tip: pass "
                "--profile with the original cards, or use a new --out folder for these cards.")
        given[cell.name] = card
    if differ:
        raise ProfileCardError(
            f"{_API}: --profile {str(profile_dir)!r} holds other cards than "
            f"the ones this run folder froze earlier: "
            f"{'; '.join(f'{a} differs from {b}' for a, b in differ)}. Tip: rerun without "
            "--profile to resume on the frozen cards, or use a new --out folder for these cards.")
    out: dict[str, str] = {}
    for cell in spec.cells:
        path = frozen / f"{cell.name}.json"
        if not path.exists():
            if cell.name in given:
                card = given[cell.name]
            else:
                from ..bench import cell_card  # lazy: imports torch

                card = cell_card(spec, cell, device)
            save_card(card, path)
        out[cell.name] = path.read_bytes().decode("utf-8")
    return out


def recorded_cards(out_dir: str | os.PathLike) -> dict[str, str] | None:
    """``{cell: card hash}`` the run in ``out_dir`` froze (its sidecar's config ``profile``);
    ``{}`` when a sidecar records none, None when ``out_dir`` holds no run yet."""
    from ..records import read_sidecar

    for table in (TIMING_TABLE, STATUS_TABLE):
        sidecar = Path(out_dir) / f"{table}.json"
        if sidecar.exists():
            config = read_sidecar(sidecar).get("config")
            profile = config.get("profile") if isinstance(config, dict) else None
            return {str(k): str(v) for k, v in profile.items()} if isinstance(profile, dict) else {}
    return None


def check_card_fits(card: Any, cell: Any, where: str) -> None:
    """Refuse a profile card that does not describe ``cell``: its ``meta.workload`` must be the
    cell's workload and its segments must be the ones that workload's chain has (count, names
    and order), or planning on it fails in every process.

    Raises:
        ProfileCardError: naming ``where`` (the file) and what differs.
    """
    from ...contract import ProfileCardError

    if card.meta.get("workload") != cell.config.to_dict():
        raise ProfileCardError(
            f"{_API}: {where} describes workload {card.meta.get('workload')!r}, but cell "
            f"{cell.name!r} is {cell.config.to_dict()!r}. Tip: profile with the same --preset, "
            "or omit --profile to measure the card once here.")
    want, got = list(cell.config.segment_names), list(card.segment_names)
    if got != want:
        if len(got) != len(want):
            what = f"{len(got)} segments, the cell's workload has {len(want)} ({_names(want)})"
        else:
            i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
            what = f"segment {i} named {got[i]!r}, the cell's workload names it {want[i]!r}"
        raise ProfileCardError(
            f"{_API}: {where} does not fit cell {cell.name!r}: it has {what}. Tip: use the "
            "card `stateremat profile` wrote for this cell and --preset (unedited), or omit "
            "--profile to measure it once here.")


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{names[0]} … {names[-1]}"


def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a cohort config known before its profile cards: no card hashes, and no
    budget of a cell whose budget the frozen card sets (a budget / eager-peak rule)."""
    out = {k: v for k, v in config.items() if k not in ("profile", "config_hash")}
    if isinstance(out.get("cells"), list):
        out["cells"] = [{k: v for k, v in c.items()
                         if not (k == "budget_bytes" and c.get("budget_rule") != "fixed")}
                        if isinstance(c, dict) else c for c in out["cells"]]
    return out


# --------------------------------------------------------------------------- driver
def _open_stores(out_dir: str | os.PathLike, config: dict, processes: int
                 ) -> tuple[RecordStore, RecordStore, set[int], dict[int, int]]:
    """The run's timing and status stores, the processes whose rows are on disk, and the
    attempts recorded per process; rows this run did not write are refused, never kept."""
    timing = RecordStore(out_dir, TIMING_TABLE, key=["process", "cell", "method", "step"],
                         meta=config)
    status = RecordStore(out_dir, STATUS_TABLE, key=["process", "attempt"], meta=config)
    done_df = timing.read()
    done = set(done_df["process"].astype(int)) if not done_df.empty else set()
    st = status.read()
    check_timing_attempts(out_dir, done_df, st, processes)
    _record_cut_attempts(status, done_df, st, processes)  # an ok status row a kill -9 cut off
    st = status.read()
    attempts = st.groupby("process").size().to_dict() if not st.empty else {}
    return timing, status, done, attempts


def run_process_cohort(out_dir: str | os.PathLike, experiment: str, processes: int, *,
                       preset: str = "cpu", warmups: int | None = None,
                       steps: int | None = None, jobs: int | None = None,
                       threads: int | None = 1, dask_address: Any = None,
                       seed: int = 0, device: str = "cpu", timeout_s: float | None = None,
                       profile_dir: str | os.PathLike | None = None,
                       profile_fn: Callable[..., dict[str, str]] | None = None,
                       worker_cmd: Sequence[str] | None = None,
                       spec_fn: Callable[[str, str], Any] | None = None,
                       budget_bytes: int | None = None,
                       progress: Progress | None = None, on_stop: str = "raise") -> dict[str, Any]:
    """Run (or resume) an independent-process cohort into ``out_dir``.

    Args:
        out_dir: run folder; rerun with the same options to resume.
        experiment: ``fair44``, ``pressure32`` or ``workloads3``.
        processes: number of independent processes ``N`` (processes ``0..N-1``; a rerun with
            a larger ``N`` extends the cohort).
        preset: spec preset (``cpu``, ``cpu-faithful``, ``h100``, ``tiny``).
        warmups, steps: per method and process; default: the spec's cells.
        jobs: concurrent local processes (ignored with ``dask_address``); default: one per
            ``threads`` CPU cores on ``cpu`` (2 on a 2-core machine), 1 on ``cuda`` (processes
            sharing one GPU would time each other).
        threads: CPU threads per process (default 1: several single-threaded processes use
            the cores without OpenMP oversubscription, which slows multi-threaded steps many
            times over on a shared machine); None keeps the environment's setting.
        dask_address: scheduler address (``tcp://host:8786``) or a ``distributed.Client``;
            each task launches a fresh interpreter on its worker.
        seed: base seed; process ``p`` shuffles its method order from ``(seed, p)``.
        device: ``cpu`` or ``cuda``.
        timeout_s: kill a process after this many seconds (recorded as ``timeout``).
        profile_dir: folder of ``<cell>.json`` profile cards to freeze (e.g. from ``stateremat
            profile``); default: the parent measures each cell's card once. Either way the
            cards are copied to ``out_dir/profile/``, their hashes go into the cohort config,
            and every process plans on exactly these cards (§11: the profile is frozen
            before confirmation and identical across processes).
        profile_fn: replaces :func:`freeze_profiles` (tests).
        worker_cmd: child command prefix (tests use a fake worker script).
        spec_fn: replaces :func:`stateremat.paper.bench.experiment_spec` (tests).
        budget_bytes: override the experiment's (scaled) logical budget for every cell, bytes;
            recorded in the cohort config and passed to every process. Without it, a cell with
            a budget / eager-peak rule (``fair44`` at ``cpu`` scale) gets its budget from its
            frozen card, recorded in the config the same way.
        progress: where to report finished processes (``stateremat._shared.progress.progress_bar``);
            None: nowhere.
        on_stop: after a stop signal (everything finished kept): ``"raise"``
            :class:`~._launch.CohortStopped` with the host's signal handlers back (a library
            call), or ``"return"`` the summary with ``"interrupted"`` set and the stop signals left
            ignored (the command, which reports and exits).

    Returns:
        ``{"out_dir", "processes", "already_done", "ran", "ok", "failed": [process ids],
        "interrupted": signal name or None, "stopped": [process ids stopped by it],
        "not_started": count}``.

    Raises:
        ValueError: on an unknown experiment, ``processes < 1``, or a ``dask_address`` that
            is malformed or where no scheduler answers (:func:`check_dask_address`).
        RecordsError: if ``out_dir`` holds a cohort with a different configuration.

    References:
        Paper §11 ("Independent-process confirmation").
    """
    _check_request(experiment, processes, dask_address, on_stop)
    spec = _cohort_spec(experiment, preset, spec_fn, budget_bytes, profile_dir, profile_fn)
    lock_run(out_dir)  # before anything is written: a refused second launch changes nothing
    # every option known before the cards, checked before any card is measured or written
    early = cohort_config(spec, experiment, preset, warmups=warmups, steps=steps, seed=seed,
                          device=device)
    early["threads"] = threads
    check_resumable(out_dir, TIMING_TABLE, _comparable(early), view=_comparable)
    cards = (profile_fn or freeze_profiles)(spec, out_dir, device, profile_dir)
    config = _frozen_config(spec, cards, experiment, preset, warmups=warmups, steps=steps,
                            seed=seed, device=device, threads=threads)
    timing, status, done, attempts = _open_stores(out_dir, config, int(processes))
    tasks = [(p, _worker_args(experiment, preset, p, seed, device, budget_bytes, warmups, steps))
             for p in range(int(processes)) if p not in done]
    if jobs is None:
        jobs = 1 if device.startswith("cuda") else max(1, (os.cpu_count() or 1) // (threads or 1))
    task = as_progress(progress, "run_process_cohort").task(f"cohort {experiment}: processes",
                                                            total=len(tasks))
    with StopRequest(restore=on_stop == "raise") as stop:
        results = (dask_results(tasks, dask_address, worker_cmd, timeout_s, cards, threads, stop)
                   if dask_address else
                   local_results(tasks, jobs, Path(out_dir) / TEMP_DIR / "cohort", worker_cmd,
                                 timeout_s, cards, threads, stop))
        ok, failed, stopped = _collect(results, timing, status, attempts, int(processes),
                                       "dask" if dask_address else "local", task)
    shutil.rmtree(Path(out_dir) / TEMP_DIR, ignore_errors=True)  # every work folder collected
    summary = {"out_dir": str(out_dir), "processes": int(processes), "already_done": len(done),
               "ran": ok + len(failed) + len(stopped), "ok": ok, "failed": sorted(failed),
               "interrupted": None if stop.signum is None else signal.Signals(stop.signum).name,
               "stopped": sorted(stopped), "not_started": len(tasks) - ok - len(failed) - len(stopped)}
    return _after_stop(stop, summary, on_stop)


def _record_cut_attempts(status: RecordStore, timing_df, st, processes: int) -> None:
    """Write the status row a stop (``kill -9``) cut off: a process whose rows were appended but
    whose ``ok`` status row never was (rows are appended only for an ok process). Without it the
    run's ``cohort_processes`` stays short (empty, after a cut first process) and ``report``
    refuses the run for good, while a rerun has nothing left to do."""
    if timing_df.empty:
        return
    ok = (set(st.loc[st["status"] == "ok", "process"].astype(int)) if not st.empty else set())
    for (p, a), g in timing_df.groupby(["process", "attempt"], sort=True):
        if int(p) in ok:
            continue
        wall = g["process_wall_s"].dropna() if "process_wall_s" in g else g.iloc[:0]
        host = g["hostname"].dropna() if "hostname" in g else g.iloc[:0]
        status.append([{"process": int(p), "attempt": int(a), "status": "ok", "exit_code": 0,  # ok is exit 0
                        "stderr_tail": "(status row recorded on resume: a stop cut it off after "
                        "the process's rows were written)",
                        "wall_s": float(wall.iloc[0]) if len(wall) else 0.0,
                        "hostname": str(host.iloc[0]) if len(host) else "",
                        "n_rows": len(g), "executor": "recovered",
                        "requested_processes": processes}])


def _after_stop(stop: StopRequest, summary: dict[str, Any], on_stop: str) -> dict[str, Any]:
    """The run's summary; a stop re-raised as :class:`CohortStopped` when ``on_stop="raise"``."""
    if stop.signum is not None and on_stop == "raise":
        raise CohortStopped(stop.signum, summary)
    return summary


def _check_request(experiment: str, processes: int, dask_address: Any, on_stop: str = "raise") -> None:
    """Refuse an unknown experiment, ``processes < 1`` or a bad scheduler address, in seconds,
    before anything is measured or written."""
    if experiment not in EXPERIMENTS:
        raise ValueError(f"stateremat cohort processes: --experiment must be one of "
                         f"{list(EXPERIMENTS)}, got {experiment!r}. Tip: fair44 is the 44 GiB "
                         "fair-control cohort of paper §11.")
    if int(processes) < 1:
        raise ValueError(f"stateremat cohort processes: --processes must be >= 1, got "
                         f"{processes}. Tip: the paper uses 50.")
    if isinstance(dask_address, str):
        check_dask_address(dask_address)
    if on_stop not in ("raise", "return"):
        raise ValueError(f"run_process_cohort: on_stop must be 'raise' or 'return', got {on_stop!r}. "
                         "Tip: 'raise' (default) re-raises a stop as CohortStopped.")


def _cohort_spec(experiment: str, preset: str, spec_fn: Callable[[str, str], Any] | None,
                 budget_bytes: int | None, profile_dir: str | os.PathLike | None,
                 profile_fn: Callable[..., dict[str, str]] | None) -> Any:
    """The experiment's spec (with ``budget_bytes`` applied); given cards that cannot fit a cell
    are refused here, before the run folder is even created."""
    if spec_fn is None:
        from ..bench import experiment_spec as spec_fn  # type: ignore[no-redef]
    spec = spec_fn(experiment, preset)
    if budget_bytes is not None:
        from ..bench import with_budget

        spec = with_budget(spec, budget_bytes)
    if profile_dir is not None and profile_fn is None:
        from ...contract import load_card

        for cell in spec.cells:
            src = Path(profile_dir) / f"{cell.name}.json"
            check_card_fits(load_card(src), cell, str(src))
    return spec


def _frozen_config(spec: Any, cards: dict[str, str], experiment: str, preset: str, *,
                   warmups: int | None, steps: int | None, seed: int, device: str,
                   threads: int | None) -> dict[str, Any]:
    """The cohort config on the frozen cards: a budget / eager-peak rule resolves on them (every
    process resolves the same M), their hashes and the config's own hash recorded."""
    from ...contract import ProfileCard
    from ..bench import resolve_spec

    parsed = {c: ProfileCard.from_dict(loads_json(t)) for c, t in cards.items()}
    spec = resolve_spec(spec, parsed)
    profile = {c: card.source_hash() for c, card in parsed.items()} or None
    config = cohort_config(spec, experiment, preset, warmups=warmups, steps=steps, seed=seed,
                           device=device, profile=profile)
    config["threads"] = threads
    config["config_hash"] = source_hash(config)
    return config


def _collect(results, timing: RecordStore, status: RecordStore, attempts: dict, processes: int,
             executor: str, task) -> tuple[int, list[int], list[int]]:
    """Record each finished process as it comes: its rows (one atomic part: the process is then
    done) and its status row. Returns ``(ok, failed, stopped)``."""
    ok, failed, stopped = 0, [], []
    for p, res in results:
        attempt = int(attempts.get(p, 0)) + 1
        n_rows = 0
        if res["status"] == "ok":
            import pyarrow.parquet as pq

            rows = pq.read_table(io.BytesIO(res["rows_parquet"])).to_pylist()
            for r in rows:
                r["attempt"] = attempt
            n_rows = timing.append(rows)
            ok += 1
        else:
            (stopped if res["status"] == "interrupted" else failed).append(p)
        status.append([{"process": p, "attempt": attempt, "status": res["status"],
                        "exit_code": res["exit_code"], "stderr_tail": res["stderr_tail"],
                        "wall_s": res["wall_s"], "hostname": res["hostname"],
                        "n_rows": n_rows, "executor": executor,
                        # N asked for at this launch: a cohort extended after results shows it
                        "requested_processes": processes}])
        task.advance()
    return ok, failed, stopped


def _worker_args(experiment: str, preset: str, process: int, seed: int, device: str,
                 budget_bytes: int | None, warmups: int | None, steps: int | None) -> list[str]:
    a = ["--experiment", experiment, "--preset", preset, "--process", str(process),
         "--seed", str(seed), "--device", device]
    if budget_bytes is not None:
        a += ["--budget", str(int(budget_bytes))]
    if warmups is not None:
        a += ["--warmups", str(warmups)]
    if steps is not None:
        a += ["--steps", str(steps)]
    return a
