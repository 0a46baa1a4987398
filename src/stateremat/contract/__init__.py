"""Shared vocabulary of every layer: rules, options, outcomes, errors, profile cards, units.

This layer imports only the standard library and numpy (DESIGN.md, "Two wings").
"""
from ._errors import (
    ProfileCardError as ProfileCardError,
    RecordsError as RecordsError,
    ReplayDivergenceError as ReplayDivergenceError,
    ReplayError as ReplayError,
    UndeclaredStateError as UndeclaredStateError,
    UnsupportedError as UnsupportedError,
    internal_assert as internal_assert,
)
from ._io import (
    atomic_write_bytes as atomic_write_bytes,
    atomic_write_json as atomic_write_json,
    json_default as json_default,
    loadavg as loadavg,
    package_version as package_version,
    provenance as provenance,
    sha256_bytes as sha256_bytes,
    source_hash as source_hash,
    utc_now as utc_now,
)
from ._options import OPTIONS as OPTIONS, Option as Option, OptionRegistry as OptionRegistry, RECOMPUTE_ONLY as RECOMPUTE_ONLY
from ._outcome import Outcome as Outcome
from ._rules import RULES as RULES, rule as rule
from ._units import format_bytes as format_bytes, parse_seed_range as parse_seed_range, parse_size as parse_size
from ._card import (
    OptionCost as OptionCost,
    ProfileCard as ProfileCard,
    SegmentCard as SegmentCard,
    card_options as card_options,
    load_card as load_card,
    save_card as save_card,
)

from ._signals import (STOP_SIGNALS, ignore_stop_signals, install_stop_handlers,
                       restore_stop_handlers, stop_on_signal)

__all__ = [
    "OPTIONS", "Option", "OptionCost", "OptionRegistry", "Outcome", "ProfileCard",
    "ProfileCardError", "RECOMPUTE_ONLY", "RULES", "RecordsError", "ReplayDivergenceError",
    "ReplayError", "SegmentCard", "UndeclaredStateError", "UnsupportedError",
    "atomic_write_bytes", "atomic_write_json", "card_options", "format_bytes",
    "internal_assert", "json_default", "load_card", "loadavg", "package_version",
    "parse_seed_range", "parse_size", "provenance", "rule", "save_card", "sha256_bytes",
    "source_hash", "utc_now", "STOP_SIGNALS", "ignore_stop_signals", "install_stop_handlers",
    "restore_stop_handlers", "stop_on_signal",
]
