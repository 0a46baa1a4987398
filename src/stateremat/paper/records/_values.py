"""Value rules of a records table, declared beside its schema (:func:`declare_table`).

A schema says a column is a float; a rule says which floats a row may hold there: one of
the categories a run writes, a finite number in a range, the value the run's config set. Rules
on sidecar config fields say the same of the config before anything sizes work from it.
Every read checks them (``read_records``), so a row no run could have written is refused by
file, column, row key and value instead of being counted.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ._errors import RecordsError

__all__ = ["Rule", "ConfigField", "set_text", "one_of", "number", "config_value", "in_config",
           "below_config", "config_device",
           "config_entry", "step_index", "marker_alone", "constant", "all_of", "implies",
           "integer", "text", "int_list", "text_list", "check_rows", "check_config"]

#: rows (the part as pandas), config -> boolean mask of the rows a rule refuses
_Bad = Callable[[pd.DataFrame, str, Mapping[str, Any]], np.ndarray]


@dataclass(frozen=True)
class Rule:
    """What a column's values may be: ``what`` in words (for the error), ``bad`` the test;
    ``parts``: the rules it joins (:func:`all_of`), each refused in its own words."""

    what: str
    bad: _Bad
    parts: tuple["Rule", ...] = ()


def _missing(s: pd.Series) -> np.ndarray:
    return s.isna().to_numpy(dtype=bool)


#: Where a value may be missing: always (True), never (False), or in rows where any named
#: column holds one of its values (or, given a function of the column, where it says so).
Missing = "bool | Mapping[str, Sequence[Any] | Callable[[pd.Series], Any]]"


def _when(df: pd.DataFrame, cond: Any) -> np.ndarray:
    if isinstance(cond, bool):
        return np.full(len(df), cond)
    out = np.zeros(len(df), dtype=bool)
    for column, values in cond.items():
        if column in df.columns:
            hit = values(df[column]) if callable(values) else df[column].isin(list(values))
            out |= np.asarray(hit, dtype=bool)
    return out


def set_text(s: pd.Series) -> Any:
    """For a ``missing`` condition: rows where a text column is set (not null, not empty)."""
    return s.fillna("").astype(str) != ""


def one_of(*values: Any) -> Rule:
    """A categorical column: each non-null value one of ``values``."""
    allowed = frozenset(values)
    return Rule(f"one of {sorted(allowed)}",
                lambda df, c, cfg: ~(_missing(df[c]) | df[c].isin(allowed).to_numpy(dtype=bool)))


def number(lo: float | None = 0, hi: float | None = None, *, missing: Any = False,
           inf: bool = False) -> Rule:
    """A numeric column: finite (``inf``: or +infinity), in ``[lo, hi]``; null or NaN only
    where ``missing`` allows it (see :data:`Missing`)."""
    words = "a finite number" if not inf else "a number (or +infinity)"
    words += (f" >= {lo}" if hi is None else f" in [{lo}, {hi}]") if lo is not None else (
        f" <= {hi}" if hi is not None else "")
    if isinstance(missing, Mapping):
        words += (" (null or NaN only where "
                  + " or ".join(f"{c} is set" if callable(v) else f"{c} is one of {list(v)}"
                                for c, v in missing.items()) + ")")
    elif missing:
        words += " (or null)"

    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        v = pd.to_numeric(df[c], errors="coerce").astype("float64").to_numpy()
        gone = np.isnan(v)
        out = gone & ~_when(df, missing)
        ok = ~gone
        out |= ok & np.isinf(v) & ~(inf & (v > 0))
        if lo is not None:
            out |= ok & (v < lo)
        if hi is not None:
            out |= ok & (v > hi) & ~np.isinf(v)
        return out

    return Rule(words, bad)


_UNSET = object()


def _config_at(cfg: Mapping[str, Any], field: str) -> Any:
    """The config's value at dotted ``field``; :data:`_UNSET` where the config does not set it
    (a rule on it then does not apply: the part's run note already holds the same config)."""
    v: Any = cfg
    for part in field.split("."):
        if not isinstance(v, Mapping) or part not in v:
            return _UNSET
        v = v[part]
    return v


def _none(df: pd.DataFrame) -> np.ndarray:
    return np.zeros(len(df), dtype=bool)


def config_value(field: str, *, by: str | None = None, among: str = "cells") -> Rule:
    """Equal to the run config's ``field`` (dotted path). With ``by``: the config's ``among``
    list holds one object per value of column ``by`` (its own ``by`` field), and a row's value
    must equal that object's ``field`` (e.g. a cohort row's budget is its cell's budget)."""
    if by is None:
        def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
            want = _config_at(cfg, field)
            if want is _UNSET:
                return _none(df)
            return ~(_missing(df[c]) | (df[c] == want).to_numpy(dtype=bool))
        return Rule(f"the run config's {field}", bad)

    def bad_by(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        if not isinstance(cfg.get(among), list):
            return _none(df)
        entries = {e.get(by): e.get(field) for e in (cfg.get(among) or [])
                   if isinstance(e, Mapping)}
        want = df[by].map(entries)
        return ~(_missing(df[c]) | (df[c] == want).to_numpy(dtype=bool))
    return Rule(f"its {by}'s {field} in the run config's {among}", bad_by)


def config_device(field: str = "device") -> Rule:
    """The run config's device ``field``, or one of its indexed devices: rows a run configured
    for ``cuda`` measured on ``cuda:0`` are its own, rows on ``cpu`` or ``cuda:1`` of a run
    configured for ``cuda:0`` are not."""
    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        want = _config_at(cfg, field)
        if not isinstance(want, str):
            return _none(df)
        indexed = re.compile(re.escape(want) + r":\d+") if ":" not in want else None

        def ok(v: Any) -> bool:
            return v == want or (indexed is not None and isinstance(v, str)
                                 and indexed.fullmatch(v) is not None)
        return ~(_missing(df[c]) | df[c].map(ok).to_numpy(dtype=bool))
    return Rule(f"the run config's {field} (or one of its indices)", bad)


def config_entry(field: str, *, by: str) -> Rule:
    """Equal to the row's entry in the run config's object ``field``, keyed by the row's column
    ``by`` (e.g. a cell's profile hash in ``config["profile"][cell]``); a key the object lacks
    is refused, a null value is left to the column's other rules."""
    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        entries = _config_at(cfg, field)
        if not isinstance(entries, Mapping) or by not in df.columns:
            return _none(df)
        want = df[by].map(lambda k: entries.get(k, _UNSET)).to_numpy(dtype=object)
        got = df[c].to_numpy(dtype=object)
        return ~(_missing(df[c]) | np.asarray([w is not _UNSET and g == w
                                               for g, w in zip(got, want)], dtype=bool))
    return Rule(f"its {by}'s entry in the run config's {field}", bad)


def in_config(field: str, *, by: str | None = None, among: str = "cells",
              key: str | None = None) -> Rule:
    """One of the run config's list ``field`` (a list of values, or with ``key`` of objects'
    ``key`` fields). With ``by``: the list ``field`` of the ``among`` object for the row's
    column ``by`` (e.g. a cohort row's method among its cell's methods)."""
    def values(lst: Any) -> set:
        lst = lst if isinstance(lst, list) else []
        return {(e.get(key) if isinstance(e, Mapping) else None) if key else e for e in lst}

    if by is None:
        def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
            if _config_at(cfg, field) is _UNSET:
                return _none(df)
            return ~(_missing(df[c]) | df[c].isin(values(_config_at(cfg, field)))
                     .to_numpy(dtype=bool))
        return Rule(f"one of the run config's {field}", bad)

    def bad_by(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        if not isinstance(cfg.get(among), list):
            return _none(df)
        entries = {e.get(by): values(e.get(field)) for e in (cfg.get(among) or [])
                   if isinstance(e, Mapping)}
        ok = [v in entries.get(b, ()) for b, v in zip(df[by], df[c])]
        return ~(_missing(df[c]) | np.asarray(ok, dtype=bool))
    return Rule(f"one of its {by}'s {field} in the run config's {among}", bad_by)


def below_config(field: str) -> Rule:
    """An index: an integer in ``[0, config[field])`` (e.g. a program number)."""
    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        n = _config_at(cfg, field)
        if n is _UNSET:
            return _none(df)
        v = df[c].to_numpy(dtype="float64", na_value=np.nan)
        return ~np.isnan(v) & ~((v >= 0) & (v < (n if isinstance(n, int) else 0)))
    return Rule(f"in [0, the run config's {field})", bad)


def all_of(*rules: Rule) -> Rule:
    """Every one of ``rules`` (a row breaking any is refused, in words ``a; b``)."""
    rules = tuple(p for r in rules if r is not None for p in (r.parts or (r,)))
    if len(rules) == 1:
        return rules[0]

    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        out = _none(df)
        for r in rules:
            out = out | np.asarray(r.bad(df, c, cfg), dtype=bool)
        return out
    return Rule("; and ".join(r.what for r in rules), bad, rules)


def _config_by(df: pd.DataFrame, cfg: Mapping[str, Any], field: str, by: str | None,
               among: str) -> Any:
    """The config's ``field`` for each row (with ``by``: its ``among`` entry's), as a float
    array (NaN where the config does not say); None where the config does not set it at all."""
    if by is None:
        n = _config_at(cfg, field)
        if n is _UNSET:
            return None
        return np.full(len(df), float(n) if _is_int(n) else np.nan)
    if not isinstance(cfg.get(among), list) or by not in df.columns:
        return None
    entries = {e.get(by): e.get(field) for e in cfg[among] if isinstance(e, Mapping)}
    return np.asarray([float(v) if _is_int(v) else np.nan for v in df[by].map(entries)],
                      dtype="float64")


def step_index(field: str, *, by: str | None = None, among: str = "cells",
               marker: int | None = -1) -> Rule:
    """A step number: an integer in ``[0, config[field])`` (with ``by``: the ``field`` of the
    row's ``among`` entry, e.g. its cell's steps), or ``marker`` (the row of a method that ran
    no step). A step at or past the run's steps is no step the run took."""
    where = f"its {by}'s {field}" if by else f"the run config's {field}"
    words = f"a step in [0, {where})" + (f" or {marker}" if marker is not None else "")

    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        v = pd.to_numeric(df[c], errors="coerce").astype("float64").to_numpy()
        out = np.isnan(v) | (v != np.floor(v))
        out |= (v < 0) & ~((v == marker) if marker is not None else np.zeros(len(v), bool))
        n = _config_by(df, cfg, field, by, among)
        if n is not None:
            out |= (v >= 0) & ~(v < n)  # NaN n (the config does not say for this row): refused
        return out
    return Rule(words, bad)


#: (id of the frame, columns) -> (group numbers, each row's group's first row), for the frame
#: :func:`check_rows` is checking (cleared when it returns: rules share one grouping).
_GROUPS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _groups(df: pd.DataFrame, by: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """A group number per row (rows sharing the values of columns ``by``; none: one group),
    and the index of each row's group's first row."""
    by = tuple(b for b in by if b in df.columns)
    key = (id(df), len(df), by)
    if key not in _GROUPS:
        gid = (df.groupby(list(by), sort=False, dropna=False).ngroup().to_numpy() if by
               else np.zeros(len(df), dtype="int64"))
        firsts = np.full(int(gid.max()) + 1 if len(gid) else 0, len(df), dtype="int64")
        np.minimum.at(firsts, gid, np.arange(len(df)))
        _GROUPS[key] = (gid, firsts[gid])
    return _GROUPS[key]


def constant(*by: str) -> Rule:
    """The same value (null counting as one) in every row sharing columns ``by`` (none: every
    row of the run), e.g. a method's policy in each of its steps' rows. A row differing from
    the first row of its group is refused."""
    words = (f"the same in every row of its ({', '.join(by)}) (it differs from the first one's)"
             if by else "the same in every row of the run (it differs from the first row's)")

    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        first = _groups(df, by)[1]
        codes = pd.factorize(df[c], use_na_sentinel=False)[0]
        return codes != codes[first]
    return Rule(words, bad)


def marker_alone(marker: Any, *, by: Sequence[str], flag: str | None = None) -> Rule:
    """``marker`` (e.g. step ``-1``: a method that could not run and measured nothing) only
    as the one row of its ``by`` group, and there with column ``flag`` false (e.g. not
    ``feasible``); a group mixing the marker with other rows is refused."""
    words = (f"{marker} only as the one row of its ({', '.join(by)})"
             + (f" with {flag} false" if flag else ""))

    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        hit = (df[c] == marker).fillna(False).to_numpy(dtype=bool)
        if not hit.any():
            return hit
        gid = _groups(df, by)[0]
        size = np.bincount(gid)[gid]
        out = hit & (size > 1)
        if flag is not None and flag in df.columns:
            out |= hit & df[flag].fillna(True).astype(bool).to_numpy(dtype=bool)
        return out
    return Rule(words, bad)


def implies(what: str, cond: Callable[[pd.DataFrame], Any],
            need: Callable[[pd.DataFrame], Any]) -> Rule:
    """A rule across columns: in rows where ``cond`` holds, ``need`` must (``what`` in words),
    e.g. a check's ``detected`` agrees with its ``outcome``."""
    def bad(df: pd.DataFrame, c: str, cfg: Mapping[str, Any]) -> np.ndarray:
        return (np.asarray(cond(df), dtype=bool) & ~np.asarray(need(df), dtype=bool))
    return Rule(what, bad)


def check_rows(where: Sequence[Path], table: str, df: pd.DataFrame, rules: Mapping[str, Rule],
               key: Sequence[str], config: Mapping[str, Any]) -> None:
    """Refuse the first row of ``df`` that breaks a rule of ``rules`` (``where[i]``: the part
    row ``i`` was read from; ``config``: the run's sidecar config).

    Raises:
        RecordsError: naming the file, the column, the row's key and its value.
    """
    try:
        for column, rule in rules.items():
            if column not in df.columns or df.empty:
                continue
            for part in rule.parts or (rule,):
                _refuse(where, table, df, column, part, part.bad(df, column, config), key)
    finally:
        _GROUPS.clear()


def _refuse(where: Sequence[Path], table: str, df: pd.DataFrame, column: str, rule: Rule,
            bad: np.ndarray, key: Sequence[str]) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        row = df.iloc[i]
        ident = {k: plain_value(row[k]) for k in key if k in df.columns}
        raise RecordsError(
            f"stateremat records: {where[i]} (table {table!r}) row {ident} gives {column!r} = "
            f"{plain_value(row[column])!r}, not {rule.what} ({int(bad.sum())} such row(s)); no "
            "run of this table writes that. Tip: the part was edited or comes from another "
            "run; move it out of the folder (keep it if it belongs elsewhere), then rerun "
            "the run's command with the same --out to redo its rows.")


def plain_value(v: Any) -> Any:
    """``v`` as a Python value (a message shows ``0``, not ``np.int64(0)``)."""
    return v.item() if isinstance(v, np.generic) else v


@dataclass(frozen=True)
class ConfigField:
    """What a sidecar config field may hold: ``what`` in words, ``ok`` the test."""

    what: str
    ok: Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def integer(lo: int, hi: int) -> ConfigField:
    """An integer (not a bool, not a string) in ``[lo, hi]``."""
    return ConfigField(f"an integer in [{lo:,}, {hi:,}]", lambda v: _is_int(v) and lo <= v <= hi)


def text(*values: str) -> ConfigField:
    """A string (with ``values``: one of them)."""
    if values:
        return ConfigField(f"one of {list(values)}", lambda v: isinstance(v, str) and v in values)
    return ConfigField("a string", lambda v: isinstance(v, str))


def int_list(lo: int, hi: int, most: int) -> ConfigField:
    """A list of at most ``most`` integers, each in ``[lo, hi]``."""
    return ConfigField(f"a list of at most {most:,} integers in [{lo:,}, {hi:,}]",
                       lambda v: isinstance(v, list) and len(v) <= most
                       and all(_is_int(x) and lo <= x <= hi for x in v))


def text_list(most: int) -> ConfigField:
    """A list of at most ``most`` strings."""
    return ConfigField(f"a list of at most {most:,} strings",
                       lambda v: isinstance(v, list) and len(v) <= most
                       and all(isinstance(x, str) for x in v))


def _fields_at(cfg: Any, path: str) -> list[tuple[str, Any]]:
    """``(where, value)`` of every value at ``path``: dotted fields, ``name[]`` for each item of
    a list; a missing field yields nothing (a config that does not set it)."""
    found = [("config", cfg)]
    for part in path.split("."):
        each = part.endswith("[]")
        name = part[:-2] if each else part
        nxt = []
        for where, v in found:
            if not isinstance(v, Mapping) or name not in v:
                continue
            w, x = f"{where}.{name}", v[name]
            if each:
                nxt += [(f"{w}[{i}]", y) for i, y in enumerate(x)] if isinstance(x, list) \
                    else [(w, _NOT_A_LIST)]
            else:
                nxt.append((w, x))
        found = nxt
    return found


_NOT_A_LIST = object()


def check_config(sidecar: Path, config: Any, fields: Mapping[str, ConfigField]) -> None:
    """Refuse a sidecar whose config gives a declared field another kind or an out-of-range
    value, before anything sizes work from it.

    Raises:
        RecordsError: naming the sidecar, the field's path and its value.
    """
    for path, rule in fields.items():
        for where, v in _fields_at(config, path):
            if v is _NOT_A_LIST or not rule.ok(v):
                shown = "not a list" if v is _NOT_A_LIST else f"{_short(v)} ({type(v).__name__})"
                raise RecordsError(
                    f"stateremat records: sidecar {sidecar} gives {where} as {shown}, not "
                    f"{rule.what}; its run never writes that. Tip: restore the sidecar from a "
                    "copy, or use a new --out folder.")


def _short(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."
