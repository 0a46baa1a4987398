"""Command-line interface: ``stateremat`` (also ``python -m stateremat``).

Each command group is in its own module; importing it registers its commands.
"""
from __future__ import annotations

from ._app import app as app
from . import _main, _verify, _cohort, _bench, _moco, _profile, _plan, _report, _cohort_processes  # noqa: F401,E402  (registration)


def main() -> None:
    """Entry point of the ``stateremat`` console script."""
    app()
