"""Checks every command makes before any work: output paths, devices, memory estimates.

Commands call these before they measure, plan or write anything, so bad input costs nothing
and never replaces a file it should not (a FIFO, a device such as ``/dev/null``, a folder).
Each raises :class:`typer.Exit` (code 2) after printing one ``error:`` line with a tip.
"""
from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import typer

from ..contract import format_bytes


#: Largest seed any command accepts (seeds are NumPy/torch/JAX generator seeds; 32 bits).
MAX_SEED = 2**32 - 1


def fail(message: str, code: int = 2) -> "typer.Exit":
    """Print ``message`` to stderr and return an Exit to raise (bad input, not a crash).

    Args:
        message: what was wrong, expected vs got, and a tip.
        code: exit status (2: bad input; 1: a check failed).

    Returns:
        A ``typer.Exit`` for the caller to raise.
    """
    typer.echo(f"error: {printable(message)}", err=True)
    return typer.Exit(code)


def printable(text: str) -> str:
    """``text`` safe to print as UTF-8: bytes of a file name that are not UTF-8 (decoded by
    Python as surrogate escapes) are shown as ``\\xNN``, other lone surrogates as ``\\udNNN``."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that is no file-name byte
        return text.encode("utf-8", "backslashreplace").decode("utf-8")

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def _kind(path: Path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder (else None)."""
    if os.path.islink(path) and not path.exists():
        return "a broken symbolic link"
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    for test, name in _KINDS:
        if test(mode):
            return ("a symbolic link to " + name) if os.path.islink(path) else name
    return None


def in_range(lo: float, hi: float, tip: str, *, lo_open: bool = False) -> Callable[..., Any]:
    """A typer ``callback=`` refusing a number outside ``[lo, hi]`` (``(lo, hi]`` if
    ``lo_open``), NaN included, while the command line is parsed (before any work).

    The error names the command and option, the range and the value, and ends with ``tip``.
    """
    low = f"> {lo:,}" if lo_open else f">= {lo:,}"

    def check(ctx: typer.Context, param: Any, value: Any) -> Any:
        if value is None:
            return value
        ok = (value > lo if lo_open else value >= lo) and value <= hi
        if not ok or (isinstance(value, float) and math.isnan(value)):
            raise fail(f"{ctx.command_path}: {param.opts[0]} must be {low} and <= {hi:,}, got "
                       f"{value}. Tip: {tip}.")
        return value

    return check


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def _check_names(where: str, path: Path, option: str) -> None:
    """Refuse a path with a name longer than the file system allows (before anything stats it:
    the OS refuses such a path with a bare ``File name too long``)."""
    try:
        name_max = os.pathconf(_nearest_existing(path), "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for part, n in zip(path.parts, map(os.fsencode, path.parts)):
        if len(n) > name_max:
            raise fail(f"{where}: the name {part[:40]!r}... is {len(n):,} bytes, past the file "
                       f"system's limit of {name_max} bytes for one name, so it cannot be created. "
                       f"Tip: choose a {option} path with shorter names.")


def _check_parent(where: str, path: Path, option: str) -> None:
    parent = _nearest_existing(path.absolute().parent)
    if not parent.is_dir():
        raise fail(f"{where}: {parent} is a file, not a folder, so {path.name!r} cannot be "
                   f"created there. Tip: choose a {option} path inside a folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise fail(f"{where}: folder {parent} is not writable. Tip: choose a {option} path you "
                   "can write.")


def nonempty_path(text: Any) -> Path:
    """A typer ``parser=`` for path options and arguments: ``""`` is refused while the command
    line is parsed (typer would read it as ``.``, the current folder)."""
    if text is None or isinstance(text, Path):
        return text
    if str(text) == "":
        raise typer.BadParameter("an empty path is not allowed. Tip: name a file or folder "
                                 "(use . for the current folder).")
    return Path(text)


#: Name of standard output where an output file is asked for (``--json -``).
STDOUT = "-"


def is_stdout(path: Path | None) -> bool:
    """Whether an output path is ``-`` (standard output)."""
    return path is not None and str(path) == STDOUT


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _matches(name: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(name, pattern)


#: Files every run folder's writer owns besides its tables: the lock, atomic writes'
#: temporary files and the work folder (see ``stateremat.paper.records.lock_run``).
RUN_FILES = (".run.lock", ".run.json", ".*.tmp", ".tmp")


def run_file(out: Path, path: Path, owns: Collection[str]) -> str | None:
    """The entry of run folder ``out`` that writing ``path`` would replace or write into, when
    that entry is one the run owns (a name or glob of ``owns`` or :data:`RUN_FILES`; its own
    folders include everything under them), else None."""
    try:
        rel = Path(os.path.realpath(path)).relative_to(os.path.realpath(out))
    except ValueError:
        return None
    if not rel.parts:
        return None
    first = rel.parts[0]
    patterns = (*owns, *RUN_FILES)
    if any(_matches(first, pat) for pat in patterns) or any(_matches(rel.name, pat) for pat in RUN_FILES):
        return str(rel)
    return None


def _stdout_closed() -> bool:
    # Python starts with sys.stdout None when file descriptor 1 is closed (`cmd >&-`); the
    # text would then be dropped without a word.
    import sys

    out = sys.stdout
    if out is None:
        return True
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory stream (a test's runner)
        return getattr(out, "closed", False)
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def check_output_file(api: str, option: str, path: Path | None, *,
                      inputs: Sequence[tuple[str, Path]] = (),
                      run: tuple[Path, Collection[str]] | None = None,
                      stdout: bool = False) -> None:
    """Refuse an output *file* path that cannot or must not be written, before any work.

    Refused: ``-`` unless ``stdout`` (the command then writes to standard output); a folder;
    anything that exists and is not a regular file (a device such as ``/dev/null``, a FIFO, a
    socket, a symbolic link to one, a broken link), because the atomic write would replace it;
    the same file as an input (same path, a link to it, a hard link, a ``..`` path); a file the
    run in folder ``run`` owns (its sidecars, rows, lock, summaries, temporary files); a path
    whose nearest existing parent is not a writable folder (missing parent folders are created
    when the file is written). A symbolic link to a regular file is fine: its target is written.

    Args:
        api: command name for the message (``"stateremat plan"``).
        option: the option naming the path (``"--json"``).
        path: the path, or None (nothing to check).
        inputs: ``(label, path)`` of what the command reads (``("CARD.json", card_path)``).
        run: ``(run folder, names/globs of the entries the run writes there)``.
        stdout: whether ``-`` means standard output here.

    Raises:
        typer.Exit: (code 2) after printing what was wrong and a tip.
    """
    if path is None:
        return
    path = Path(path)
    where = f"{api}: {option} {str(path)!r}"
    if str(path) == "":
        raise fail(f"{where}: an empty path is not allowed. Tip: name a file.")
    if is_stdout(path):
        if stdout:
            if _stdout_closed():
                raise fail(f"{where}: standard output is closed (e.g. `>&-`), so the JSON "
                           "written there would be lost. Tip: leave standard output open "
                           f"(redirect it to a file), or name a file, e.g. {option} out.json.")
            return
        raise fail(f"{where}: '-' (standard output) is not supported here; the output is a file "
                   f"written atomically. Tip: name a file, e.g. {option} out.json.")
    _check_names(where, path, option)
    if path.is_dir():
        raise fail(f"{where} is a folder; expected a file path. Tip: e.g. {option} "
                   f"{path / 'out.json'}.")
    kind = _kind(path)
    if kind is not None:
        raise fail(f"{where} exists and is {kind}, not a regular file; writing the output "
                   "would replace it. Tip: choose a regular file path.")
    for label, src in inputs:
        if src is not None and os.path.lexists(path) and _same_file(path, Path(src)):
            raise fail(f"{where} is the same file as the input {label} ({str(src)!r}); writing "
                       "the output would replace it. Tip: choose another output path.")
    if run is not None:
        folder, owns = run
        own = run_file(Path(folder), path, owns)
        if own is not None:
            raise fail(f"{where} would replace the run's own file {own!r} in {str(folder)!r} "
                       "(its records, sidecar, lock or reports). Tip: write it elsewhere, or "
                       f"under another name such as {option} {Path(folder) / 'summary.json'}.")
    _check_parent(where, path, option)


def check_out_dir(api: str, out: Path, option: str = "--out", *,
                  owns: Collection[str] = ()) -> None:
    """Refuse a run folder that is not (and cannot become) a writable folder, before any work.

    Also refuses a folder whose entries the run writes (``owns``: names or globs, and
    :data:`RUN_FILES`) include one that is neither a regular file nor a folder (a FIFO, a
    device, a link to one): the run would replace it. Other entries are left alone.

    Raises:
        typer.Exit: (code 2) after printing what was wrong and a tip.
    """
    out = Path(out)
    where = f"{api}: {option} {str(out)!r}"
    if str(out) == "":
        raise fail(f"{where}: an empty path is not allowed. Tip: name a folder.")
    _check_names(where, out, option)
    kind = _kind(out)
    if kind is not None or (out.exists() and not out.is_dir()):
        raise fail(f"{where} is {kind or 'a file'}, not a folder. Tip: pass a folder path (it "
                   "is created if missing).")
    if out.is_dir():
        if not os.access(out, os.W_OK | os.X_OK):
            raise fail(f"{where}: the folder is not writable. Tip: choose a {option} folder you "
                       "can write.")
        patterns = (*owns, *RUN_FILES)
        for entry in sorted(out.iterdir()):
            if not any(_matches(entry.name, pat) for pat in patterns):
                continue
            kind = _kind(entry)
            if kind is not None:
                raise fail(f"{where}: {entry.name!r} in it is {kind}, not a regular file; this "
                           "run's outputs would replace it. Tip: move it away or use another "
                           f"{option} folder.")
        return
    _check_parent(where, out, option)


def check_device(api: str, device: str, *, auto: bool = False) -> str:
    """Refuse a device name other than ``cpu``/``cuda``/``cuda:N`` (and ``auto`` if allowed),
    or a CUDA device torch cannot see, before any work.

    Returns:
        ``device`` unchanged (``auto`` is resolved by the caller).

    Raises:
        typer.Exit: (code 2) after printing what was wrong and a tip.
    """
    names = "auto, cpu, cuda or cuda:N" if auto else "cpu, cuda or cuda:N"
    if device == "cpu" or (auto and device == "auto"):
        return device
    if not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise fail(f"{api}: --device must be {names}, got {device!r}. Tip: use --device "
                   f"{'auto' if auto else 'cpu'} here.")
    import torch

    if not torch.cuda.is_available():
        raise fail(f"{api}: --device {device}, but this torch ({torch.__version__}) sees no "
                   "CUDA device. Tip: use --device cpu.")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise fail(f"{api}: --device {device}, but only {torch.cuda.device_count()} CUDA "
                   "device(s) are visible. Tip: use cuda:0.")
    return device


def available_memory_bytes(device: str = "cpu") -> int | None:
    """Bytes this machine can still give (``MemAvailable``; on CUDA the device's free memory),
    or None when unknown."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil is optional: read /proc/meminfo where there is one
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
    return None


def check_memory(api: str, what: str, estimate_bytes: int, device: str = "cpu",
                 tip: str = "use a smaller size or count") -> None:
    """Refuse work whose estimated allocation exceeds what the machine (or device) has.

    Args:
        api: command name for the message.
        what: what the estimate is of, with the options that set it.
        estimate_bytes: estimated peak allocation, bytes.
        device: where it would be allocated (``cpu`` or ``cuda[:N]``).
        tip: what to change.

    Raises:
        typer.Exit: (code 2) naming the estimate and what is available.
    """

    have = available_memory_bytes(device)
    if have is not None and estimate_bytes > have:
        where = "this machine has" if device == "cpu" else f"{device} has"
        raise fail(f"{api}: {what} needs about {format_bytes(estimate_bytes)} "
                   f"({estimate_bytes:,} bytes, estimated), but {where} "
                   f"{format_bytes(have)} available. Tip: {tip}.")
