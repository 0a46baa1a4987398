"""Is a run folder complete? Its rows against the units its config implies, table by table.

``stateremat report`` renders a table only when every unit its run's config implies has its
rows (count per method, seed and process), unless told ``--allow-incomplete``; a table it does
not render keeps its earlier outputs (never deleted: only a successful new one replaces one),
named as stale.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..records import RecordsError
from ..records import foreign_units_message, read_records, read_sidecar
from ._registry import (EXPECTED, OUTPUTS, REPORTERS, extra_units, missing_units, orphan_tables,
                        tables_in)

_SHOW = 5  # missing units named in a message


@dataclass
class TableStatus:
    """Completeness of one table of a run folder.

    Attributes:
        table: records table.
        rows: rows present.
        expected: units the config implies (None: not checked for this table).
        missing: units without (complete) rows.
        noun: what a unit is.
        problem: why completeness could not be judged (no sidecar, unreadable rows, ...).
    """

    table: str
    rows: int = 0
    expected: int | None = None
    missing: list[tuple] = field(default_factory=list)
    noun: str = ""
    problem: str | None = None
    why: dict[tuple, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Rows present, nothing missing and nothing wrong."""
        return self.problem is None and not self.missing and self.rows > 0

    @property
    def renderable(self) -> bool:
        """Whether ``--allow-incomplete`` can render it: its rows can be read and there are some."""
        return self.problem is None and self.rows > 0

    def message(self) -> str:
        """What is missing, in one line (names the first units)."""
        if self.problem is not None:
            return f"{self.table}: {self.problem}"
        if self.expected is None and self.rows == 0:
            return (f"{self.table}: no rows yet (0 rows present: the run stopped before its first "
                    "unit finished, or its parts were moved away), so there is nothing to render")
        shown = "; ".join(", ".join(map(str, u)) + (f" ({self.why[u]})" if u in self.why else "")
                          for u in self.missing[:_SHOW])
        more = f"; and {len(self.missing) - _SHOW:,} more" if len(self.missing) > _SHOW else ""
        if self.rows == 0:
            return (f"{self.table}: 0 of {self.expected:,} {self.noun} units have rows (0 rows "
                    "present: the run stopped before its first unit finished, or its parts were "
                    f"moved away); missing: {shown}{more}")
        return (f"{self.table}: {len(self.missing):,} of {self.expected:,} {self.noun} units have "
                f"no complete rows ({self.rows:,} rows present): {shown}{more}")


def _status(out_dir: Path, table: str) -> TableStatus:
    st = TableStatus(table)
    try:
        doc = read_sidecar(out_dir / f"{table}.json")
    except RecordsError as exc:
        st.problem = str(exc)
        return st
    if not isinstance(doc.get("config"), dict):  # said first: without it no row can be judged
        st.problem = (f"sidecar {out_dir / (table + '.json')} holds no run config (is it a "
                      "summary written over it?), so its rows cannot be checked or described. "
                      "Tip: restore the sidecar from a copy; rerunning the run's command with "
                      "the same --out cannot resume without it")
        return st
    try:
        rows = read_records(out_dir, table)
    except RecordsError as exc:
        st.problem = str(exc)
        return st
    st.rows = len(rows)
    if table not in EXPECTED:  # no rows at all: incomplete (message above), never rendered
        return st
    try:
        exp = EXPECTED[table](doc, out_dir)
    except RecordsError as exc:  # the run folder contradicts its config (e.g. a frozen card)
        st.problem = str(exc)
        return st
    except (KeyError, TypeError, ValueError):
        return st  # a config that does not say: the reporter judges the sidecar itself
    if exp is not None:
        st.expected, st.noun = len(exp.units), exp.noun
        extra = extra_units(rows, exp)
        if extra and exp.units:  # rows of a unit no launch asked for (no units: the config
            # does not say, as in a cohort made before requested_processes): never counted in
            st.problem = _foreign(out_dir, table, exp, extra)
            return st
        st.missing = missing_units(rows, exp)
        if exp.why is not None:
            st.why = {u: w for u in st.missing if (w := exp.why(u))}
    return st


def _foreign(out_dir: Path, table: str, exp, extra: list[tuple]) -> str:
    return foreign_units_message(out_dir, table, exp.columns, len(exp.units), exp.noun, extra)


def check_complete(out_dir: str | Path) -> dict[str, TableStatus]:
    """Completeness of every table of ``out_dir`` a reporter knows, and of folders of rows
    whose sidecar is missing.

    Returns:
        ``{table: TableStatus}``.
    """
    out_dir = Path(out_dir)
    out = {t: _status(out_dir, t) for t in tables_in(out_dir) if t in REPORTERS}
    for t in orphan_tables(out_dir):
        out[t] = TableStatus(t, problem=f"rows in {out_dir / t} but no sidecar "
                             f"{out_dir / (t + '.json')}, so nothing says which run wrote them "
                             "(restore the sidecar from a copy)")
    return out


def stale_outputs(out_dir: str | Path, table: str) -> list[Path]:
    """The files ``table``'s reporter wrote earlier into ``out_dir`` (regular files there),
    which are stale when its rows fall short; ``report`` names them and never deletes them."""
    return [p for name in OUTPUTS.get(table, ()) if (p := Path(out_dir) / name).is_file()
            and not p.is_symlink()]
