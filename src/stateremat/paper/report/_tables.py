"""Shared table helpers: method display names, unit choice, markdown rendering."""
from __future__ import annotations

from typing import Any, Sequence

from .. import method_label

#: The seven methods in the paper's row order (Tables 6 and 7).
METHOD_ORDER = ("eager", "whole", "regions", "functional", "state_agnostic", "eager_whole", "joint")


def method_rank(method: str) -> int:
    """Position of ``method`` in the paper's row order (unknown methods last)."""
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """``(unit, divisor)`` for a column of byte values: GiB, MiB or KiB."""
    for unit, f in (("GiB", 1024**3), ("MiB", 1024**2)):
        if max_bytes >= f:
            return unit, float(f)
    return "KiB", 1024.0


def time_unit(max_s: float) -> tuple[str, float]:
    """``(unit, multiplier)`` for a column of seconds: ms below 100 s (as paper Table 7)."""
    return ("s", 1.0) if max_s >= 100.0 else ("ms", 1e3)


def fmt(x: Any, digits: int = 4) -> str:
    """Number for a table cell; ``—`` for missing values."""
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """GitHub-flavoured markdown table (first column left-aligned, the rest right)."""
    align = [":--"] + ["--:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(map(str, headers)) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
