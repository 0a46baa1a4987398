"""Registry of reporters: one per records table, so ``stateremat report DIR`` can render any run.

A reporter takes the run folder and returns the paths it wrote (markdown, CSV, PNG, SVG).
Reporters read raw rows (``read_records``) and recompute every number from them. Each also
names the files it writes (so ``report`` can check them and name them when stale) and, where
the run's config implies it, the units of work a complete run holds (:class:`Expected`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import pandas as pd

from ..records import units_outside

Reporter = Callable[..., list[Path]]  # (run folder, dest=None) -> paths written
REPORTERS: dict[str, Reporter] = {}
#: table -> file names its reporter writes into the run folder.
OUTPUTS: dict[str, tuple[str, ...]] = {}
#: table -> ``expected(sidecar document, run folder) -> Expected | None``.
EXPECTED: dict[str, Callable[[Mapping[str, Any], Path], "Expected | None"]] = {}


@dataclass(frozen=True)
class Expected:
    """The units of work a complete run of one table holds, from its config.

    Attributes:
        columns: the row columns naming a unit (``("process", "cell", "method")``).
        units: every unit the config implies (tuples over ``columns``).
        done: whether a unit's rows are complete (default: any row is enough).
        noun: what a unit is, for messages (``"(process, cell, method)"``).
        why: why a unit with rows is incomplete (called after ``done``), for messages; None:
            not said.
    """

    columns: tuple[str, ...]
    units: Collection[tuple]
    done: Callable[[pd.DataFrame], bool] | None = None
    noun: str = ""
    why: Callable[[tuple], str | None] | None = None


def register_reporter(table: str, outputs: tuple[str, ...] = (),
                      expected: Callable[[Mapping[str, Any], Path], Expected | None] | None = None
                      ) -> Callable[[Reporter], Reporter]:
    """Decorator: register ``fn`` as the reporter for runs holding records table ``table``.

    Args:
        table: records table name.
        outputs: the file names the reporter writes (checked before writing; named when stale).
        expected: the units a complete run of ``table`` holds (None: not checked).
    """

    def deco(fn: Reporter) -> Reporter:
        REPORTERS[table] = fn
        OUTPUTS[table] = tuple(outputs)
        if expected is not None:
            EXPECTED[table] = expected
        return fn

    return deco


def tables_in(out_dir: str | Path) -> list[str]:
    """Records tables present in ``out_dir`` (folders that have a ``<table>.json`` sidecar, and
    known tables whose sidecar is there but whose folder is missing or a broken link: reading
    them says so)."""
    d = Path(out_dir)
    return sorted(p.stem for p in d.glob("*.json")
                  if (d / p.stem).is_dir() or (d / p.stem).is_symlink()
                  or (p.stem in REPORTERS and not (d / p.stem).exists()))


def orphan_tables(out_dir: str | Path) -> list[str]:
    """Folders of ``out_dir`` holding Parquet parts but no ``<table>.json`` sidecar."""
    d = Path(out_dir)
    return sorted(p.name for p in d.iterdir() if p.is_dir() and not (d / f"{p.name}.json").exists()
                  and any(p.glob("part-*.parquet")))


def missing_units(rows: pd.DataFrame, exp: Expected) -> list[tuple]:
    """Units of ``exp`` with no rows (or whose rows ``exp.done`` finds incomplete), sorted."""
    have: set[tuple] = set()
    if not rows.empty and all(c in rows for c in exp.columns):
        for key, g in rows.groupby(list(exp.columns), sort=False):
            key = key if isinstance(key, tuple) else (key,)
            key = tuple(k.item() if hasattr(k, "item") else k for k in key)
            if exp.done is None or exp.done(g):
                have.add(key)
    return sorted((u for u in exp.units if u not in have), key=repr)


def extra_units(rows: pd.DataFrame, exp: Expected) -> list[tuple]:
    """Units that have rows but that no launch of the run asked for (not in ``exp.units``):
    rows the run did not write, sorted."""
    return units_outside(rows, exp.columns, exp.units)


def steps_done(steps: int) -> Callable[[pd.DataFrame], bool]:
    """A unit of timing rows is complete with steps ``0..steps-1``, or with one infeasible
    ``-1`` row alone (nothing measured; a -1 beside measured or feasible rows is no such unit)."""

    def done(g: pd.DataFrame) -> bool:
        got = [int(s) for s in g["step"]]
        if -1 in got:
            return got == [-1] and not ("feasible" in g and g["feasible"].fillna(True).any())
        return set(range(steps)) <= set(got)

    return done
