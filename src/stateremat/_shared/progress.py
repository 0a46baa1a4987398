"""What a runner reports while it works; only the CLI draws it (DESIGN.md, "CLI conventions").

Runners take ``progress=`` (a :class:`Progress`, or ``None``/``False`` for none) and call
``progress.task(...)`` / ``task.advance()``; :func:`progress_bar` is the one implementation
that draws (the library's ``stateremat profile`` and every paper command use it). It checks the
stop flag (:data:`STOPS`, :func:`check_stop`) after every unit, so a stop is never lost.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Protocol


class Task(Protocol):
    """One progress line: a description and a count towards an optional total."""

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done."""

    def update(self, *, description: str | None = None, total: int | None = None,
               completed: int | None = None) -> None:
        """Change the description, the total or the completed count."""


class Progress(Protocol):
    """Where a runner reports its tasks and its notes (warnings a user should see)."""

    def task(self, description: str, total: int | None = None, completed: int = 0) -> Task:
        """Start a task line and return it."""

    def note(self, text: str) -> None:
        """Tell the user ``text`` (a warning that does not stop the run)."""


class _SilentTask:
    def advance(self, n: int = 1) -> None:
        pass

    def update(self, *, description: str | None = None, total: int | None = None,
               completed: int | None = None) -> None:
        pass


class _Silent:
    def task(self, description: str, total: int | None = None, completed: int = 0) -> Task:
        return _SilentTask()

    def note(self, text: str) -> None:
        pass


#: Reports nothing (the default of every runner).
NO_PROGRESS: Progress = _Silent()


def as_progress(progress: "Progress | bool | None", api: str) -> Progress:
    """``progress`` itself, or :data:`NO_PROGRESS` for ``None``/``False``.

    Args:
        progress: a :class:`Progress`, or ``None``/``False`` for none.
        api: the calling runner's name, for the error message.

    Returns:
        A :class:`Progress`.

    Raises:
        TypeError: ``progress=True`` (runners no longer draw bars themselves).
    """
    if progress is None or progress is False:
        return NO_PROGRESS
    if progress is True:
        raise TypeError(f"{api}: progress=True is not a progress reporter; runners do not draw. "
                        "Tip: pass `with stateremat._shared.progress.progress_bar() as bar: ...` "
                        "progress=bar, or None.")
    return progress


# --------------------------------------------------------------------------- the one bar
#: Signals a command's stop handler received and not yet acted on (see :func:`check_stop`).
STOPS: list[int] = []


def check_stop() -> None:
    """Raise ``KeyboardInterrupt`` if a stop signal arrived inside a command's stop handling and
    its ``KeyboardInterrupt`` was swallowed (raised inside a finalizer, say). The progress
    reporters call it after every unit, so a stop is never lost."""
    if STOPS:
        raise KeyboardInterrupt


def _warn(text: str) -> None:
    import typer

    typer.echo(f"warning: {text}", err=True)


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
        _warn(text)


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
        _warn(text)
