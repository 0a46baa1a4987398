"""Parsing of sizes (bytes, KiB/MiB/GiB) and half-open seed ranges ``A:B``."""
from __future__ import annotations

import math
import re
from decimal import Decimal, localcontext

#: sizes above this are rejected: far beyond any device, and int64 sums must not overflow
MAX_SIZE_BYTES = 2**53

_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
#: The units :func:`parse_size` accepts, for messages.
UNITS_HELP = "use B, KiB, MiB, GiB, TiB (powers of 1024) or kB, MB, GB, TB (powers of 1000)"


def parse_size(text: str | int | float) -> int:
    """Parse ``"32GiB"``, ``"512 MiB"``, ``"46.5MiB"``, ``"1e3"``, ``"4096"`` or an int into bytes.

    Binary units (B, KiB/MiB/GiB/TiB) are powers of 1024, decimal ones (kB/MB/GB/TB) of 1000
    (case-insensitive). The result must be a whole number of bytes (``"46.7"`` and ``"46.7MiB"``
    are refused, ``"46.5MiB"`` is 48,758,784 bytes) and at most :data:`MAX_SIZE_BYTES`.

    Raises:
        ValueError: a negative size, an unknown unit, unparsable text, a fractional number of
            bytes or a size above the maximum (the message names the size, never its digits
            when it is huge).
    """
    if isinstance(text, bool):
        raise ValueError(f"size {text!r}: expected a number of bytes, got a bool")
    if isinstance(text, int):
        value, unit, raw_unit = Decimal(text), "", ""
    elif isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"size {text!r}: must be finite")
        value, unit, raw_unit = Decimal(text), "", ""
    else:
        m = re.fullmatch(r"\s*(-?)([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        if not m:
            shown = str(text) if len(str(text)) <= 40 else str(text)[:40] + "..."
            raise ValueError(f"size {shown!r}: expected a number of bytes with an optional unit, "
                             "e.g. 4096, 64MiB, 32GiB")
        if len(m.group(2)) > 40:
            raise ValueError(f"size {m.group(2)[:20]}...: number too long (over 40 characters)")
        value, raw_unit = Decimal(m.group(2)), m.group(3)
        unit = raw_unit.lower()  # exact: no float rounding
        if m.group(1) and value != 0:
            value = -value
    if unit not in _UNITS:
        raise ValueError(f"size {text!r}: unknown unit {raw_unit!r}; {UNITS_HELP}")
    if value < 0:
        raise ValueError(f"size {text!r}: must not be negative")
    if value != 0 and value.adjusted() > 20:  # > 10**20: far above the maximum, whatever the unit
        raise ValueError(f"size {text!r} is above the supported maximum of {MAX_SIZE_BYTES:,} "
                         "bytes (8 PiB)")
    if value != 0 and value.adjusted() < -30:  # below 10**-30 bytes times any unit: not whole
        raise ValueError(f"size {text!r} is a fraction of a byte, not a whole number of bytes")
    with localcontext() as ctx:
        ctx.prec = 100  # exact: at most 40 digits times a unit of at most 13 digits
        nbytes = value * _UNITS[unit]
    if nbytes > MAX_SIZE_BYTES:
        raise ValueError(f"size {text!r} is above the supported maximum of {MAX_SIZE_BYTES:,} "
                         "bytes (8 PiB)")
    if nbytes != nbytes.to_integral_value():
        raise ValueError(f"size {text!r} is {nbytes:,.2f} bytes, not a whole number of bytes")
    return int(nbytes)


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``."""
    for unit, f in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= f:
            return f"{n / f:.2f} {unit}"
    return f"{int(n)} B"
