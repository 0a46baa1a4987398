"""Run the finite suites and studies into a records folder, resumably (paper §6, §7).

Every runner writes raw rows through :class:`~stateremat.paper.records.RecordStore`
(rerunning with the same ``out`` skips finished units) and then recomputes its summary from
the stored rows by separate code (:mod:`._summary`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Sequence

from .. import Progress, as_progress
from ..records import RecordStore, read_records
from ._study import ALIAS_DIMS, ALIAS_PATTERNS, alias_rows, engine_rows
from ._suite import finite_rows
from ._summary import summarise_alias, summarise_engines, summarise_finite

CHUNK = 64  # units per Parquet part: an interrupt loses at most one chunk of work


def run_units(out: Path, table: str, key: Sequence[str], meta: dict, units: Iterable[tuple],
              rows_of: Callable[..., list], description: str,
              progress: Progress | None = None) -> None:
    """Run ``rows_of(*unit)`` for every unit not yet recorded under ``out/table``.

    Args:
        out: run folder.
        table: records table name.
        key: row key columns; the first ``len(unit)`` of them identify a unit.
        meta: run configuration (a resumed run must pass the same).
        units: tuples matching the leading key columns.
        rows_of: returns the raw rows of one unit.
        description: progress label.
        progress: where to report units done (None: nowhere).

    Raises:
        RecordsError: ``out`` holds a run with another configuration.
    """
    store = RecordStore(out, table, key=list(key), meta=meta)
    units = list(units)
    n_unit_cols = len(units[0]) if units else 0
    done = {k[:n_unit_cols] for k in store.done_keys()}
    todo = [u for u in units if u not in done]
    task = as_progress(progress, "run_units").task(description, total=len(units),
                                                   completed=len(units) - len(todo))
    for start in range(0, len(todo), CHUNK):
        rows = []
        for u in todo[start:start + CHUNK]:
            rows.extend(rows_of(*u))
            task.advance()
        store.append(rows)


def run_finite(out: Path, programs: int = 1024, seed: int = 0,
               progress: Progress | None = None) -> dict:
    """Run both finite suites into ``out`` and return the summary recomputed from the rows.

    Args:
        out: records folder (table ``finite``).
        programs: programs per suite.
        seed: base seed; program ``i`` is drawn from ``default_rng([seed, suite, i])``.
        progress: where to report programs done (None: nowhere).

    Returns:
        the dict of :func:`~stateremat.paper.verify.summarise_finite`.

    References: paper §6.
    """
    units = [(s, seed, i) for s in ("derivative", "byte") for i in range(programs)]
    run_units(out, "finite", ["suite", "seed", "program", "check"],
              {"programs": programs, "seed": seed}, units, finite_rows, "finite suites", progress)
    return summarise_finite(read_records(out, "finite"))


def run_engines(out: Path, programs: int = 1200, seed: int = 0,
                progress: Progress | None = None) -> dict:
    """Semantic study: every engine on every program into ``out`` (table ``engines``).

    Returns:
        the dict of :func:`~stateremat.paper.verify.summarise_engines`.

    References: paper §7, Table 1, Table 3.
    """
    run_units(out, "engines", ["seed", "program", "check", "engine"],
              {"programs": programs, "seed": seed}, [(seed, i) for i in range(programs)],
              engine_rows, "engine semantic study", progress)
    return summarise_engines(read_records(out, "engines"))


def run_alias(out: Path, seeds: Sequence[int], progress: Progress | None = None) -> dict:
    """Joint-alias study: seeds x 3 patterns x dims 32/64 into ``out`` (table ``alias``).

    Returns:
        the dict of :func:`~stateremat.paper.verify.summarise_alias`.

    References: paper §7, Table 3.
    """
    units = [(s, p, d) for s in seeds for p in ALIAS_PATTERNS for d in ALIAS_DIMS]
    run_units(out, "alias", ["seed", "pattern", "dim", "check", "engine"], {"seeds": list(seeds)},
              units, alias_rows, "joint-alias study", progress)
    return summarise_alias(read_records(out, "alias"))
