"""CLI commands: ``stateremat verify finite|engines|alias`` (registered on import).

Every command writes raw rows through :class:`stateremat.contract.RecordStore` (resumable:
rerunning with the same ``--out`` skips finished programs), shows a progress bar and then
recomputes its summary from the stored rows by separate code (``stateremat.finite._summary``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import typer

from ._app import check_json_target as _check_json_target, fail, verify_app

CHUNK = 64  # units per Parquet part: an interrupt loses at most one chunk of work


def run_units(out: Path, table: str, key: Sequence[str], meta: dict, units: Iterable[tuple],
              rows_of: Callable[..., list], description: str) -> None:
    """Run ``rows_of(*unit)`` for every unit not yet recorded under ``out/table``.

    Args:
        out: run folder.
        table: records table name.
        key: row key columns; the first ``len(unit)`` of them identify a unit.
        meta: run configuration (a resumed run must pass the same).
        units: tuples matching the leading key columns.
        rows_of: returns the raw rows of one unit.
        description: progress-bar label.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..contract import RecordStore

    store = RecordStore(out, table, key=list(key), meta=meta)
    units = list(units)
    n_unit_cols = len(units[0]) if units else 0
    done = {k[:n_unit_cols] for k in store.done_keys()}
    todo = [u for u in units if u not in done]
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, transient=False) as bar:
        task = bar.add_task(description, total=len(units), completed=len(units) - len(todo))
        for start in range(0, len(todo), CHUNK):
            rows = []
            for u in todo[start:start + CHUNK]:
                rows.extend(rows_of(*u))
                bar.advance(task)
            store.append(rows)


def _emit(summary: dict, json_path: Optional[Path]) -> None:
    from ..contract import atomic_write_json

    if json_path is not None:
        atomic_write_json(json_path, summary)
    typer.echo(json.dumps(summary, indent=2, default=float))


def check_seed(command: str, seed: int) -> None:
    """Reject a negative base seed before anything is created (NumPy seeds must be >= 0)."""
    if seed < 0:
        raise fail(f"stateremat verify {command}: --seed must be a non-negative integer, got {seed}. "
                   "Tip: the paper's runs use --seed 0.")


def check_json_target(command: str, json_path: Optional[Path]) -> None:
    """Reject a ``--json`` target that cannot be written, before the run starts."""
    _check_json_target(f"stateremat verify {command}", json_path)


def parse_alias_seeds(seeds: str) -> list[int]:
    """``--seeds N`` (seeds ``0..N-1``) or a half-open range ``A:B`` of non-negative seeds."""
    tip = "Tip: use a count like 50 or a half-open range like 0:50."
    where = f"stateremat verify alias: --seeds {seeds!r}"
    from ..contract import parse_seed_range

    if ":" in seeds:
        try:
            seed_list = parse_seed_range(seeds)
        except ValueError as exc:
            raise fail(f"{where}: {exc}. {tip}")
        if seed_list[0] < 0:
            raise fail(f"{where}: seeds must be non-negative integers, got a range from {seed_list[0]}. {tip}")
        return seed_list
    text = seeds.strip()
    if not (text.lstrip("+-").isdigit()):
        raise fail(f"{where}: expected a seed count (a non-negative integer) or a range A:B. {tip}")
    n = int(text)
    if n < 1:
        raise fail(f"{where}: expected a seed count >= 1, got {n}. {tip}")
    return list(range(n))


def _exit_on_failures(command: str, fails: list[str]) -> None:
    """Exit 1 listing the failed contract targets (records and summary are already written)."""
    if fails:
        raise fail(f"stateremat verify {command}: {len(fails)} contract check(s) failed: "
                   + "; ".join(fails) + ". Tip: read the rows under --out (read_records) and look at the "
                   "outcome, max_error and message columns of the failing check.", code=1)


def _guard(fn):
    from ..contract import RecordsError

    try:
        return fn()
    except RecordsError as exc:  # a resume into another run's folder: bad input, nothing lost
        raise fail(str(exc))


def run_finite(out: Path, programs: int = 1024, seed: int = 0) -> dict:
    """Run both finite suites into ``out`` and return the summary recomputed from the rows.

    Args:
        out: records folder (table ``finite``).
        programs: programs per suite.
        seed: base seed; program ``i`` is drawn from ``default_rng([seed, suite, i])``.

    Returns:
        the dict of :func:`stateremat.finite._summary.summarise_finite`.

    References: paper §6.
    """
    from ..contract import read_records
    from ..finite._suite import finite_rows
    from ..finite._summary import summarise_finite

    units = [(s, seed, i) for s in ("derivative", "byte") for i in range(programs)]
    run_units(out, "finite", ["suite", "seed", "program", "check"],
              {"programs": programs, "seed": seed}, units, finite_rows, "finite suites")
    return summarise_finite(read_records(out, "finite"))


@verify_app.command("finite")
def verify_finite(
    programs: int = typer.Option(1024, "--programs", help="Programs per suite (derivative, byte)."),
    seed: int = typer.Option(0, "--seed", help="Base seed of the program generators."),
    out: Path = typer.Option(Path("out/verify-finite"), "--out", help="Records folder (resumable)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary JSON here."),
) -> None:
    """Derivative and byte suites of the finite NumPy reference (paper §6)."""
    if programs < 1:
        raise fail(f"stateremat verify finite: --programs must be >= 1, got {programs}. "
                   "Tip: the paper's suites use --programs 1024.")
    check_seed("finite", seed)
    check_json_target("finite", json_path)
    from ..finite._targets import finite_failures

    summary = _guard(lambda: run_finite(out, programs, seed))
    _emit(summary, json_path)
    _exit_on_failures("finite", finite_failures(summary, programs))


def run_default(out: Path) -> dict:
    """The main job's default for now: the finite suites into ``out/verify-finite``.

    Raises:
        typer.Exit: code 1 (after writing records and summary) when a contract target fails.
    """
    from ..finite._targets import finite_failures

    summary = run_finite(Path(out) / "verify-finite")
    _emit(summary, Path(out) / "verify-finite" / "summary.json")
    _exit_on_failures("finite", finite_failures(summary, 1024))
    return summary


def run_engines(out: Path, programs: int = 1200, seed: int = 0) -> dict:
    """Semantic study: every engine on every program into ``out`` (table ``engines``).

    Returns:
        the dict of :func:`stateremat.finite._summary.summarise_engines`.

    References: paper §7, Table 1, Table 3.
    """
    from ..contract import read_records
    from ..finite._study import engine_rows
    from ..finite._summary import summarise_engines

    run_units(out, "engines", ["seed", "program", "check", "engine"],
              {"programs": programs, "seed": seed}, [(seed, i) for i in range(programs)],
              engine_rows, "engine semantic study")
    return summarise_engines(read_records(out, "engines"))


def run_alias(out: Path, seeds: Sequence[int]) -> dict:
    """Joint-alias study: seeds x 3 patterns x dims 32/64 into ``out`` (table ``alias``).

    Returns:
        the dict of :func:`stateremat.finite._summary.summarise_alias`.

    References: paper §7, Table 3.
    """
    from ..contract import read_records
    from ..finite._study import ALIAS_DIMS, ALIAS_PATTERNS, alias_rows
    from ..finite._summary import summarise_alias

    units = [(s, p, d) for s in seeds for p in ALIAS_PATTERNS for d in ALIAS_DIMS]
    run_units(out, "alias", ["seed", "pattern", "dim", "check", "engine"], {"seeds": list(seeds)},
              units, alias_rows, "joint-alias study")
    return summarise_alias(read_records(out, "alias"))


@verify_app.command("engines")
def verify_engines(
    programs: int = typer.Option(1200, "--programs", help="Programs (families queue/prototype/recurrence)."),
    seed: int = typer.Option(0, "--seed", help="Base seed of the program generator."),
    out: Path = typer.Option(Path("out/verify-engines"), "--out", help="Records folder (resumable)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary JSON here."),
) -> None:
    """Five preservation engines on the semantic study (paper §7, Table 1)."""
    if programs < 1:
        raise fail(f"stateremat verify engines: --programs must be >= 1, got {programs}. "
                   "Tip: the paper's study uses --programs 1200.")
    check_seed("engines", seed)
    check_json_target("engines", json_path)
    from ..finite._study import ENGINE_NAMES
    from ..finite._targets import engines_failures

    summary = _guard(lambda: run_engines(out, programs, seed))
    _emit(summary, json_path)
    _exit_on_failures("engines", engines_failures(summary, programs, list(ENGINE_NAMES)))


@verify_app.command("alias")
def verify_alias(
    seeds: str = typer.Option("50", "--seeds", help="Number of seeds N (seeds 0..N-1) or a range A:B."),
    out: Path = typer.Option(Path("out/verify-alias"), "--out", help="Records folder (resumable)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary JSON here."),
) -> None:
    """Joint-alias study: seeds x 3 patterns x dims 32/64 (paper §7, Table 3)."""
    seed_list = parse_alias_seeds(seeds)
    check_json_target("alias", json_path)
    from ..finite._study import ALIAS_DIMS, ALIAS_PATTERNS, ENGINE_NAMES
    from ..finite._targets import alias_failures

    summary = _guard(lambda: run_alias(out, seed_list))
    _emit(summary, json_path)
    _exit_on_failures("alias", alias_failures(summary, len(seed_list), len(ENGINE_NAMES),
                                              len(ALIAS_PATTERNS) * len(ALIAS_DIMS)))
