"""Profile cards: measured per-segment option costs, the planner's only input (paper §4).

A card is JSON with a versioned schema (``schema_version: 1``)::

    {"schema_version": 1, "persistent_bytes": 123,
     "segments": [{"name": "seg0",
                   "options": {"eager":  {"retained_bytes": 1, "temp_bytes": 2, "time_s": 0.1},
                               "whole":  {...}, "region": {...}, "recompute_only": {...}},
                   "meta": {...}}, ...],
     "meta": {"device": ..., "dtype": ..., "workload": {...}, "method": ..., "source_hash": ...}}

Options per segment are those of :data:`stateremat.contract.OPTIONS` (read when a card is
built, so a registered option is accepted at once) plus the card-only ``recompute_only`` view:

* ``eager`` (required): keep the segment's activations; no replay, so no state preservation.
* ``whole`` (required): discard activations, replay in backward from a whole snapshot of the
  segment's declared state (R2, R5).
* ``region`` (optional): replay from a journal of the written regions only (R6). Omitted when the
  segment has no declared state; then only ``eager``/``whole`` apply there.
* ``recompute_only`` (optional, never executed): the cost of replay *without* any state
  preservation, i.e. ``whole`` minus its preservation memory and time. Only the
  ``state_agnostic`` control planner reads it (it is the cost such a planner believes ``whole``
  has, §4). When absent, the control falls back to ``whole``'s own costs for that segment
  (preservation cost treated as unknown = zero omitted), which makes the control coincide with
  ``eager_whole`` there; the planner's explanation says so.

Per option: ``retained_bytes`` ``r`` (held from forward to backward), ``temp_bytes`` ``q``
(transient workspace while the segment runs or replays; the budget charges only the maximum),
``time_s`` ``c`` (forward + backward seconds of the segment under that option, replay and
preservation included). Persistent bytes ``P`` (parameters, optimiser state, state buffers)
are charged once. The static model is ``P + Σ r + max q ≤ M`` (eq. 3).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from ._errors import ProfileCardError
from .._shared.io import (DuplicateKeyError, atomic_write_json, loads_json, read_regular_bytes,
                          source_hash)
from ._options import OPTIONS, RECOMPUTE_ONLY

SCHEMA_VERSION = 1
_COST_KEYS = ("retained_bytes", "temp_bytes", "time_s")
#: Largest size of one field (8 PiB): exact in float64, far above any device.
MAX_BYTES = 2**53
#: Largest ``P + Σ_i max_o r + max_{i,o} q`` of a card: planners sum sizes in int64 (< 2^63)
#: and use 2^62 as an absent-option placeholder, so every real total must stay below it.
MAX_TOTAL_BYTES = 2**62 - 1
_TIP = "Tip: see the schema in the docstring of stateremat.contract.ProfileCard."
#: Deepest nesting of a card's free-form ``meta`` (writers of plans and records recurse into it).
MAX_META_DEPTH = 64


def _check_text(value: str, where: str) -> None:
    """Refuse a string that is not valid Unicode text (a lone surrogate cannot be printed or
    written as UTF-8, so the card would fail half-way through a table or a record)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _err(where, f"expected valid Unicode text, got {value!r} with a lone surrogate "
                          f"at index {exc.start}",
                   "Tip: a JSON escape such as \\ud800 without its pair is not a character; "
                   "rename it.") from None


def _check_depth(obj: Any, where: str) -> None:
    """Refuse ``meta`` nested deeper than :data:`MAX_META_DEPTH` (iteratively: no recursion),
    or holding a string that is not valid Unicode text."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > MAX_META_DEPTH:
            raise _err(where, f"nested more than {MAX_META_DEPTH} levels deep",
                       "Tip: card metadata is a few levels of names and numbers; check the file.")
        if isinstance(o, str):
            _check_text(o, where)
        elif isinstance(o, Mapping):
            for key in o:
                if isinstance(key, str):
                    _check_text(key, where)
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend((v, d + 1) for v in o)


def required_options() -> tuple[str, ...]:
    """Options every card segment must carry (registered with ``required=True``), now."""
    return tuple(o.name for o in OPTIONS if o.required)


def card_options() -> tuple[str, ...]:
    """Every option name a card may carry, in canonical order: the registry, then ``recompute_only``."""
    return (*OPTIONS.names, RECOMPUTE_ONLY)


def _err(where: str, what: str, tip: str = _TIP) -> ProfileCardError:
    return ProfileCardError(f"profile card: {where}: {what}. {tip}")


def _as_bytes(value: Any, where: str) -> int:
    # JSON written by hand may say 1e9; accept integral floats, refuse bools and fractions.
    if value is None:
        raise _err(where, "expected a non-negative integer number of bytes, got null",
                   "Tip: null is how non-finite numbers are written; re-profile that segment.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _err(where, f"expected a non-negative integer number of bytes, got "
                          f"{type(value).__name__} {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise _err(where, f"expected a non-negative integer number of bytes, got {value!r}")
        value = int(value)
    if value < 0:
        raise _err(where, f"expected a non-negative integer number of bytes, got {value}")
    if value > MAX_BYTES:
        raise _err(where, f"expected at most 2^53 bytes (8 PiB), got {value}",
                   "Tip: sizes are bytes, not bits or elements; check the unit.")
    return int(value)


def _as_seconds(value: Any, where: str) -> float:
    if value is None:
        raise _err(where, "expected a finite non-negative time in seconds, got null",
                   "Tip: null is how NaN/inf are written; the measurement failed, re-profile.")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _err(where, f"expected a finite non-negative time in seconds, got "
                          f"{type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise _err(where, f"expected a finite non-negative time in seconds, got {value!r}",
                   "Tip: a NaN/inf time usually means the profiler's measurement failed; "
                   "re-profile that segment.")
    return value


class FrozenOptions(Mapping):
    """A read-only mapping of option name → :class:`OptionCost` (a card cannot change after
    validation; ``dict(...)`` gives a mutable copy)."""

    __slots__ = ("_d",)

    def __init__(self, items: Mapping[str, "OptionCost"]) -> None:
        object.__setattr__(self, "_d", dict(items))

    def __getitem__(self, key: str) -> "OptionCost":
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("profile card options are read-only; build a new SegmentCard")

    def __reduce__(self):
        return (FrozenOptions, (self._d,))

    def __repr__(self) -> str:
        return repr(self._d)


@dataclass(frozen=True)
class OptionCost:
    """Measured cost of one segment under one option.

    Args:
        retained_bytes: ``r``, bytes held from the segment's forward until its backward (int, ≥ 0).
        temp_bytes: ``q``, transient bytes while the segment runs or replays (int, ≥ 0).
        time_s: ``c``, forward + backward seconds under this option, preservation included.

    Raises:
        ProfileCardError: negative or non-integral sizes, NaN/inf/negative times, wrong types.

    References:
        Paper §4, eq. (3).
    """

    retained_bytes: int
    temp_bytes: int
    time_s: float

    def __post_init__(self) -> None:
        self._check("")

    def _check(self, where: str) -> None:
        """Validate (and normalise) every field; errors name ``where.field``."""
        at = f"{where}." if where else ""
        object.__setattr__(self, "retained_bytes",
                           _as_bytes(self.retained_bytes, f"{at}retained_bytes"))
        object.__setattr__(self, "temp_bytes", _as_bytes(self.temp_bytes, f"{at}temp_bytes"))
        object.__setattr__(self, "time_s", _as_seconds(self.time_s, f"{at}time_s"))

    @classmethod
    def from_dict(cls, d: Any, where: str = "option") -> "OptionCost":
        """Parse ``{"retained_bytes", "temp_bytes", "time_s"}``; errors name ``where`` and the field."""
        if not isinstance(d, Mapping):
            raise _err(where, f"expected an object with keys {list(_COST_KEYS)}, got "
                              f"{type(d).__name__}")
        missing = [k for k in _COST_KEYS if k not in d]
        if missing:
            raise _err(where, f"missing field(s) {missing}; expected {list(_COST_KEYS)}")
        extra = sorted(set(d) - set(_COST_KEYS))
        if extra:
            raise _err(where, f"unknown field(s) {extra}; expected {list(_COST_KEYS)}",
                       "Tip: check the spelling (sizes end in _bytes, times in _s).")
        return cls(_as_bytes(d["retained_bytes"], f"{where}.retained_bytes"),
                   _as_bytes(d["temp_bytes"], f"{where}.temp_bytes"),
                   _as_seconds(d["time_s"], f"{where}.time_s"))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this option."""
        return {"retained_bytes": self.retained_bytes, "temp_bytes": self.temp_bytes,
                "time_s": self.time_s}


@dataclass(frozen=True)
class SegmentCard:
    """Costs of one segment under each of its options.

    Args:
        name: unique segment name (matches the module/segment name the runtime applies plans to).
        options: option name (``eager``, ``whole``, optional ``region`` or any other registered
            option, optional ``recompute_only``) → :class:`OptionCost`. The required options of
            :data:`~stateremat.contract.OPTIONS` (``eager`` and ``whole``) must be present.
            Stored read-only (:class:`FrozenOptions`), in canonical option order.
        meta: free-form per-segment metadata (e.g. declared state bytes, write fraction).

    Raises:
        ProfileCardError: missing required option, unknown option name, bad name.

    Danger:
        ``recompute_only`` is expected to be at most ``whole`` in every field (it is ``whole``
        without preservation); this is not checked because measured times are noisy.
    """

    name: str
    options: Mapping[str, OptionCost]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise _err("segment", f"expected a non-empty string name, got {self.name!r}")
        _check_text(self.name, "segment name")
        where = f"segment {self.name!r}"
        if not isinstance(self.options, Mapping):
            raise _err(f"{where}.options", f"expected an object, got {type(self.options).__name__}")
        required, known = required_options(), card_options()
        missing = [o for o in required if o not in self.options]
        if missing:
            raise _err(f"{where}.options", f"missing option(s) {missing}; every segment needs "
                       f"{list(required)} (region is optional)")
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            raise _err(f"{where}.options", f"unknown option(s) {unknown}; expected a subset of "
                       f"{list(known)}", "Tip: check the spelling of the option names.")
        for o, cost in self.options.items():
            if not isinstance(cost, OptionCost):
                raise _err(f"{where}.options.{o}",
                           f"expected an OptionCost, got {type(cost).__name__}")
            cost._check(f"{where}.options.{o}")  # a value forced in after construction: caught
        if not isinstance(self.meta, Mapping):
            raise _err(f"{where}.meta", f"expected an object, got {type(self.meta).__name__}")
        _check_depth(self.meta, f"{where}.meta")
        # Canonical option order (eager, whole, region, ..., recompute_only) for stable output.
        object.__setattr__(self, "options", FrozenOptions({o: self.options[o] for o in known
                                                           if o in self.options}))
        object.__setattr__(self, "meta", dict(self.meta))

    @classmethod
    def from_dict(cls, d: Any, index: int = 0) -> "SegmentCard":
        """Parse one ``segments[i]`` entry; errors name the segment (or its index) and field."""
        if not isinstance(d, Mapping):
            raise _err(f"segments[{index}]", f"expected an object, got {type(d).__name__}")
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise _err(f"segments[{index}].name", f"expected a non-empty string, got {name!r}")
        where = f"segment {name!r}"
        extra = sorted(set(d) - {"name", "options", "meta"})
        if extra:
            raise _err(where, f"unknown field(s) {extra}; expected name, options, meta")
        opts = d.get("options")
        if not isinstance(opts, Mapping):
            raise _err(f"{where}.options", f"expected an object of options, got "
                                           f"{type(opts).__name__}")
        parsed, known = {}, card_options()
        for o, v in opts.items():
            if o not in known:
                raise _err(f"{where}.options", f"unknown option {o!r}; expected a subset of "
                           f"{list(known)}", "Tip: check the spelling of the option names.")
            parsed[o] = OptionCost.from_dict(v, f"{where}.options.{o}")
        return cls(name, parsed, d.get("meta", {}))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this segment (``meta`` omitted when empty)."""
        out: dict[str, Any] = {"name": self.name,
                               "options": {o: c.to_dict() for o, c in self.options.items()}}
        if self.meta:
            out["meta"] = dict(self.meta)
        return out


@dataclass(frozen=True)
class ProfileCard:
    """A measured profile: persistent bytes, per-segment option costs and metadata (§4).

    Args:
        persistent_bytes: ``P``, bytes live for the whole step (int, ≥ 0).
        segments: :class:`SegmentCard` s in forward order (any iterable; stored as a tuple),
            names unique, at least one.
        meta: device, dtype, workload parameters, measurement method, source hash, … (free-form).
        schema_version: must be 1.

    Raises:
        ProfileCardError: unknown schema version, duplicate names, no segments, wrong types.

    A card is immutable once validated: frozen dataclasses, a tuple of segments, read-only
    options. Planners still call :meth:`validate` before planning, so a value forced in
    behind that (``object.__setattr__``) is refused rather than planned on.

    References:
        Paper §4, eq. (3); the schema is in this module's docstring.
    """

    persistent_bytes: int
    segments: tuple[SegmentCard, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if isinstance(self.schema_version, bool) or self.schema_version != SCHEMA_VERSION:
            raise _err("schema_version", f"expected {SCHEMA_VERSION}, got {self.schema_version!r}",
                       "Tip: this stateremat reads schema 1 only; re-export the card or upgrade.")
        object.__setattr__(self, "persistent_bytes",
                           _as_bytes(self.persistent_bytes, "persistent_bytes"))
        if isinstance(self.segments, (str, bytes, Mapping)) or not hasattr(self.segments, "__iter__"):
            raise _err("segments", f"expected a list of segments, got {type(self.segments).__name__}")
        segs = list(self.segments)
        if not segs:
            raise _err("segments", "expected at least one segment, got an empty list")
        seen: dict[str, int] = {}
        for i, s in enumerate(segs):
            if not isinstance(s, SegmentCard):
                raise _err(f"segments[{i}]", f"expected a SegmentCard, got {type(s).__name__}")
            if s.name in seen:
                raise _err(f"segment {s.name!r}", f"duplicate name (segments[{seen[s.name]}] and "
                           f"segments[{i}])", "Tip: segment names must be unique; suffix an index.")
            seen[s.name] = i
        if not isinstance(self.meta, Mapping):
            raise _err("meta", f"expected an object, got {type(self.meta).__name__}")
        _check_depth(self.meta, "meta")
        for s in segs:
            s.__post_init__()  # re-checked (see validate)
        _check_total(self.persistent_bytes, segs)
        object.__setattr__(self, "segments", tuple(segs))
        object.__setattr__(self, "meta", dict(self.meta))

    def validate(self) -> "ProfileCard":
        """Check every field again (what construction checks) and return the card.

        Raises:
            ProfileCardError: naming the segment and field that is wrong.
        """
        self.__post_init__()
        return self

    @property
    def segment_names(self) -> list[str]:
        """Segment names in forward order."""
        return [s.name for s in self.segments]

    @classmethod
    def from_dict(cls, d: Any) -> "ProfileCard":
        """Validate and parse a card's JSON object.

        Raises:
            ProfileCardError: naming the segment and field that is wrong.
        """
        if not isinstance(d, Mapping):
            raise _err("top level", f"expected a JSON object, got {type(d).__name__}")
        if "schema_version" not in d:
            raise _err("schema_version", "missing; expected 1")
        version = d["schema_version"]
        if isinstance(version, bool) or version != SCHEMA_VERSION:
            raise _err("schema_version", f"expected {SCHEMA_VERSION}, got {version!r}",
                       "Tip: this stateremat reads schema 1 only; re-export the card or upgrade.")
        for key in ("persistent_bytes", "segments"):
            if key not in d:
                raise _err(key, "missing required field")
        extra = sorted(set(d) - {"schema_version", "persistent_bytes", "segments", "meta"})
        if extra:
            raise _err("top level", f"unknown field(s) {extra}; expected schema_version, "
                                    "persistent_bytes, segments, meta")
        segs = d["segments"]
        if not isinstance(segs, list):
            raise _err("segments", f"expected a list, got {type(segs).__name__}")
        return cls(_as_bytes(d["persistent_bytes"], "persistent_bytes"),
                   [SegmentCard.from_dict(s, i) for i, s in enumerate(segs)],
                   d.get("meta", {}))

    def to_dict(self) -> dict[str, Any]:
        """The card's JSON object (inverse of :meth:`from_dict`)."""
        return {"schema_version": self.schema_version, "persistent_bytes": self.persistent_bytes,
                "segments": [s.to_dict() for s in self.segments], "meta": dict(self.meta)}

    def source_hash(self) -> str:
        """SHA-256 of the canonical JSON of this card (records cite it as the profile digest)."""
        return source_hash(self.to_dict())


def _check_total(persistent_bytes: int, segs: list[SegmentCard]) -> None:
    """Refuse cards whose largest possible peak could overflow the planners' int64 sums."""
    total, qmax = persistent_bytes, 0
    for s in segs:
        r_o = max(s.options.values(), key=lambda c: c.retained_bytes)
        q_o = max(s.options.values(), key=lambda c: c.temp_bytes)
        total += r_o.retained_bytes
        qmax = max(qmax, q_o.temp_bytes)
        if total + qmax > MAX_TOTAL_BYTES:
            # Name this segment's larger contribution (the field most likely mis-scaled).
            field = "temp_bytes" if q_o.temp_bytes > r_o.retained_bytes else "retained_bytes"
            opt = next(o for o, c in s.options.items()
                       if c is (q_o if field == "temp_bytes" else r_o))
            raise _err(f"segment {s.name!r}.options.{opt}.{field}",
                       f"persistent_bytes + Σ max retained_bytes + max temp_bytes reaches "
                       f"{total + qmax} bytes here, above the supported total 2^62 - 1",
                       "Tip: sizes are bytes; a card this large cannot be planned exactly.")


def load_card(path: str | os.PathLike) -> ProfileCard:
    """Read and validate a profile card JSON file.

    Raises:
        ProfileCardError: unreadable file, invalid JSON, a key given twice in one object, or an
            invalid card (names the field and the file).
    """
    if not isinstance(path, (str, os.PathLike)):
        # Never repr(path): a 5,000-digit int cannot even be converted to text.
        raise TypeError(f"load_card: expected a file path (str or os.PathLike), got "
                        f"{type(path).__name__}. Tip: pass the card's path, e.g. "
                        "load_card('card.json').")
    path = Path(path)
    where = f"profile card: {str(path)!r}"
    try:
        text = read_regular_bytes(path).decode("utf-8")  # a FIFO or device never blocks
    except OSError as exc:
        raise ProfileCardError(f"profile card: cannot read {str(path)!r}: {exc.strerror or exc}. "
                               "Tip: check the path.") from exc
    except UnicodeDecodeError as exc:
        raise ProfileCardError(f"{where} is not UTF-8 text ({exc}). Tip: a card is JSON written "
                               "by `stateremat profile` or save_card; check the file.") from None
    try:
        data = loads_json(text)
    except DuplicateKeyError as exc:  # json.loads would keep the last silently
        raise ProfileCardError(f"{where}: {exc}. Tip: give each field once; a card written by "
                               "`stateremat profile` or save_card never repeats one.") from None
    except json.JSONDecodeError as exc:
        if not text.strip():
            raise ProfileCardError(f"{where} is empty. Tip: a card is the JSON `stateremat profile "
                                   "--out` or save_card writes; profile again if that run was cut short.") from None
        tip = ("NaN/Infinity are not JSON; the profiler writes null." if re.search(r"\b(NaN|-?Infinity)\b", text)
               else "a card is the JSON `stateremat profile --out` or save_card writes; check the file.")
        raise ProfileCardError(f"{where} is not valid JSON ({exc}). Tip: {tip}") from exc
    except ValueError as exc:  # e.g. an integer of more digits than Python converts (4,300)
        raise ProfileCardError(f"{where} holds a value JSON cannot read here ({str(exc).split(';')[0]}). Tip: a card's "
                               "numbers are bytes (at most 2^53) and seconds; check the file.") from None
    except RecursionError:
        raise ProfileCardError(f"{where} nests JSON too deeply to read (a card is at most a few "
                               "levels deep). Tip: check the file is a profile card.") from None
    try:
        return ProfileCard.from_dict(data)
    except ProfileCardError as exc:  # name the file the field is in
        raise ProfileCardError(f"{where}: {str(exc).removeprefix('profile card: ')}") from None



def save_card(card: ProfileCard, path: str | os.PathLike) -> Path:
    """Write ``card`` as JSON atomically (temp file + rename) and return the path."""
    if not isinstance(card, ProfileCard):
        raise TypeError(f"save_card: expected a ProfileCard, got {type(card).__name__}")
    return atomic_write_json(path, card.to_dict())
