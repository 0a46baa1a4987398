"""CLI commands: report (registered on import)."""
from __future__ import annotations

from pathlib import Path

import typer

from ._app import fail, paper_app


@paper_app.command("report")
def report(out_dir: Path = typer.Argument(..., help="Run folder holding raw records.")) -> None:
    """Recompute tables and figures from the raw records in OUT_DIR (every known table)."""
    from ...contract import RecordsError
    from ..report import REPORTERS, tables_in

    if not out_dir.is_dir():
        raise fail(f"stateremat report: {out_dir} is not a folder. Tip: pass the --out folder "
                   "of a run.")
    tables = tables_in(out_dir)
    if not tables:
        raise fail(f"stateremat report: {out_dir} holds no records (no <table>.json sidecar "
                   "next to a <table>/ folder). Tip: pass the --out folder of a finished or "
                   "interrupted run.")
    known = [t for t in tables if t in REPORTERS]
    unknown = [t for t in tables if t not in REPORTERS]
    if not known:
        raise fail(f"stateremat report: no reporter for the tables {unknown} in {out_dir}; "
                   f"known tables: {sorted(REPORTERS)}. Tip: this folder may come from a newer "
                   "stateremat.")
    for t in unknown:
        typer.echo(f"note: no reporter for table {t!r}; its rows are left as they are", err=True)
    for t in known:
        try:
            paths = REPORTERS[t](out_dir)
        except RecordsError as exc:
            raise fail(str(exc))
        for p in paths:
            typer.echo(f"{t}: wrote {p}")
