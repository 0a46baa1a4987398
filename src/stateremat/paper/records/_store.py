"""Raw execution records: Parquet parts with a JSON sidecar, atomic and resumable.

Layout under ``out_dir``::

    <table>/part-<utc>-<n>.parquet   rows, one part per append (atomic rename)
    <table>.json                     sidecar: provenance + run config

Every row is kept (matches, rejections, divergences). Summaries are recomputed from the
rows by separate code (``read_records``), never written alongside them.
"""
from __future__ import annotations

import fcntl
import io
import json
import itertools
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ...contract import RecordsError
from ..._shared.io import atomic_write_bytes, atomic_write_json, json_default, provenance

_counter = itertools.count()
_LOCKS: dict[str, int] = {}  # lock path -> fd held by this process for its lifetime


def _lock(path: Path) -> None:
    # Held by this process for its lifetime; opened again in the same process, shared.
    key = str(path.resolve())
    if key in _LOCKS:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RecordsError(
            f"stateremat records: another process is writing into {path.parent} (lock "
            f"{path.name} is held). Tip: wait for it to finish, or use another --out folder."
        ) from None
    _LOCKS[key] = fd


#: Leftovers of writes a stop cut short: atomic writes' temporary files, cohort work folders.
_TEMP_GLOBS = (".*.tmp", "*/.*.tmp", "*/*/.*.tmp")
TEMP_DIR = ".tmp"


def lock_run(out_dir: str | os.PathLike) -> Path:
    """Take this process's exclusive lock on run folder ``out_dir`` before writing anything.

    One process writes into a run folder at a time: a second launch on the same folder is
    refused here, before it has written a byte (profile cards, cards, rows). Holding the lock,
    the folder's leftovers of an earlier stop are removed: atomic writes' ``.*.tmp`` files and
    the ``.tmp/`` work folder (a killed process leaves them; nothing else writes them).

    Returns:
        The run folder (created if missing).

    Raises:
        RecordsError: another process holds the lock, or ``out_dir`` is a file.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise RecordsError(f"stateremat records: --out {out} is a file, not a folder. "
                           "Tip: pass a folder path (it is created if missing).")
    out.mkdir(parents=True, exist_ok=True)
    key = str((out / ".run.lock").resolve())
    first = key not in _LOCKS
    _lock(out / ".run.lock")
    if first:
        for pattern in _TEMP_GLOBS:
            for tmp in out.glob(pattern):
                tmp.unlink(missing_ok=True)
        shutil.rmtree(out / TEMP_DIR, ignore_errors=True)
    return out


def read_sidecar(path: Path) -> dict:
    """The JSON object of a records sidecar; errors name the file and what to do.

    Raises:
        RecordsError: unreadable, not UTF-8, not JSON, or not a JSON object.
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordsError(f"stateremat records: cannot read sidecar {path} "
                           f"({type(exc).__name__}: {exc}). Tip: restore it from a copy, or use "
                           "a new --out folder; its rows cannot be described without it.") from None
    if not isinstance(doc, dict):
        raise RecordsError(f"stateremat records: sidecar {path} holds {type(doc).__name__}, not "
                           "a JSON object. Tip: restore it from a copy, or use a new --out folder.")
    return doc


def check_resumable(out_dir: str | os.PathLike, table: str, config: Mapping[str, Any], *,
                    view: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None) -> None:
    """Refuse early when ``out_dir`` holds a ``table`` run whose config differs in ``config``'s keys.

    For runners that write other files (profile cards) before their full config is known:
    what is known is compared first, so a mismatched launch writes nothing. ``view`` maps the
    stored config to its comparable part (e.g. without fields set from the cards).

    Raises:
        RecordsError: a key of ``config`` has another value in the existing sidecar.
    """
    sidecar = Path(out_dir) / f"{table}.json"
    if not sidecar.exists():
        return
    old = read_sidecar(sidecar).get("config") or {}
    if view is not None and isinstance(old, dict):
        old = dict(view(old))
    new = json.loads(json.dumps(dict(config), default=json_default))
    diff = {k: v for k, v in new.items() if old.get(k) != v}
    if diff:
        raise _other_config(sidecar, {k: old.get(k) for k in diff}, diff)


def _other_config(sidecar: Path, old: Mapping[str, Any], new: Mapping[str, Any]) -> RecordsError:
    return RecordsError(
        f"stateremat records: {sidecar} was written by a run with another config "
        f"({_config_diff(old, new)}). Tip: use a new --out folder, or the same options as the "
        "interrupted run to resume it.")


class RecordStore:
    """Append-only, resumable store of raw rows for one table of one run.

    Args:
        out_dir: run folder (created if missing).
        table: table name, e.g. ``"finite"``; rows go to ``out_dir/table/``.
        key: columns identifying a unit of work; :meth:`done_keys` lets a resumed run skip
            finished units.
        meta: run configuration written into the sidecar (merged with :func:`provenance`).
        launch: what this launch asked for beyond the config (e.g. the seeds and methods of a
            run that may be extended), appended to the sidecar's ``launches`` list; ``report``
            checks completeness against it.

    Raises:
        RecordsError: if an existing sidecar belongs to a different run configuration
            (``config`` differs) — resuming into it would mix experiments.
    """

    def __init__(self, out_dir: str | os.PathLike, table: str, key: Sequence[str],
                 meta: Mapping[str, Any] | None = None, launch: Mapping[str, Any] | None = None):
        self.out_dir = Path(out_dir)
        self.table = table
        self.key = tuple(key)
        self.dir = self.out_dir / table
        self._last_part: str | None = None
        lock_run(self.out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sidecar = self.out_dir / f"{table}.json"
        config = dict(meta or {})
        if not self.sidecar.exists() and any(self.dir.glob("part-*.parquet")):
            raise RecordsError(
                f"stateremat records: {self.dir} holds rows but its sidecar {self.sidecar} is "
                "missing, so nothing says which run wrote them. Tip: restore the sidecar from a "
                "copy to resume, or use a new --out folder.")
        if self.sidecar.exists():
            old = read_sidecar(self.sidecar)
            new = json.loads(json.dumps(config, default=json_default))
            if old.get("config") != new:
                raise _other_config(self.sidecar, old.get("config") or {}, new)
            old.setdefault("resumed_utc", []).append(provenance()["created_utc"])
            if launch is not None:
                old.setdefault("launches", []).append(dict(launch))
            atomic_write_json(self.sidecar, old)
        else:
            doc = {"table": table, "key": list(self.key), "config": config,
                   "provenance": provenance()}
            if launch is not None:
                doc["launches"] = [dict(launch)]
            atomic_write_json(self.sidecar, doc)

    def done_keys(self) -> set[tuple]:
        """Keys (tuples over ``key`` columns) of rows already written."""
        df = self.read()
        if df.empty:
            return set()
        return set(map(tuple, df[list(self.key)].itertuples(index=False, name=None)))

    def append(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Write ``rows`` as a new Parquet part atomically; returns the number written."""
        rows = list(rows)
        if not rows:
            return 0
        missing = [k for k in self.key if any(k not in r for r in rows)]
        if missing:
            raise RecordsError(f"stateremat records: rows for {self.table!r} lack key columns "
                               f"{missing}. This is a bug in the caller, please report it.")
        tbl = pa.Table.from_pylist([dict(r) for r in rows])
        buf = io.BytesIO()
        pq.write_table(tbl, buf)
        name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{next(_counter):06d}.parquet"
        atomic_write_bytes(self.dir / name, buf.getvalue())
        self._last_part = name
        return len(rows)

    def drop_rows(self, match: Callable[[pd.DataFrame], "pd.Series"],
                  keep_last_part: bool = False) -> int:
        """Remove the rows ``match`` selects, each part rewritten atomically (or removed when it
        holds nothing else); for rows that describe something no longer on disk.

        Args:
            match: rows of one part -> boolean mask of the rows to drop.
            keep_last_part: leave the part this store appended last untouched (the rows that
                replace the dropped ones).

        Returns:
            The number of rows dropped.
        """
        dropped = 0
        for p in sorted(self.dir.glob("part-*.parquet")):
            if keep_last_part and p.name == self._last_part:
                continue
            tbl = pq.read_table(p)
            df = tbl.to_pandas()
            mask = match(df).to_numpy(dtype=bool)
            if not mask.any():
                continue
            dropped += int(mask.sum())
            if mask.all():
                p.unlink()
                continue
            buf = io.BytesIO()
            pq.write_table(tbl.filter(pa.array(~mask)), buf)
            atomic_write_bytes(p, buf.getvalue())
        return dropped

    def read(self) -> pd.DataFrame:
        """All rows written so far (every part), as a DataFrame."""
        return read_records(self.out_dir, self.table)


def read_records(out_dir: str | os.PathLike, table: str) -> pd.DataFrame:
    """Read every Parquet part of ``table`` under ``out_dir``; empty frame if none.

    Raises:
        RecordsError: if a part cannot be read.
    """
    d = Path(out_dir) / table
    parts = sorted(d.glob("part-*.parquet")) if d.is_dir() else []
    if not parts:
        return pd.DataFrame()
    frames = []
    for p in parts:
        try:
            frames.append(pq.read_table(p).to_pandas())
        except Exception as exc:  # corrupt part: say which file
            detail = str(exc).strip().rstrip(".")
            raise RecordsError(f"stateremat records: cannot read {p}: {detail}. Tip: a part is "
                               "written atomically, so this file was changed by something "
                               "else; move it out of the folder (or delete it), then rerun the "
                               "run's command with the same --out to redo its rows.") from exc
    return pd.concat(frames, ignore_index=True)


def _config_diff(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 6) -> str:
    """``field: old -> new`` for the innermost fields that differ (the first ``limit``), named
    by their path: ``profile.steps: 3 -> 5``, ``cells[0].warmups: 1 -> 2``."""
    found = list(_diff_paths(old, new, ""))
    parts = [f"{path}: {_short(a)} -> {_short(b)}" for path, a, b in found[:limit]]
    return "; ".join(parts) + (f"; and {len(found) - limit} more" if len(found) > limit else "")


_ABSENT = object()


def _diff_paths(old: Any, new: Any, path: str) -> Iterable[tuple[str, Any, Any]]:
    """``(path, old, new)`` of the innermost differing fields: dicts are compared key by key,
    lists of equal length item by item; anything else (or a missing key) as a whole."""
    if old == new:
        return
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for k in dict.fromkeys([*old, *new]):
            sub = f"{path}.{k}" if path else str(k)
            yield from _diff_paths(old.get(k, _ABSENT), new.get(k, _ABSENT), sub)
    elif (isinstance(old, (list, tuple)) and isinstance(new, (list, tuple))
          and len(old) == len(new)):
        for i, (a, b) in enumerate(zip(old, new)):
            yield from _diff_paths(a, b, f"{path}[{i}]")
    else:
        yield (path or "config", None if old is _ABSENT else old,
               None if new is _ABSENT else new)


def _short(v: Any, n: int = 160) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."
