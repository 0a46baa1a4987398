"""Execution outcomes kept in every record (DESIGN.md, "outcome")."""
from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """Outcome of one execution compared with its reference.

    ``M`` match, ``R`` rejection (the framework raised), ``D`` divergence (ran and differs),
    ``UNSUPPORTED`` outside the supported domain (R8; never a made-up result).
    """

    M = "M"
    R = "R"
    D = "D"
    UNSUPPORTED = "unsupported"

    def __str__(self) -> str:  # so f-strings and records show "M", not "Outcome.M"
        return self.value
