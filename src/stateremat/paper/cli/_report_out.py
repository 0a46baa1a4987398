"""Where ``stateremat report`` may write: its ``--out`` folder and its output files.

``--out`` is either new (missing or empty) or a folder ``report`` itself wrote earlier for the
same run: ``report`` marks each ``--out`` folder with :data:`MARK`, naming the run folder it
renders (its real path). Anything else (another run's folder, a rows folder, a folder of other
files, a folder inside the run) is refused, so ``report`` never replaces what it did not write.

An output file is written only where nothing or a regular file is: a symbolic link (dangling
or not), a folder or a device there is refused before any work, never followed or replaced.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Iterable

from stateremat._shared.checks import check_out_dir, fail, printable
from stateremat._shared.io import DuplicateKeyError, atomic_write_json, loads_json, utc_now

#: The mark of a folder ``report --out`` wrote: ``{"command", "run", "created_utc"}``.
MARK = ".report.json"
_COMMAND = "stateremat report"


def _real(p: Path) -> str:
    return os.path.realpath(p)


def _marked_run(out: Path) -> str | None:
    """The run folder ``out``'s mark names, or None (no mark, or not one ``report`` wrote).

    Raises:
        DuplicateKeyError: the mark names a key twice (a reader would keep only the last, so
            it is not trusted; :func:`check_report_out` refuses it like a sidecar).
    """
    mark = out / MARK
    if mark.is_symlink() or not mark.is_file():
        return None
    try:
        doc = loads_json(mark.read_bytes().decode("utf-8"))
    except DuplicateKeyError:
        raise
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(doc, dict) and doc.get("command") == _COMMAND and isinstance(doc.get("run"), str):
        return doc["run"]
    return None


def _usable(run: Path, out: Path) -> bool:
    if not os.path.lexists(out):
        return True
    if out.is_symlink() or not out.is_dir():
        return False
    try:
        return not any(os.scandir(out)) or _marked_run(out) == _real(run)
    except (OSError, DuplicateKeyError):
        return False


def free_out(run: Path) -> Path:
    """A ``--out`` path ``report`` accepts for ``run``: ``<run>-report`` beside the run folder
    (``-2``, ``-3``, ... when that one is taken)."""
    base = Path(str(run).rstrip("/") or ".").absolute()
    for n in range(1, 1000):
        cand = base.parent / f"{base.name}-report{'' if n == 1 else f'-{n}'}"
        if _usable(run, cand):
            return cand
    return base.parent / f"{base.name}-report-new"  # pragma: no cover - 999 taken


def check_report_out(api: str, run: Path, out: Path) -> None:
    """Refuse ``--out`` unless it is missing, empty, or marked by ``report`` for ``run``.

    Raises:
        typer.Exit: (code 2) naming what is there, with a ``--out`` that works.
    """
    check_out_dir(api, out)  # a file, a device, a folder that cannot be written
    where = f"{api}: --out {printable(str(out))!r}"
    real_run, real_out = Path(_real(run)), Path(_real(out))
    tip = f"Tip: pass a new or empty folder, e.g. --out {printable(str(free_out(run)))}."
    if real_out == real_run:
        raise fail(f"{where} is the run folder itself. Tip: omit --out to write into it, or "
                   f"pass another folder, e.g. --out {printable(str(free_out(run)))}.")
    if real_run in real_out.parents:
        raise fail(f"{where} is inside the run folder {printable(str(run))!r} (its rows or "
                   f"other files live there; with --out nothing is written into it). {tip}")
    if not out.is_dir():
        return
    try:
        entries = sorted(e.name for e in os.scandir(out))
    except OSError as exc:
        raise fail(f"{where}: cannot list the folder ({exc.strerror or exc}). {tip}") from None
    if not entries:
        return
    try:
        owner = _marked_run(out)
    except DuplicateKeyError as exc:
        raise fail(f"{where}: its mark {MARK} is not one report wrote ({exc}); report writes "
                   f"each key once, so it was edited. {tip}") from None
    if owner is None:
        shown = ", ".join(repr(printable(e)) for e in entries[:3])
        raise fail(f"{where} already holds files report did not write (no {MARK} mark): "
                   f"{shown}{', ...' if len(entries) > 3 else ''}; it may be another run's "
                   f"folder, and its files would be replaced. {tip}")
    if owner != str(real_run):
        raise fail(f"{where} holds the report of another run ({printable(owner)!r}), not of "
                   f"{printable(str(run))!r}; it would be replaced. {tip}")


def mark_report_out(run: Path, out: Path) -> None:
    """Create ``out`` (when missing) and mark it as ``report``'s folder for ``run``."""
    out.mkdir(parents=True, exist_ok=True)
    if _marked_run(out) is None:
        atomic_write_json(out / MARK, {"command": _COMMAND, "run": _real(run),
                                       "created_utc": utc_now()})


def check_output_files(api: str, dest: Path, names: Iterable[str], tip_out: Path | None) -> None:
    """Refuse output files of ``dest`` that are not regular files when they exist (a symbolic
    link, dangling or not, a folder, a device): ``report`` never writes through a link or over
    something that is not a file.

    Raises:
        typer.Exit: (code 2) naming the entry and how to clear it.
    """
    for name in names:
        p = dest / name
        if p.is_symlink():
            what = f"a symbolic link (to {printable(os.readlink(p))!r})"
        elif not os.path.lexists(p) or p.is_file():
            continue
        elif p.is_dir():
            what = "a folder"
        else:
            what = "not a regular file"
        other = (f", or pass a new --out folder, e.g. --out {printable(str(tip_out))}"
                 if tip_out is not None else "")
        move = f"mv {shlex.quote(printable(str(p)))} {shlex.quote(printable(str(p)) + '.old')}"
        raise fail(f"{api}: {printable(str(p))!r}, where report writes its {name}, is {what}; "
                   f"report never writes through a link or over a non-file. Tip: move it away "
                   f"({move}){other}.")
