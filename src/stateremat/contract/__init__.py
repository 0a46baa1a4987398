"""Shared vocabulary of every layer: rules, options, outcomes, errors, profile cards, units.

This layer imports only the standard library, numpy and the private standard-library helpers
of ``stateremat._shared.io`` (atomic writes and hashes, for the card) (DESIGN.md, "Two wings").
The I/O, signal and provenance helpers the CLI and the paper wing use are not part of the
contract: they live in ``stateremat._shared`` (``io``, ``signals``). Its errors are the
replay contract's (``ReplayError`` and its kinds, ``ProfileCardError``); the paper wing's
``RecordsError`` is the paper's own (``stateremat.paper.records``). :func:`internal_assert` is
here because every layer raises it, the NumPy-only reference and the planner included, and the
contract is the one package they all may import.
"""
from ._errors import (
    ProfileCardError as ProfileCardError,
    ReplayDivergenceError as ReplayDivergenceError,
    ReplayError as ReplayError,
    UndeclaredStateError as UndeclaredStateError,
    UnsupportedError as UnsupportedError,
    internal_assert as internal_assert,
)
from ._options import OPTIONS as OPTIONS, Option as Option, OptionRegistry as OptionRegistry, RECOMPUTE_ONLY as RECOMPUTE_ONLY
from ._outcome import Outcome as Outcome
from ._rules import RULES as RULES, rule as rule
from ._units import format_bytes as format_bytes, parse_size as parse_size
from ._card import (
    OptionCost as OptionCost,
    ProfileCard as ProfileCard,
    SegmentCard as SegmentCard,
    card_options as card_options,
    load_card as load_card,
    save_card as save_card,
)


__all__ = [
    "OPTIONS", "Option", "OptionCost", "OptionRegistry", "Outcome", "ProfileCard",
    "ProfileCardError", "RECOMPUTE_ONLY", "RULES", "ReplayDivergenceError",
    "ReplayError", "SegmentCard", "UndeclaredStateError", "UnsupportedError", "card_options",
    "format_bytes", "internal_assert", "load_card", "parse_size", "rule",
    "save_card",
]
