"""The paper wing's typer commands, their groups and shared argument checks.

``paper_app`` holds the paper commands (``verify``, ``cohort``, ``bench``, ``app``,
``report``, ``main``); the library's ``stateremat`` command loads it lazily, the first time
one of these names is asked for. Each command lives in its own module of this package and
registers itself on these objects; the modules are imported by ``stateremat.paper.cli``.
"""
from __future__ import annotations

import contextlib
import re
import signal
import threading
from pathlib import Path
from typing import Iterator, Optional

import typer

from stateremat._shared.checks import check_out_dir as check_out_dir, check_output_file, fail
from stateremat._shared.progress import STOPS, check_stop as check_stop
from stateremat._shared.signals import (
    ignore_stop_signals, install_stop_handlers, restore_stop_handlers,
)

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




def run_owns(*tables: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The entries a run writing records ``tables`` owns in its ``--out`` folder: each table's
    sidecar ``<table>.json`` and rows folder ``<table>/``, the files its reporter writes, and
    ``extra`` (the lock and temporary files are added by the checks themselves)."""
    from ..report import OUTPUTS

    names = [n for t in tables for n in (f"{t}.json", t, *OUTPUTS.get(t, ()))]
    return tuple(dict.fromkeys([*names, *extra]))


def check_json_target(api: str, json_path: Optional[Path], out: Optional[Path] = None,
                      owns: tuple[str, ...] = ()) -> None:
    """Reject a ``--json`` target that cannot or must not be written, before a run starts
    (:func:`stateremat._shared.checks.check_output_file`): ``-`` is standard output; a file the run in
    ``out`` owns (``owns``, see :func:`run_owns`) is refused.

    Raises:
        typer.Exit: (code 2) after printing what was wrong and a tip.
    """
    check_output_file(api, "--json", json_path, run=None if out is None else (out, owns),
                      stdout=True)


@contextlib.contextmanager
def guarded(api: str, out: Optional[Path] = None) -> Iterator[None]:
    """Run a command's work: bad records/cards become clean errors, and a stop keeps its rows.

    SIGINT (Ctrl-C), SIGTERM and SIGHUP interrupt the work with ``KeyboardInterrupt`` (and
    are remembered until acted on: :func:`check_stop`); the runners write every finished unit
    before it unwinds (atomically), and the command exits ``128 + signal`` saying that
    rerunning resumes.

    Raises:
        typer.Exit: code 2 on a ``RecordsError``/``ProfileCardError``; ``128 + signal`` on a stop.
    """
    from ...contract import ProfileCardError
    from ..records import RecordsError

    def stop(signum, frame):
        STOPS.append(signum)
        ignore_stop_signals()  # the cleanup below keeps finished work: a second signal must not cut it
        raise KeyboardInterrupt

    old = {}
    if threading.current_thread() is threading.main_thread():
        old = install_stop_handlers(stop)  # signals inherited as ignored (nohup, `cmd &`) stay ignored
    try:
        if out is not None:  # a folder belongs to the command that created it
            from ..records import claim_folder

            claim_folder(out, api)
        yield
    except KeyboardInterrupt:
        ignore_stop_signals()
        signum = STOPS[0] if STOPS else signal.SIGINT
        where = f" in {out}" if out is not None else ""
        raise fail(f"{api}: stopped by {signal.Signals(signum).name}; every finished unit's "
                   f"rows are kept{where}. Tip: rerun the same command to resume.",
                   code=128 + signum) from None
    except (RecordsError, ProfileCardError) as exc:
        raise fail_from(api, exc) from None
    finally:
        STOPS.clear()
        restore_stop_handlers(old)  # unless a stop began: then they stay ignored until the exit


def fail_from(api: str, exc: BaseException, code: int = 2) -> "typer.Exit":
    """:func:`fail` with an exception's message, said as the command's: it starts with
    ``api:`` (``stateremat app moco: ...``), in place of a library's own ``stateremat <part>:``
    prefix, before any other (``load_fashion_mnist: ...`` keeps its function name after it)."""
    message = str(exc)
    if not message.startswith(f"{api}:"):
        m = re.match(r"stateremat [a-z][\w .-]*?: ", message)
        message = f"{api}: {message[m.end():] if m else message}"
    return fail(message, code=code)


#: Shape presets of the chain experiments (bench, cohort processes, profile).
PRESETS = ("cpu", "cpu-faithful", "h100", "tiny")


def check_preset(api: str, preset: str) -> None:
    """Refuse an unknown ``--preset`` of the chain experiments."""
    if preset not in PRESETS:
        raise fail(f"{api}: --preset must be one of {', '.join(PRESETS)}, got {preset!r}. Tip: "
                   "cpu runs here in minutes (cpu-faithful: the paper's share of state copies in "
                   "a step, for time; tiny in seconds, for tests).")


def parse_budget(api: str, budget: Optional[str]) -> Optional[int]:
    """``--budget`` in bytes (None when not given); refused unless a positive size."""
    from ...contract import parse_size

    if budget is None:
        return None
    try:
        value = parse_size(budget)
    except ValueError as exc:
        raise fail(f"{api}: --budget: {exc}. Tip: e.g. --budget 46MiB.") from None
    if value <= 0:
        raise fail(f"{api}: --budget must be positive, got {budget!r}. Tip: e.g. --budget 46MiB.")
    return value
