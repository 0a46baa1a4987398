"""Parsing of sizes (bytes, KiB/MiB/GiB) and half-open seed ranges ``A:B``."""
from __future__ import annotations

import math
import re
from fractions import Fraction

#: sizes above this are rejected: far beyond any device, and int64 sums must not overflow
MAX_SIZE_BYTES = 2**53

_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def parse_size(text: str | int | float) -> int:
    """Parse ``"32GiB"``, ``"512 MiB"``, ``"4096"`` or an int into bytes.

    Binary units (KiB/MiB/GiB/TiB) are powers of 1024, decimal ones (kB/MB/GB) of 1000.

    Raises:
        ValueError: on a negative size, an unknown unit or unparsable text.
    """
    if isinstance(text, bool):
        raise ValueError(f"size {text!r}: expected a number of bytes, got a bool")
    if isinstance(text, int):
        value, unit = Fraction(text), ""
    elif isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"size {text!r}: must be finite")
        value, unit = Fraction(text), ""
    else:
        m = re.fullmatch(r"\s*(-?)([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        if not m:
            raise ValueError(f"size {text!r}: expected a number of bytes with an optional unit, "
                             "e.g. 4096, 64MiB, 32GiB")
        if len(m.group(2)) > 40:
            raise ValueError(f"size {text!r}: number too long")
        value, unit = Fraction(m.group(2)), m.group(3).lower()  # exact: no float rounding
        if m.group(1):
            value = -value
    if unit not in _UNITS:
        raise ValueError(f"size {text!r}: unknown unit {unit!r}; use B, KiB, MiB, GiB or TiB")
    if value < 0:
        raise ValueError(f"size {text!r}: must not be negative")
    nbytes = round(value * _UNITS[unit])
    if nbytes > MAX_SIZE_BYTES:
        raise ValueError(f"size {text!r}: {nbytes} bytes is above the supported maximum "
                         f"{MAX_SIZE_BYTES} (8 PiB)")
    return int(nbytes)


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``."""
    for unit, f in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= f:
            return f"{n / f:.2f} {unit}"
    return f"{int(n)} B"


def parse_seed_range(text: str) -> list[int]:
    """Parse a half-open seed range ``"A:B"`` (Python style) or a single seed ``"A"``.

    ``"2701:2703"`` is ``[2701, 2702]``.

    Raises:
        ValueError: if the text is not ``A`` or ``A:B`` with integers ``A < B``.
    """
    m = re.fullmatch(r"\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?", str(text))
    if not m:
        raise ValueError(f"seed range {text!r}: expected A:B (half-open, like 2701:2703) or one seed")
    if m.group(1).startswith("-") or (m.group(2) or "").startswith("-"):
        raise ValueError(f"seed range {text!r}: seeds must be non-negative integers "
                         "(NumPy and torch generators take seeds >= 0)")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) is not None else a + 1
    if b <= a:
        raise ValueError(f"seed range {text!r}: empty (A:B is half-open; need A < B)")
    return list(range(a, b))
