"""What a runner reports while it works; only the CLI draws it (DESIGN.md, "CLI conventions").

Runners take ``progress=`` (a :class:`Progress`, or ``None``/``False`` for none) and call
``progress.task(...)`` / ``task.advance()``; ``stateremat.paper.cli.progress_bar`` is the one
implementation that draws.
"""
from __future__ import annotations

from typing import Protocol


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
                        "Tip: pass `with stateremat.paper.cli.progress_bar() as bar: ...` "
                        "progress=bar, or None.")
    return progress
