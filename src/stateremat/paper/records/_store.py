"""Raw execution records: Parquet parts with a JSON sidecar, atomic and resumable.

Layout under ``out_dir``::

    <table>/part-<utc>-<n>.parquet   rows, one part per append (atomic rename)
    <table>.json                     sidecar: provenance + run config

Every row is kept (matches, rejections, divergences). Summaries are recomputed from the
rows by separate code (``read_records``), never written alongside them.
"""
from __future__ import annotations

import errno
import fcntl
import io
import json
import itertools
import os
import re
import shutil
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ._errors import RecordsError
from ..._shared.io import (
    DuplicateKeyError, atomic_write_bytes, atomic_write_json, json_default, loads_json, provenance,
    not_a_regular_file, read_regular_bytes,
)
from ._values import ConfigField, Rule, all_of, check_config, check_rows, constant, plain_value

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


#: Leftovers of writes a stop cut short: atomic writes' temporary files (the names
#: ``stateremat._shared.io.atomic_write_bytes`` gives them: ``.<name>.<8 hex>.tmp``, in the run
#: folder or a folder at most :data:`_TEMP_DEPTH` below it), cohort work folders (``.tmp/``).
_TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{8}\.tmp", re.DOTALL)
_TEMP_DEPTH = 2
TEMP_DIR = ".tmp"


def is_run_folder(out: Path) -> bool:
    """Whether folder ``out`` is a stateremat run's: it holds a run's manifest or lock, or a
    table's sidecar ``<table>.json`` beside its ``<table>/`` folder (a folder made before
    manifests). A missing folder is not one."""
    if not out.is_dir():
        return False
    if (out / MANIFEST).is_file() or (out / ".run.lock").is_file():
        return True
    for sc in out.glob("*.json"):
        rows = out / sc.stem
        if sc.is_file() and rows.is_dir() and (
                sc.stem in _TABLE_COMMANDS or table_spec(sc.stem) is not None
                or next(rows.glob("part-*.parquet"), None) is not None):
            return True
    return False


def _remove_leftovers(out: Path) -> None:
    # Only names the atomic writer gives, only regular files (never a link's target), only in
    # real folders of the run (a symbolic link to a folder is not entered: it may lead outside).
    def sweep(folder: Path, depth: int) -> None:
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            return
        for entry in entries:
            try:
                if entry.is_symlink():
                    continue
                if entry.is_file(follow_symlinks=False) and _TEMP_NAME.fullmatch(entry.name):
                    os.unlink(entry.path)
                elif depth < _TEMP_DEPTH and entry.is_dir(follow_symlinks=False) \
                        and entry.name != TEMP_DIR:
                    sweep(Path(entry.path), depth + 1)
            except OSError:
                continue

    sweep(out, 0)
    work = out / TEMP_DIR
    if work.is_dir() and not work.is_symlink():
        shutil.rmtree(work, ignore_errors=True)


def lock_run(out_dir: str | os.PathLike) -> Path:
    """Take this process's exclusive lock on run folder ``out_dir`` before writing anything.

    One process writes into a run folder at a time: a second launch on the same folder is
    refused here, before it has written a byte (profile cards, cards, rows). Holding the lock,
    the folder's leftovers of an earlier stop are removed, when the folder is a run's
    (:func:`is_run_folder`) before this lock: atomic writes' temporary files (only the names
    the atomic writer gives, never through a symbolic link) and the ``.tmp/`` work folder (a
    killed process leaves them). A folder that is not a run's is never swept.

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
    owned = first and is_run_folder(out)  # judged before this lock marks the folder
    _lock(out / ".run.lock")
    command = _CLAIMS.pop(str(out.resolve()), None)
    if command is not None and not (out / MANIFEST).is_file():  # see claim_folder
        atomic_write_json(out / MANIFEST, {"command": command, RUN_ID: new_run_id(),
                                           "created_utc": provenance()["created_utc"]})
    if owned:
        _remove_leftovers(out)
    return out


#: A run folder's manifest: the command that created it (see :func:`claim_folder`) and its
#: run id.
MANIFEST = ".run.json"
#: Field of a run folder's manifest and of each table's sidecar: the run's random id, made when
#: the folder (or the table's sidecar) is first created. Every part the run writes carries it in
#: its :data:`PART_KEY` note, so a part of another run of the same config is told apart.
RUN_ID = "run_id"


def new_run_id() -> str:
    """A fresh random run id (32 hex digits)."""
    return uuid.uuid4().hex


def _folder_run_id(out: Path) -> str:
    """The run id of run folder ``out`` for a table created now: its manifest's, else new."""
    manifest = out / MANIFEST
    if manifest.is_file():
        rid = read_sidecar(manifest).get(RUN_ID)
        if isinstance(rid, str):
            return rid
    return new_run_id()
#: For a folder made before manifests: the command each table's sidecar says wrote it
#: (a prefix: bench and cohort commands are named by experiment).
_TABLE_COMMANDS = {
    "finite": "stateremat verify finite", "engines": "stateremat verify engines",
    "alias": "stateremat verify alias", "moco": "stateremat app moco",
    "semantics": "stateremat cohort semantics",
    "semantics_stateremat_jax": "stateremat cohort semantics",
    "bench": "stateremat bench ", "cohort_timing": "stateremat cohort processes",
    "cohort_processes": "stateremat cohort processes",
}
#: run folder -> the command to record in its manifest when its lock is taken.
_CLAIMS: dict[str, str] = {}
#: Runs others on the user's behalf, into folders of their own commands.
_ANY_COMMAND = "stateremat main"


def _same_command(owner: str, command: str) -> bool:
    if _ANY_COMMAND in (owner, command) or owner == command:
        return True
    return owner.endswith(" ") and command.startswith(owner)


def claim_folder(out_dir: str | os.PathLike, command: str) -> None:
    """Make run folder ``out_dir`` belong to ``command`` (e.g. ``"stateremat verify finite"``),
    or refuse when another command created it.

    The owner is recorded in ``out_dir/.run.json`` when the folder is first locked
    (:func:`lock_run`, so a refused launch writes nothing); a folder made before that is
    judged by its tables' sidecars.

    A folder that exists, is not empty and is not a run's (:func:`is_run_folder`: no
    manifest, lock or table sidecar) is refused: a run writes, replaces and removes files in
    its folder, so it never takes one that holds someone else's files.

    Raises:
        RecordsError: the folder belongs to another command (both named), or is a non-empty
            folder that is not a stateremat run's.
    """
    out = Path(out_dir)
    manifest = out / MANIFEST
    if out.is_dir():
        try:
            with os.scandir(out) as entries:
                empty = next(entries, None) is None
        except OSError as exc:
            raise RecordsError(f"stateremat records: cannot list --out {out} ({exc.strerror}). "
                               "Tip: use a new or empty folder.") from None
        if not empty and not is_run_folder(out):
            raise RecordsError(
                f"stateremat records: --out {out} is a folder that is not empty and is not a "
                "stateremat run's (no .run.json, .run.lock or <table>.json sidecar beside its "
                "rows); a run writes, replaces and removes files in its folder, so it does not "
                "take one holding other files. Tip: use a new or empty folder (it is created if "
                "missing), or the --out folder of an earlier run of this command to resume it.")
    owner = None
    if manifest.is_file():
        owner = read_sidecar(manifest).get("command")
    elif out.is_dir():
        for sc in sorted(out.glob("*.json")):
            if sc.stem in _TABLE_COMMANDS and (out / sc.stem).exists():
                owner = _TABLE_COMMANDS[sc.stem]
                break
    if isinstance(owner, str) and not _same_command(owner, command):
        raise RecordsError(
            f"stateremat records: {out} belongs to `{owner.strip()}` (it created the folder); "
            f"`{command}` may not write into it (its outputs would replace that run's). Tip: use "
            "another --out folder for this command.")
    if not manifest.is_file():  # written by lock_run, once this process holds the folder
        _CLAIMS[str(out.resolve())] = (owner if isinstance(owner, str) and owner != _ANY_COMMAND
                                       and not owner.endswith(" ") else command)


def check_not_writing(out_dir: str | os.PathLike) -> None:
    """Refuse to read run folder ``out_dir`` while another process writes into it, writing
    nothing there (a read-only folder is fine): its lock, when present, is tested with a
    shared lock on a read-only handle.

    Raises:
        RecordsError: another process holds the folder's lock.
    """
    path = Path(out_dir) / ".run.lock"
    if not path.is_file() or str(path.resolve()) in _LOCKS:  # none, or this process's own
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # unreadable lock: nothing can be said; a writer's rows are validated anyway
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RecordsError(
            f"stateremat records: another process is writing into {path.parent} (lock "
            f"{path.name} is held). Tip: wait for it to finish.") from None
    finally:
        os.close(fd)


def read_sidecar(path: Path) -> dict:
    """The JSON object of a records sidecar; errors name the file and what to do.

    Raises:
        RecordsError: unreadable, not UTF-8, not JSON (line and column of the file as it is),
            a key given twice in one object, or not a JSON object.
    """
    try:  # bytes, not read_text: its newline translation would shift the error's position
        doc = loads_json(read_regular_bytes(path).decode("utf-8"))  # a FIFO never blocks
    except DuplicateKeyError as exc:
        raise RecordsError(f"stateremat records: sidecar {path}: {exc}. Tip: restore it from a "
                           "copy, or use a new --out folder; a run writes each key once.") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordsError(f"stateremat records: cannot read sidecar {path} "
                           f"({type(exc).__name__}: {exc}). Tip: restore it from a copy, or use "
                           "a new --out folder; its rows cannot be described without it.") from None
    if not isinstance(doc, dict):
        raise RecordsError(f"stateremat records: sidecar {path} holds {type(doc).__name__}, not "
                           "a JSON object. Tip: restore it from a copy, or use a new --out folder.")
    for field, (ok, what) in _SIDECAR_FIELDS.items():
        if field in doc and not ok(doc[field]):
            raise RecordsError(
                f"stateremat records: sidecar {path} gives {field!r} as "
                f"{_short(doc[field], 60)} ({type(doc[field]).__name__}), not {what}; it was "
                "changed by something else than its run. Tip: restore it from a copy, or use a "
                "new --out folder.")
    spec = table_spec(path.stem) if path.name != MANIFEST else None
    if spec is not None and spec.config and isinstance(doc.get("config"), dict):
        check_config(path, doc["config"], spec.config)
    return doc


def _list_of(kind: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(isinstance(x, kind) for x in v)


#: The fields a sidecar (or a run folder's manifest) may hold, each with its check: a field of
#: another kind is refused before anything reads it.
_SIDECAR_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "table": (lambda v: isinstance(v, str), "a table name"),
    "key": (_list_of(str), "a list of column names"),
    "config": (lambda v: v is None or isinstance(v, dict), "an object (the run's config)"),
    "provenance": (lambda v: isinstance(v, dict), "an object"),
    "launches": (_list_of(dict), "a list of objects (one per launch)"),
    "resumed_utc": (_list_of(str), "a list of UTC times"),
    "has_rows": (lambda v: isinstance(v, bool), "true or false"),
    "command": (lambda v: isinstance(v, str), "a command"),
    "created_utc": (lambda v: isinstance(v, str), "a UTC time"),
    RUN_ID: (lambda v: isinstance(v, str) and len(v) == 32
             and all(ch in "0123456789abcdef" for ch in v), "a run id (32 hex digits)"),
}


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


@dataclass(frozen=True)
class TableSpec:
    """One records table's declared row schema (names, types, nullability) and key columns.

    Attributes:
        name: the table (its rows folder under a run folder).
        schema: every column a row may have; key columns are never null.
        key: the columns identifying a row; no two rows of a run share them.
        optional: columns added after parts were first written: an older part may lack them
            (read as null). Each is nullable.
        unique: no two rows share a key (False: a table that keeps every attempt of a unit).
        distinct_by: further columns told apart in the duplicate check (an ``attempt`` column of
            a table keeping every attempt of a unit): no two rows share key + these. Where an
            older part lacks one (an optional column), each part counts as its own attempt.
        values: column -> the rule its values keep (:mod:`._values`), checked on every read.
        config: sidecar config field path -> what it may hold, checked when the sidecar is read.
    """

    name: str
    schema: pa.Schema
    key: tuple[str, ...]
    optional: frozenset[str] = frozenset()
    unique: bool = True
    distinct_by: tuple[str, ...] = ()
    values: Mapping[str, Rule] = field(default_factory=dict)
    config: Mapping[str, ConfigField] = field(default_factory=dict)


#: table -> its declared spec, filled by :func:`declare_table`: every table the paper's commands
#: write is declared in :mod:`.tables`, which this package imports (so no spec depends on what
#: else a process imported).
_SPECS: dict[str, TableSpec] = {}


def declare_table(name: str, columns: Sequence[tuple[str, pa.DataType]], key: Sequence[str], *,
                  required: Sequence[str] = (), optional: Sequence[str] = (),
                  unique: bool = True, distinct_by: Sequence[str] = (),
                  values: Mapping[str, Rule] | None = None,
                  config: Mapping[str, ConfigField] | None = None,
                  constant_in: Mapping[tuple[str, ...], Sequence[str]] | None = None) -> TableSpec:
    """Declare table ``name``'s row schema: ``columns`` as ``(name, type)``; the ``key`` and
    ``required`` columns are not nullable, the others are. ``values`` gives columns' value rules
    (checked on every read, against the run's sidecar config), ``config`` the sidecar config
    fields' kinds and ranges (checked before any reader uses them). ``constant_in`` maps a
    prefix of ``key`` (``()``: the whole run) to the columns that keep one value in all rows
    sharing it (a method's policy and feasibility in every step's row), added to their rules.
    Returns the spec (also registered). The paper's tables are declared in :mod:`.tables`, which
    this package imports, so a spec never depends on what else a process imported."""
    key = tuple(key)
    strict = set(key) | set(required)
    names = [c for c, _ in columns]
    assert set(key) <= set(names) and not strict & set(optional), (name, key, optional)
    schema = pa.schema([pa.field(c, t, nullable=c not in strict) for c, t in columns])
    assert set(distinct_by) <= set(names) and not set(distinct_by) & set(key), (name, distinct_by)
    assert set(values or {}) <= set(names), (name, set(values or {}) - set(names))
    values = dict(values or {})
    for by, cols in (constant_in or {}).items():
        assert tuple(by) == key[:len(by)] and set(cols) <= set(names), (name, by, cols)
        for c in cols:
            values[c] = all_of(values.get(c), constant(*by))
    spec = TableSpec(name, schema, key, frozenset(optional), unique, tuple(distinct_by),
                     values, dict(config or {}))
    _SPECS[name] = spec
    return spec


def table_spec(table: str) -> TableSpec | None:
    """The declared spec of ``table`` (every table :mod:`.tables` declares is known once this
    package is imported); None for a table nobody declared (e.g. a test's)."""
    return _SPECS.get(table)


def _schema_error(path: Path, spec_name: str, column: str, what: str,
                  names: Sequence[str] = ()) -> RecordsError:
    other = [t for t, sp in _SPECS.items() if t != spec_name and names
             and set(sp.key) <= set(names) <= set(sp.schema.names)]
    hint = f" It looks like a part of table {other[0]!r}." if other else ""
    return RecordsError(
        f"stateremat records: {path} does not match table {spec_name!r}'s schema: column "
        f"{column!r} {what}.{hint} Tip: this part was not written by this table's run; move it "
        "out of the folder (keep it if it belongs elsewhere), then rerun the run's command with "
        "the same --out to redo its rows.")


def _check_part(path: Path, tbl: pa.Table, spec: TableSpec) -> pa.Table:
    """``tbl`` (part ``path``) checked against ``spec`` and cast to it (declared column order,
    absent optional columns as nulls, all-null columns typed).

    Raises:
        RecordsError: naming ``path`` and the first column that differs.
    """
    declared = spec.schema
    names = tbl.schema.names
    seen: set[str] = set()
    for f in tbl.schema:
        if f.name in seen:
            raise _schema_error(path, spec.name, f.name, "appears twice", names)
        seen.add(f.name)
        want = declared.field(f.name) if f.name in declared.names else None
        if want is None:
            raise _schema_error(path, spec.name, f.name, "is not one of its columns", names)
        if (_plain(f.type) != want.type
                and not (pa.types.is_null(f.type) and want.nullable)):
            raise _schema_error(path, spec.name, f.name,
                                f"has type {f.type}, not {want.type}", names)
        if not want.nullable and tbl.column(f.name).null_count:
            raise _schema_error(path, spec.name, f.name, "holds nulls (it may not)", names)
    absent = _absent_columns(tbl)
    for want in declared:  # a key column is never missing; another column only when it is
        # optional (added after older parts were written) or the writer said its rows did not
        # give it (ABSENT_KEY): read as absent, or null where another part has it
        if want.name not in seen and want.name in spec.key:
            raise _schema_error(path, spec.name, want.name, "is missing (a key column)", names)
        if want.name not in seen and want.name not in spec.optional and want.name not in absent:
            raise _schema_error(path, spec.name, want.name, "is missing", names)
    cols = [tbl.column(f.name).cast(f.type) if f.name in seen else pa.nulls(tbl.num_rows, f.type)
            for f in declared]
    return pa.Table.from_arrays(cols, schema=declared)


#: Parquet schema metadata key of a part written by :meth:`RecordStore.append`: the JSON list
#: of declared columns its rows did not give (a part missing another column is refused).
ABSENT_KEY = b"stateremat.absent_columns"


#: Parquet schema metadata key of every part :meth:`RecordStore.append` writes: the JSON object
#: ``{"table": ..., "config": ...}`` naming the table and the run (its sidecar config) it
#: belongs to. A reader refuses a part of another table or another run.
PART_KEY = b"stateremat.part"


def part_identity(table: str, config: Any, run_id: str | None = None) -> bytes:
    """The :data:`PART_KEY` value of a part of ``table`` written by the run of ``config``
    (a sidecar's config, as JSON holds it) and ``run_id`` (its sidecar's :data:`RUN_ID`; None
    for a run made before run ids, whose parts name none)."""
    ident = {"table": table, "config": config}
    if run_id is not None:
        ident["run"] = run_id
    return json.dumps(ident, sort_keys=True, default=json_default).encode()


_STAMP_TIP = ("Tip: move it out of the folder (keep it if it belongs elsewhere), then rerun the "
              "run's command with the same --out to redo its rows.")


def _check_identity(path: Path, tbl: pa.Table, table: str, config: Any,
                    run_id: str | None = None) -> None:
    """Refuse part ``path`` unless its :data:`PART_KEY` says it is ``table``'s, written by the run
    of ``config`` and ``run_id`` (the sidecar's; None: a run made before run ids, whose parts
    name none) (``config`` None: no sidecar says which run; only the table is compared).

    Raises:
        RecordsError: naming the file and the table or config fields that differ.
    """
    raw = (tbl.schema.metadata or {}).get(PART_KEY)
    try:
        ident = json.loads(raw) if raw is not None else None
    except ValueError:
        ident = None
    if not isinstance(ident, dict) or not isinstance(ident.get("table"), str):
        raise RecordsError(
            f"stateremat records: {path} does not say which table and run it belongs to (no "
            f"{PART_KEY.decode()} note, which every part this version writes has), so it may "
            "be another run's. Tip: a part written before the note: if every part of this "
            "folder is its own run's, stamp them once with `python tools/stamp_parts.py "
            f"{path.parent.parent}`; otherwise move it out of the folder and rerun the run's "
            "command with the same --out to redo its rows.")
    if ident["table"] != table:
        raise RecordsError(
            f"stateremat records: {path} is a part of table {ident['table']!r}, not of "
            f"{table!r} (its folder); it was copied or moved in. {_STAMP_TIP}")
    if config is not None and ident.get("config") != config:
        raise RecordsError(
            f"stateremat records: {path} was written by another run of table {table!r} (its "
            f"config differs from the sidecar's: {_config_diff(ident.get('config') or {}, config)}"
            f"); it was copied or moved in. {_STAMP_TIP}")
    if config is not None and ident.get("run") != run_id:
        raise _other_run(path, table, ident.get("run"), run_id)


def _other_run(path: Path, table: str, got: Any, want: str | None) -> RecordsError:
    if want is None:
        why = (f"it names run {_short(got, 40)}, but the sidecar names none (a run made before "
               "run ids, whose parts name none)")
    elif got is None:
        why = (f"it names no run, but the sidecar's run is {want} (each part of that run names "
               "it)")
    else:
        why = f"it names run {_short(got, 40)}, not the sidecar's {want}"
    return RecordsError(
        f"stateremat records: {path} was written by another run of table {table!r} with the same "
        f"config ({why}); it was copied or moved in. {_STAMP_TIP}")


def _absent_columns(tbl: pa.Table) -> set[str]:
    """The declared columns the writer of part ``tbl`` said its rows did not give."""
    raw = (tbl.schema.metadata or {}).get(ABSENT_KEY)
    if raw is None:
        return set()
    try:
        names = json.loads(raw)
    except ValueError:
        return set()
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with large string/binary as their plain kinds (pandas writes the large ones)."""
    return {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}.get(t, t)


def _observed_spec(table: str, tbl: pa.Table, key: Sequence[str]) -> TableSpec:
    """For a table nobody declared: the schema of its first part, every column nullable (and,
    but for the key, optional: nothing says which columns another part must have)."""
    schema = pa.schema([pa.field(f.name, f.type, nullable=True) for f in tbl.schema])
    return TableSpec(table, schema, tuple(key), optional=frozenset(schema.names) - set(key))


def _unreadable(p: Path, exc: BaseException) -> RecordsError:
    if isinstance(exc, OSError) and not exc.strerror:  # pyarrow's names only the file: ask why
        try:
            os.stat(p)
        except OSError as real:
            exc = real
    detail = str(exc).strip().rstrip(".")
    if isinstance(exc, OSError) and exc.strerror:  # not "X: X": say what the system said
        detail = exc.strerror
    if isinstance(exc, OSError) and exc.errno == errno.EINVAL and "not a regular file" in detail:
        tip = ("Tip: a part is a regular file, so this is not one; move it out of the folder, "
               "then rerun.")
    elif isinstance(exc, OSError) and os.path.islink(p) and exc.errno in (errno.ELOOP, errno.ENOENT):
        tip = ("Tip: it is a symbolic link that loops or points nowhere, not a part; move it "
               "out of the folder (or put the real part there), then rerun.")
    elif isinstance(exc, OSError) and not isinstance(exc, (pa.ArrowInvalid,)):
        tip = ("Tip: make it readable (check its permissions and the disk), then rerun; the "
               "part itself may be fine, so keep it.")
    else:
        tip = ("Tip: a part is written atomically, so this file was changed by something "
               "else; move it out of the folder (or delete it), then rerun the run's command "
               "with the same --out to redo its rows.")
    return RecordsError(f"stateremat records: cannot read {p}: {detail}. {tip}")


def _rows_dir(out_dir: Path, table: str) -> Path:
    """``out_dir/table``, refused when it is a symbolic link that loops or dangles."""
    d = out_dir / table
    if d.is_symlink():
        try:
            d.resolve(strict=True)
        except (OSError, RuntimeError):
            raise RecordsError(
                f"stateremat records: the rows folder {d} of table {table!r} is a symbolic link "
                f"that loops (or points nowhere): {os.readlink(d)!r}. Tip: put the table's "
                "real rows folder there (restore it from a copy), or use a new --out "
                "folder.") from None
    if d.exists() and not d.is_dir():
        raise RecordsError(f"stateremat records: {d}, the rows folder of table {table!r}, is "
                           "not a folder. Tip: restore it from a copy, or use a new --out folder.")
    return d


def _parts(d: Path) -> list[Path]:
    """The ``part-*.parquet`` files of rows folder ``d``, sorted; a folder that cannot be
    listed is refused (it is not known to be empty)."""
    try:
        names = [e.name for e in os.scandir(d)]
    except OSError as exc:
        raise RecordsError(
            f"stateremat records: cannot list the rows folder {d}: {exc.strerror or exc}, so its "
            f"rows cannot be read (it may hold them). Tip: make it readable (chmod u+rx {d}), "
            "then rerun.") from None
    return sorted(d / n for n in names if n.startswith("part-") and n.endswith(".parquet"))


def _read_part(p: Path) -> pa.Table:
    """One part; a folder, named pipe or device named like a part is refused (not read as a
    dataset, not waited on); a file name that is not UTF-8 (legal on the file system, refused by
    pyarrow's own path handling) is read through a Python file."""
    mode = os.stat(p).st_mode
    if not stat.S_ISREG(mode):
        raise not_a_regular_file(p, mode)
    try:
        str(p).encode("utf-8")
    except UnicodeEncodeError:
        with open(p, "rb") as fh:
            return pq.read_table(fh)
    return pq.read_table(p)


def _rows_table(table: str, rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """``rows`` as a table of ``schema``; a value that does not fit its column's declared type is
    refused naming the table, the column and the value."""
    try:
        return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        for f in schema:
            for r in rows:
                try:
                    pa.array([r.get(f.name)], type=f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                    raise RecordsError(
                        f"stateremat records: rows for {table!r} give column {f.name!r} the "
                        f"value {r.get(f.name)!r}, not of its declared type {f.type}. This is a "
                        "bug in the caller, please report it.") from exc
        raise RecordsError(f"stateremat records: rows for {table!r} do not fit its declared "
                           f"schema ({exc}). This is a bug in the caller, please report it.") from exc


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
        self._has_rows = False
        lock_run(self.out_dir)
        self.spec = table_spec(table)
        _rows_dir(self.out_dir, table).mkdir(parents=True, exist_ok=True)
        self.sidecar = self.out_dir / f"{table}.json"
        config = dict(meta or {})
        self._config = json.loads(json.dumps(config, default=json_default))
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
            self._run_id = old.get(RUN_ID)  # None: a run made before run ids (its parts name none)
            old.setdefault("resumed_utc", []).append(provenance()["created_utc"])
            if launch is not None:
                old.setdefault("launches", []).append(dict(launch))
            atomic_write_json(self.sidecar, old)
        else:
            self._run_id = _folder_run_id(self.out_dir)
            doc = {"table": table, "key": list(self.key), "config": config,
                   RUN_ID: self._run_id, "provenance": provenance()}
            if launch is not None:
                doc["launches"] = [dict(launch)]
            atomic_write_json(self.sidecar, doc)

    def _mark_has_rows(self) -> None:
        # Said once in the sidecar, right after the first part: an empty rows folder then means
        # rows were removed (refused by read_records), not a run that wrote none yet.
        doc = read_sidecar(self.sidecar)
        if not doc.get("has_rows"):
            doc["has_rows"] = True
            atomic_write_json(self.sidecar, doc)
        self._has_rows = True

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
        ident = {PART_KEY: part_identity(self.table, self._config, self._run_id)}
        if self.spec is None:
            tbl = pa.Table.from_pylist([dict(r) for r in rows])
            tbl = tbl.replace_schema_metadata({**(tbl.schema.metadata or {}), **ident})
        else:
            extra = sorted({c for r in rows for c in r} - set(self.spec.schema.names))
            if extra:
                raise RecordsError(f"stateremat records: rows for {self.table!r} have columns "
                                   f"{extra} its schema does not declare. This is a bug in the "
                                   "caller, please report it.")
            have = {c for r in rows for c in r}
            schema = pa.schema([f for f in self.spec.schema if f.name in have])
            absent = [f.name for f in self.spec.schema if f.name not in have and f.name not in self.spec.optional]
            schema = schema.with_metadata({ABSENT_KEY: json.dumps(absent).encode(), **ident})
            tbl = _rows_table(self.table, rows, schema)
            _check_part(self.dir / "(new part)", tbl, self.spec)
        buf = io.BytesIO()
        pq.write_table(tbl, buf)
        name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{next(_counter):06d}.parquet"
        atomic_write_bytes(self.dir / name, buf.getvalue())
        self._last_part = name
        if not self._has_rows:  # after the part: a stop between the two leaves a part, never a false claim
            self._mark_has_rows()
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

        Raises:
            RecordsError: a part cannot be read or differs from the table's schema (each part
                is checked as :func:`read_records` checks it, before anything is rewritten).
        """
        dropped = 0
        for p in sorted(self.dir.glob("part-*.parquet")):
            if keep_last_part and p.name == self._last_part:
                continue
            try:  # as read() reads it: a FIFO is refused (never waited on), a non-UTF-8 name read
                tbl = _read_part(p)
            except Exception as exc:  # unreadable or corrupt part: say which file
                raise _unreadable(p, exc) from exc
            spec = self.spec or _observed_spec(self.table, tbl, self.key)
            df = _check_part(p, tbl, spec).to_pandas()  # typed as declared, same row order
            _check_identity(p, tbl, self.table, self._config, self._run_id)
            check_rows([p] * len(df), self.table, df, spec.values, spec.key, self._config)
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
        """All rows written so far (every part, each validated), as a DataFrame."""
        return read_records(self.out_dir, self.table, key=self.key, finished=False)


def read_records(out_dir: str | os.PathLike, table: str, *, key: Sequence[str] | None = None,
                 finished: bool = True) -> pd.DataFrame:
    """Read every Parquet part of ``table`` under ``out_dir``, each validated before use.

    Each part must match the table's declared schema (:func:`declare_table`; for a table
    nobody declared, the first part's), and no two rows may share a key. With a sidecar
    ``<table>.json`` present, the rows folder must exist and be a real folder; when
    ``finished`` (not a run resuming) and the sidecar says rows were written, it must hold
    parts. Empty frame when there is neither sidecar nor rows.

    Raises:
        RecordsError: a part cannot be read or differs from the schema (naming the file and
            the first differing column), duplicate keys (naming both files), or a missing,
            empty or self-linked rows folder.
    """
    out = Path(out_dir)
    d = _rows_dir(out, table)
    sidecar = out / f"{table}.json"
    doc = read_sidecar(sidecar) if sidecar.exists() else None
    if doc is not None and not d.is_dir():
        raise RecordsError(
            f"stateremat records: the rows folder {d} of table {table!r} is missing, though its "
            f"sidecar {sidecar} is there. Tip: restore the folder from a copy, or rerun the "
            "run's command with the same --out to redo its rows.")
    parts = _parts(d) if d.is_dir() else []
    if not parts:
        if finished and doc is not None and doc.get("has_rows"):
            raise RecordsError(
                f"stateremat records: the rows folder {d} of table {table!r} is empty, though "
                f"its run wrote rows ({sidecar} says so). Tip: restore its parts from a copy, "
                "or rerun the run's command with the same --out to redo its rows.")
        return pd.DataFrame()
    spec = table_spec(table)
    if key is None:
        key = spec.key if spec is not None else tuple((doc or {}).get("key") or ())
    tables, origin, present = [], [], set()
    for p in parts:
        try:
            tbl = _read_part(p)
        except Exception as exc:  # unreadable or corrupt part: say which file
            raise _unreadable(p, exc) from exc
        if spec is None:
            spec = _observed_spec(table, tbl, key)
        tables.append(_check_part(p, tbl, spec))
        _check_identity(p, tbl, table, None if doc is None else doc.get("config"),
                        None if doc is None else doc.get(RUN_ID))
        present.update(tbl.schema.names)
        origin.append(p)
    # An optional column no part has stays absent (as before it was declared).
    df = pa.concat_tables(tables).select(
        [n for n in spec.schema.names if n in present]).to_pandas()
    where = [origin[i] for i, t in enumerate(tables) for _ in range(t.num_rows)]
    check_rows(where, table, df, spec.values, spec.key,
               (doc or {}).get("config") if isinstance((doc or {}).get("config"), dict) else {})
    key = [k for k in key if k in df.columns]
    if key and spec.unique:
        check, key = df, key + [c for c in spec.distinct_by if c not in key]
        if spec.distinct_by:  # an older part without the column: each part its own attempt
            part_no = pd.Series([-1 - i for i, t in enumerate(tables) for _ in range(t.num_rows)],
                                index=df.index)
            check = df.assign(**{c: (df[c].astype("Int64").fillna(part_no) if c in df else part_no)
                                 for c in spec.distinct_by})
        dup = check.duplicated(key, keep=False)
        if dup.any():
            idx = list(check.index[dup.to_numpy()])
            first = tuple(check.loc[idx[0], key])
            files = sorted({str(where[i]) for i in idx
                            if tuple(check.loc[i, key]) == first})
            raise RecordsError(
                f"stateremat records: table {table!r} holds {int(dup.sum())} rows with a "
                f"duplicate key; e.g. { {k: plain_value(v) for k, v in zip(key, first)} } in {', '.join(files)}. Tip: a run "
                "writes each key once, so a part was copied or moved in; move the one that is "
                "not the run's own out of the folder, then rerun with the same --out.")
    return df


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
