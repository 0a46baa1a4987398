"""``stateremat main``: the README's main job on its embedded default."""
from __future__ import annotations

from pathlib import Path

import typer

from stateremat._shared.checks import nonempty_path

from ._app import check_out_dir, paper_app
from ._bench import run_bench


@paper_app.command("main")
def main_job(
    out: Path = typer.Option(Path("out"), "--out", parser=nonempty_path, help="Folder for all records."),
    preset: str = typer.Option("cpu", "--preset", help="Shapes preset: cpu (minutes here), cpu-faithful (cpu with state / 64), h100 (the paper's shapes) or tiny (tests)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
) -> None:
    """The main job: ``bench fair`` — all seven methods on the large/sparse cell at the paper's
    44 GiB budget (§10, Table 6; at cpu scale 44/46.063 of the card's predicted all-eager peak);
    writes OUT/bench-fair and prints its table.

    Rerunning with the same --out resumes.
    """
    check_out_dir("stateremat main", out, owns=("bench-fair",))
    run_bench("fair", out / "bench-fair", preset, device, api="stateremat main", show_paths=False)
