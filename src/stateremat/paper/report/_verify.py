"""Reports of the ``verify`` folders (finite suites, engine study, joint-alias study; §6, §7).

Each writes ``<table>_summary.json`` (the summary ``stateremat verify`` prints, recomputed from
the raw rows) and ``<table>.md`` (the same numbers as a two-column table).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

from ..._shared.io import atomic_write_bytes, atomic_write_json
from ..records import read_records
from ._registry import Expected, register_reporter
from ._tables import fmt, markdown_table

_TITLES = {"finite": "Finite suites (paper §6)", "engines": "Engine semantic study (paper §7, "
           "Table 1)", "alias": "Joint-alias study (paper §7, Table 3)"}


def _flat(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _flat(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, d


def _report(table: str, summarise: Callable[[Any], dict], out_dir: Path,
            dest: Path | None = None) -> list[Path]:
    out_dir = Path(out_dir)
    summary = summarise(read_records(out_dir, table))
    rows = [[k, fmt(v) if not isinstance(v, list) else ", ".join(map(str, v))]
            for k, v in _flat(summary)]
    md = f"# {_TITLES[table]}\n\nRecomputed from the raw rows in `{table}/`.\n\n" \
        + markdown_table(["quantity", "value"], rows)
    dest = Path(dest or out_dir)
    return [atomic_write_json(dest / f"{table}_summary.json", summary),
            atomic_write_bytes(dest / f"{table}.md", md.encode())]


def _expected_finite(doc: dict, out_dir: Path) -> Expected:
    c = doc["config"]
    return Expected(("suite", "seed", "program"),
                    [(s, int(c["seed"]), i) for s in ("derivative", "byte")
                     for i in range(int(c["programs"]))], None, "(suite, seed, program)")


def _expected_engines(doc: dict, out_dir: Path) -> Expected:
    c = doc["config"]
    return Expected(("seed", "program"), [(int(c["seed"]), i) for i in range(int(c["programs"]))],
                    None, "(seed, program)")


def _expected_alias(doc: dict, out_dir: Path) -> Expected:
    from ..verify import ALIAS_DIMS, ALIAS_PATTERNS

    return Expected(("seed", "pattern", "dim"),
                    [(int(s), p, d) for s in doc["config"]["seeds"] for p in ALIAS_PATTERNS
                     for d in ALIAS_DIMS], None, "(seed, pattern, dim)")


@register_reporter("finite", outputs=("finite_summary.json", "finite.md"),
                   expected=_expected_finite)
def report_finite(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Write ``finite_summary.json`` and ``finite.md`` from the ``finite`` rows."""
    from ..verify import summarise_finite

    return _report("finite", summarise_finite, out_dir, dest)


@register_reporter("engines", outputs=("engines_summary.json", "engines.md"),
                   expected=_expected_engines)
def report_engines(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Write ``engines_summary.json`` and ``engines.md`` from the ``engines`` rows."""
    from ..verify import summarise_engines

    return _report("engines", summarise_engines, out_dir, dest)


@register_reporter("alias", outputs=("alias_summary.json", "alias.md"), expected=_expected_alias)
def report_alias(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Write ``alias_summary.json`` and ``alias.md`` from the ``alias`` rows."""
    from ..verify import summarise_alias

    return _report("alias", summarise_alias, out_dir, dest)
