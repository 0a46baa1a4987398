"""``stateremat main``: the README's main job on its embedded default."""
from __future__ import annotations

from pathlib import Path

import typer

from ._app import app


@app.command("main")
def main_job(out: Path = typer.Option(Path("out"), "--out", help="Folder for all records.")) -> None:
    """Run the main job on the embedded default (currently: the finite verification suites)."""
    from . import _verify

    runner = getattr(_verify, "run_default", None)
    if runner is None:
        raise typer.Exit(f"stateremat main: no default job is registered yet")
    runner(out)
