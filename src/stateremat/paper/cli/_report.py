"""CLI commands: report (registered on import)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from stateremat._shared.checks import nonempty_path

from stateremat._shared.checks import printable

from ._app import fail, guarded, paper_app


@paper_app.command("report")
def report(out_dir: Path = typer.Argument(..., parser=nonempty_path, help="Run folder holding raw records (any "
                                          "command's --out: verify, cohort, bench, app)."),
           out: Optional[Path] = typer.Option(
               None, "--out", help="Folder to write the tables and figures into (default: "
               "OUT_DIR itself): a new or empty folder, or one report wrote earlier for the "
               "same run (it marks it with .report.json); anything else is refused. With it, "
               "nothing is written into OUT_DIR, which may be read-only."),
           allow_incomplete: bool = typer.Option(
               False, "--allow-incomplete", help="Also render tables whose rows do not cover "
               "everything the run's config implies (and exit 0); say what is missing.")) -> None:
    """Recompute tables and figures from the raw records in OUT_DIR (every known table).

    A table is rendered only when its rows are complete for its run's config (every process,
    seed and method); otherwise what is missing is listed, its earlier outputs are kept but
    named as stale, and the command exits 1 (``--allow-incomplete`` renders what there is).
    Outputs are only ever replaced by new ones, never deleted. An output path holding a
    symbolic link, a folder or a device is refused (exit 2) before anything is written.
    """
    from ..report import OUTPUTS, REPORTERS, check_complete, orphan_tables, stale_outputs, tables_in
    from ._report_out import check_output_files, check_report_out, free_out, mark_report_out

    api = "stateremat report"
    if not out_dir.is_dir():
        raise fail(f"{api}: {out_dir} is not a folder. Tip: pass the --out folder of a run.")
    from ..records import check_not_writing, lock_run

    dest = out_dir if out is None else out
    if out is not None:
        check_report_out(api, out_dir, out)
    elif not os.access(out_dir, os.W_OK | os.X_OK):
        raise fail(f"{api}: {out_dir} is not writable, so its tables cannot be written there. "
                   "Tip: pass --out DIR to write them elsewhere (nothing is written into "
                   f"{out_dir} then).")

    def take_lock() -> None:
        # not while a run writes there: its outputs would be half-done
        if out is None:
            lock_run(out_dir)
        else:
            check_not_writing(out_dir)

    if (out_dir / ".run.lock").exists():  # a run's folder, maybe being written: say so first
        with guarded(api):
            take_lock()
    if not tables_in(out_dir) and not orphan_tables(out_dir):  # before the lock: nothing written
        raise fail(f"{api}: {out_dir} is not a run folder (no sidecars: it holds no records, no "
                   "<table>.json next to "
                   "a <table>/ folder of rows). Tip: pass the --out folder of a finished or "
                   "interrupted run.")
    with guarded(api):
        take_lock()
        status = check_complete(out_dir)
    tables = sorted(set(tables_in(out_dir)) | set(status))
    if not tables:
        raise fail(f"{api}: {out_dir} holds no records (no <table>.json sidecar next to a "
                   "<table>/ folder). Tip: pass the --out folder of a finished or interrupted "
                   "run.")
    known = [t for t in tables if t in REPORTERS]
    unknown = [t for t in tables if t not in REPORTERS and t in tables_in(out_dir)]
    if not known and not any(t in status for t in tables):
        raise fail(f"{api}: no reporter for the tables {unknown} in {out_dir}; known tables: "
                   f"{sorted(REPORTERS)}. Tip: this folder may come from a newer stateremat.")
    for t in unknown:
        typer.echo(f"note: no reporter for table {t!r}; its rows are left as they are", err=True)
    check_output_files(api, dest, [n for t in known for n in OUTPUTS.get(t, ())],
                       free_out(out_dir) if out is None else None)
    if out is not None:
        mark_report_out(out_dir, out)
    bad = []
    for t in tables:
        st = status.get(t)
        if st is not None and not st.complete:
            if not st.renderable or not allow_incomplete:
                bad.append(st)
                # never deleted: outputs are replaced only by new ones. They are stale only
                # when the rows were read and fall short; rows that cannot be read say nothing
                old = stale_outputs(dest, t) if st.problem is None else []
                typer.echo(printable(
                    f"incomplete: {st.message()}"
                    + (f" (earlier outputs kept but stale: {', '.join(p.name for p in old)})"
                       if old else "")), err=True)
                continue
            typer.echo(printable(f"warning: rendering incomplete rows: {st.message()}"), err=True)
        if t not in REPORTERS:
            continue
        with guarded(api):
            paths = REPORTERS[t](out_dir) if out is None else REPORTERS[t](out_dir, dest)
        for p in paths:
            typer.echo(printable(f"{t}: wrote {p}"))
    if bad and not (allow_incomplete and all(st.renderable for st in bad)):
        raise fail(f"{api}: {len(bad)} table(s) of {out_dir} not rendered: "
                   f"{', '.join(st.table for st in bad)} (see above). Tip: "
                   + _tip(bad, allow_incomplete),
                   code=2 if any(st.problem is not None for st in bad) else 1)


def _tip(bad: list, allow_incomplete: bool) -> str:
    """What to do about tables not rendered, as one sentence that works when followed."""
    if any(st.problem is not None for st in bad):
        return ("fix what is named above first (its tip says how; a rerun refuses the folder "
                "while it is there), then rerun the run's command with the same --out to redo "
                "or finish its rows.")
    tip = "rerun the run's command with the same --out to finish it"
    if not allow_incomplete and all(st.renderable for st in bad):  # then it exits 0
        tip += ", or pass --allow-incomplete to render the rows there are"
    return tip + "."
