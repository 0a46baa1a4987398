"""Command-line interface: ``stateremat`` (also ``python -m stateremat``).

Library commands ``profile`` and ``plan`` live here; the paper wing's commands (``verify``,
``cohort``, ``bench``, ``app``, ``report``, ``main``) are loaded from ``stateremat.paper.cli``
on first use.
"""
from __future__ import annotations

from ._app import app as app
from . import _plan, _profile  # noqa: F401,E402  (registration)

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``stateremat`` console script.

    Bad input (a :class:`~stateremat.contract.ReplayError` such as ``ProfileCardError``, a
    ``ValueError`` such as the paper wing's ``RecordsError``, or an ``OSError`` on a path) prints
    one ``error:`` line and exits 2 instead of a traceback; set ``STATEREMAT_TRACEBACK=1`` to see the traceback.
    SIGINT, SIGTERM or SIGHUP before a command installs its own stop handling (while the paper
    wing and its libraries are imported, say) prints one ``error: ... stopped by SIG...`` line
    and exits ``128 + signal``; one landing after the exit handlers (while the interpreter
    finalizes) is ignored, so a finished command keeps its exit status.
    """
    import os
    import sys

    from .._shared.signals import ignore_stops_at_final_exit, install_stop_handlers, stop_on_signal

    ignore_stops_at_final_exit()  # a stop landing while the interpreter finalizes: no death
    install_stop_handlers(stop_on_signal)  # a signal inherited as ignored (nohup) stays ignored
    from ..contract import ReplayError

    try:
        app(standalone_mode=True)
    except (ReplayError, ValueError, OSError) as exc:
        if os.environ.get("STATEREMAT_TRACEBACK"):
            raise
        print(f"error: {type(exc).__name__}: {exc}{_os_tip(exc)}", file=sys.stderr)
        sys.exit(2)


def _os_tip(exc: BaseException) -> str:
    """A tip for an OS error that needs one: a full disk (or quota) names what to free."""
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = ("the disk holding that path" if exc.filename is not None
                 else "the disk being written (or where the output is redirected)")
        return (f". Tip: free space on {where} (or raise the quota), then rerun the same "
                "command: a run resumes, keeping every unit it finished (nothing half-written "
                "is kept).")
    return ""
