"""The paper wing's commands: ``verify``, ``cohort``, ``bench``, ``app``, ``report``, ``main``.

Importing this package registers them on :data:`paper_app`; the library's ``stateremat``
command serves them from there. With the library CLI, the only place that prints or draws
progress (``stateremat._shared.progress.progress_bar``).
"""
from __future__ import annotations

from ._app import paper_app as paper_app
from . import _main, _verify, _cohort, _bench, _moco, _report, _cohort_processes  # noqa: F401,E402  (registration)

__all__ = ["paper_app"]
