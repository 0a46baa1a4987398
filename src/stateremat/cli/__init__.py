"""Command-line interface: ``stateremat`` (also ``python -m stateremat``).

Each command group is in its own module; importing it registers its commands.
"""
from __future__ import annotations

from ._app import app as app
from . import _main, _verify, _cohort, _bench, _moco, _profile, _plan, _report, _cohort_processes  # noqa: F401,E402  (registration)


def main() -> None:
    """Entry point of the ``stateremat`` console script.

    Bad input (a :class:`~stateremat.contract.ReplayError` such as ``ProfileCardError`` or
    ``RecordsError``, a ``ValueError`` or an ``OSError`` on a path) prints one ``error:`` line
    and exits 2 instead of a traceback; set ``STATEREMAT_TRACEBACK=1`` to see the traceback.
    """
    import os
    import sys

    from ..contract import ReplayError

    try:
        app(standalone_mode=True)
    except (ReplayError, ValueError, OSError) as exc:
        if os.environ.get("STATEREMAT_TRACEBACK"):
            raise
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
