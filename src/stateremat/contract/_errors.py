"""Error hierarchy shared by every layer.

Messages name the API, say expected vs got and end with one tip (STYLE.md §4).
"""
from __future__ import annotations


class ReplayError(RuntimeError):
    """Base class: a replay contract (see :data:`stateremat.contract.RULES`) cannot be honoured."""


class UndeclaredStateError(ReplayError):
    """An in-place write inside a checkpointed segment hit state that was not declared (R7)."""


class ReplayDivergenceError(ReplayError):
    """Recomputation produced values that differ from the original forward (R2–R4)."""


class UnsupportedError(ReplayError):
    """The input lies outside the supported domain (R8), e.g. differentiating integer bit writes."""


class ProfileCardError(ReplayError, ValueError):
    """A profile card is malformed: missing option, negative size, NaN time, unknown schema."""


def internal_assert(cond: bool, what: str) -> None:
    """Raise ``AssertionError`` saying this is a stateremat bug when ``cond`` is false."""
    if not cond:
        raise AssertionError(
            f"stateremat internal error: {what}. This is a bug in stateremat, please report it "
            "with the command you ran."
        )
