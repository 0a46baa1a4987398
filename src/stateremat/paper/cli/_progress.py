"""The one progress bar of the paper commands: draws what runners report (rich)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import typer

from .. import Progress
from ._app import check_stop


class _Task:
    def __init__(self, bar, task_id) -> None:
        self._bar, self._id = bar, task_id

    def advance(self, n: int = 1) -> None:
        check_stop()  # after every unit: a stop signal is acted on here at the latest
        if self._bar is not None:
            self._bar.advance(self._id, n)

    def update(self, *, description: str | None = None, total: int | None = None,
               completed: int | None = None) -> None:
        check_stop()
        if self._bar is not None:
            kw = {k: v for k, v in (("description", description), ("total", total),
                                    ("completed", completed)) if v is not None}
            self._bar.update(self._id, **kw)


class _Bar:
    def __init__(self, bar) -> None:
        self._bar = bar

    def task(self, description: str, total: int | None = None, completed: int = 0) -> _Task:
        return _Task(self._bar, self._bar.add_task(description, total=total, completed=completed))

    def note(self, text: str) -> None:
        typer.echo(f"warning: {text}", err=True)


@contextlib.contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress]:
    """A live progress bar for one command, on stderr (a silent reporter when ``enabled`` is False).

    Args:
        enabled: draw the bar; False gives a reporter that draws nothing but still prints notes.

    Yields:
        A :class:`~stateremat.paper.Progress` to pass to a runner's ``progress=``.
    """
    if not enabled:
        yield _Quiet()
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from rich.console import Console

    # on stderr: stdout carries only results (``--json -`` prints the JSON alone there)
    bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), TimeRemainingColumn(), transient=False,
                       console=Console(stderr=True))
    with bar:
        yield _Bar(bar)


class _Quiet:
    def task(self, description: str, total: int | None = None, completed: int = 0):
        return _Task(None, None)

    def note(self, text: str) -> None:
        typer.echo(f"warning: {text}", err=True)
