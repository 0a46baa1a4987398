"""The paper wing's typer commands, their groups and shared argument checks.

``paper_app`` holds the paper commands (``verify``, ``cohort``, ``bench``, ``app``,
``report``, ``main``); the library's ``stateremat`` command loads it lazily, the first time
one of these names is asked for. Each command lives in its own module of this package and
registers itself on these objects; the modules are imported by ``stateremat.paper.cli``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from stateremat.cli import fail

paper_app = typer.Typer(name="stateremat", no_args_is_help=True, add_completion=False,
                        pretty_exceptions_enable=False)
verify_app = typer.Typer(help="Semantic checks against the independent NumPy reference.",
                         no_args_is_help=True)
cohort_app = typer.Typer(help="Cohorts: Torch/JAX replay semantics; independent-process timing.",
                         no_args_is_help=True)
bench_app = typer.Typer(help="Cost runtime experiments: calibrate, pressure, fair control.",
                        no_args_is_help=True)
app_app = typer.Typer(help="End-to-end applications (dense-queue MoCo).", no_args_is_help=True)

paper_app.add_typer(verify_app, name="verify")
paper_app.add_typer(cohort_app, name="cohort")
paper_app.add_typer(bench_app, name="bench")
paper_app.add_typer(app_app, name="app")



def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_json_target(api: str, json_path: Optional[Path]) -> None:
    """Reject a ``--json`` target that cannot be written, before a run starts.

    The target must not be a folder, and its nearest existing ancestor must be a writable
    folder (missing parent folders are created when the summary is written).

    Raises:
        typer.Exit: (code 2) after printing what was wrong and a tip.
    """
    if json_path is None:
        return
    where = f"{api}: --json {str(json_path)!r}"
    if json_path.is_dir():
        raise fail(f"{where} is a folder; expected a file path. Tip: use --json {json_path / 'summary.json'}.")
    parent = _nearest_existing(json_path.absolute().parent)
    if not parent.is_dir():
        raise fail(f"{where}: {parent} is a file, not a folder; expected a path inside a folder. "
                   "Tip: choose a --json path whose parent is (or can become) a folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise fail(f"{where}: folder {parent} is not writable. Tip: choose a --json path you can write.")


def check_out_dir(api: str, out: Path) -> None:
    """Reject an ``--out`` run folder that is a file or lies below a file, before a run starts.

    Raises:
        typer.Exit: (code 2) after printing what was wrong and a tip.
    """
    where = f"{api}: --out {str(out)!r}"
    if out.exists() and not out.is_dir():
        raise fail(f"{where} is a file, not a folder. Tip: pass a folder path (it is created if missing).")
    anc = _nearest_existing(out)
    if not anc.is_dir():
        raise fail(f"{where}: {anc} is a file, so the folder cannot be created. Tip: choose a "
                   "--out path inside a folder.")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise fail(f"{where}: folder {anc} is not writable. Tip: choose a --out folder you can write.")
