"""Rows of units no launch of a run asked for: never counted, never kept (issue 27).

A run's config (its sidecar) says which units of work it holds (``(seed, method)``, ``(process,
cell, method)``); rows of any other unit were not written by the run (a part of another run
copied in, a relabelled row). ``report`` refuses to count them and a resuming command refuses to
keep them, both with the same message naming the first part that holds one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Collection, Sequence

import pandas as pd

from ._errors import RecordsError

__all__ = ["units_outside", "first_part_holding", "foreign_units_message", "refuse_units_outside"]


def units_outside(rows: pd.DataFrame, columns: Sequence[str], units: Collection[tuple]) -> list[tuple]:
    """Units (tuples over ``columns``) that have rows but are not in ``units``, sorted."""
    if rows.empty or not all(c in rows for c in columns):
        return []
    want = set(units)
    got = {tuple(k.item() if hasattr(k, "item") else k for k in key)
           for key in rows[list(columns)].drop_duplicates().itertuples(index=False, name=None)}
    return sorted((u for u in got if u not in want), key=repr)


def first_part_holding(out_dir: str | Path, table: str, columns: Sequence[str], unit: tuple) -> Path:
    """The first part of ``table`` (in write order) with a row of ``unit`` (a tuple over
    ``columns``); the table's folder when no part has one."""
    import pyarrow.parquet as pq

    folder = Path(out_dir) / table
    for f in sorted(folder.glob("part-*.parquet")):
        cols = pq.read_table(f, columns=list(columns)).to_pydict()
        if unit in set(zip(*(cols[c] for c in columns))):
            return f
    return folder


def foreign_units_message(out_dir: str | Path, table: str, columns: Sequence[str], n_units: int,
                          noun: str, extra: list[tuple]) -> str:
    """The message for rows of units outside the run's config, naming the first part holding one."""
    out_dir = Path(out_dir)
    first, part = extra[0], first_part_holding(out_dir, table, columns, extra[0])
    more = f" (and {len(extra) - 1:,} more such unit(s))" if len(extra) > 1 else ""
    unit = ", ".join(map(str, first))
    return (f"stateremat records: {part} holds rows of {noun} unit {unit}, which no launch "
            f"of the run asked for (its config and sidecar {out_dir / (table + '.json')}: "
            f"{n_units:,} units){more}; the run did not write them (a part of another run "
            "copied in, or edited). Tip: move that part out of the folder (keep it if it belongs "
            "elsewhere), then rerun the run's command with the same --out")


def refuse_units_outside(out_dir: str | Path, table: str, columns: Sequence[str],
                         units: Collection[tuple] | None, noun: str) -> None:
    """Refuse ``table``'s rows in ``out_dir`` of units outside ``units`` (``None`` or empty: the
    config does not say, nothing is refused), before a command resumes the run.

    Raises:
        RecordsError: naming the first part holding such rows.
    """
    from ._store import read_records

    if not units or not (Path(out_dir) / table).is_dir():
        return
    extra = units_outside(read_records(out_dir, table, finished=False), columns, units)
    if extra:
        raise RecordsError(foreign_units_message(out_dir, table, columns, len(units), noun, extra) + ".")
