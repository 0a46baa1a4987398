"""Every row a command reads is validated before use (issue 27): declared schemas, keys,
another table's parts, missing/empty/self-linked rows folders, report on damaged folders,
folder ownership and temporary names at the file-name limit. Tiny tables written by the
store itself."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _cli import run_cli
from stateremat._shared.io import atomic_write_bytes
from stateremat.paper.records import RecordsError
from stateremat.paper.records import RecordStore, check_resumable, read_records, table_spec
from stateremat.paper.records import PART_KEY

STATUS_KEY = ["process", "attempt"]
TIMING_KEY = ["process", "cell", "method", "step"]


def _status_rows(n: int = 3, attempt: int = 0) -> list[dict]:
    return [{"process": p, "attempt": attempt, "status": "ok", "exit_code": 0,
             "stderr_tail": "", "wall_s": 1.5, "hostname": "h", "n_rows": 4,
             "executor": "local", "requested_processes": n} for p in range(n)]


def _status_run(out: Path, n: int = 3) -> Path:
    store = RecordStore(out, "cohort_processes", key=STATUS_KEY, meta={"k": 1})
    store.append(_status_rows(n))
    return next((out / "cohort_processes").glob("part-*.parquet"))


def test_every_paper_table_declares_a_schema_with_non_null_keys():
    for table in ("finite", "engines", "alias", "bench", "moco", "semantics",
                  "semantics_stateremat_jax", "cohort_timing", "cohort_processes"):
        spec = table_spec(table)
        assert spec is not None and spec.key, table
        for k in spec.key:
            assert not spec.schema.field(k).nullable, (table, k)


def test_a_part_with_the_right_names_but_string_types_is_refused(tmp_path):
    part = _status_run(tmp_path)
    tbl = pq.read_table(part)
    junk = pa.table({n: pa.array([str(v) for v in tbl.column(n).to_pylist()])
                     for n in tbl.schema.names})
    pq.write_table(junk, part)
    with pytest.raises(RecordsError) as err:
        read_records(tmp_path, "cohort_processes")
    assert str(part) in str(err.value) and "'process'" in str(err.value)
    assert "has type string, not int64" in str(err.value)
    # a rerun (resume) refuses it too, before keeping or redoing anything
    with pytest.raises(RecordsError, match="does not match"):
        RecordStore(tmp_path, "cohort_processes", key=STATUS_KEY, meta={"k": 1}).done_keys()


@pytest.mark.parametrize("column", ["wall_s", "hostname", "status"])
def test_a_part_missing_a_non_key_column_is_refused_naming_file_and_column(tmp_path, column):
    """A part whose columns are right but one (not a key, not optional) is missing: not one the
    store wrote (it notes the columns its rows did not give), so it is refused by name."""
    part = _status_run(tmp_path)
    tbl = pq.read_table(part)
    pq.write_table(tbl.drop_columns([column]).replace_schema_metadata(None), part)
    with pytest.raises(RecordsError) as err:
        read_records(tmp_path, "cohort_processes")
    msg = str(err.value)
    assert str(part) in msg and f"column {column!r} is missing" in msg
    with pytest.raises(RecordsError, match=f"column {column!r} is missing"):  # resume refuses it too
        RecordStore(tmp_path, "cohort_processes", key=STATUS_KEY, meta={"k": 1}).done_keys()


def test_rows_that_do_not_give_a_column_read_back_without_it(tmp_path):
    """The store's own part of rows lacking some columns (a reduced row) says so and is read;
    an optional column added later may be missing from an older part."""
    store = RecordStore(tmp_path, "cohort_processes", key=STATUS_KEY, meta={})
    store.append([{"process": 0, "attempt": 0, "status": "failed"}])
    df = read_records(tmp_path, "cohort_processes")
    assert len(df) == 1 and "wall_s" not in df and df["status"].tolist() == ["failed"]
    part = next((tmp_path / "cohort_processes").glob("part-*.parquet"))
    full = RecordStore(tmp_path / "b", "cohort_processes", key=STATUS_KEY, meta={})
    full.append([{k: v for k, v in r.items() if k != "requested_processes"} for r in _status_rows(1)])
    older = next((tmp_path / "b" / "cohort_processes").glob("part-*.parquet"))
    tbl = pq.read_table(older)  # an older writer's part: no note of absent columns
    pq.write_table(tbl.replace_schema_metadata({PART_KEY: tbl.schema.metadata[PART_KEY]}), older)
    assert read_records(tmp_path / "b", "cohort_processes")["process"].tolist() == [0]
    assert part.exists()


def test_a_part_of_another_table_is_refused_and_named(tmp_path):
    timing = RecordStore(tmp_path / "a", "cohort_timing", key=TIMING_KEY, meta={})
    timing.append([{"process": 0, "cell": "c", "method": "m", "step": s, "attempt": 0,
                    "step_time_s": 0.1, "peak_bytes": 10} for s in range(3)])
    _status_run(tmp_path / "b")
    moved = next((tmp_path / "a" / "cohort_timing").glob("part-*.parquet"))
    dest = tmp_path / "b" / "cohort_processes" / "part-zz-moved.parquet"
    shutil.move(moved, dest)
    with pytest.raises(RecordsError) as err:
        read_records(tmp_path / "b", "cohort_processes")
    msg = str(err.value)
    assert str(dest) in msg and "is not one of its columns" in msg
    assert "table 'cohort_timing'" in msg


def test_duplicate_keys_are_refused_naming_both_files(tmp_path):
    part = _status_run(tmp_path)
    copy = part.with_name("part-zz-copy.parquet")
    shutil.copy(part, copy)
    with pytest.raises(RecordsError) as err:
        read_records(tmp_path, "cohort_processes")
    msg = str(err.value)
    assert "duplicate key" in msg and str(part) in msg and str(copy) in msg
    assert "e.g. {'process': 0, " in msg and "np." not in msg  # the key as the user wrote it


def test_a_missing_rows_folder_is_refused(tmp_path):
    _status_run(tmp_path)
    shutil.rmtree(tmp_path / "cohort_processes")
    with pytest.raises(RecordsError, match="is missing, though its sidecar"):
        read_records(tmp_path, "cohort_processes")


def test_an_emptied_rows_folder_is_refused_but_a_fresh_one_is_not(tmp_path):
    RecordStore(tmp_path / "fresh", "cohort_processes", key=STATUS_KEY, meta={})
    assert read_records(tmp_path / "fresh", "cohort_processes").empty  # nothing written yet
    part = _status_run(tmp_path / "run")
    part.unlink()
    with pytest.raises(RecordsError, match="is empty, though its run wrote rows"):
        read_records(tmp_path / "run", "cohort_processes")


def test_a_self_linked_rows_folder_is_refused(tmp_path):
    _status_run(tmp_path)
    d = tmp_path / "cohort_processes"
    shutil.rmtree(d)
    os.symlink(d.name, d)  # a link to itself
    with pytest.raises(RecordsError, match="symbolic link that loops"):
        read_records(tmp_path, "cohort_processes")
    with pytest.raises(RecordsError, match="symbolic link that loops"):
        RecordStore(tmp_path, "cohort_processes", key=STATUS_KEY, meta={"k": 1})


def test_rows_with_undeclared_columns_are_refused_on_write(tmp_path):
    store = RecordStore(tmp_path, "cohort_processes", key=STATUS_KEY, meta={})
    with pytest.raises(RecordsError, match="does not declare"):
        store.append([{"process": 0, "attempt": 0, "bogus": 1}])


def test_valid_parts_read_back_typed(tmp_path):
    _status_run(tmp_path)
    df = read_records(tmp_path, "cohort_processes")
    assert len(df) == 3 and str(df["process"].dtype) == "int64"


@pytest.fixture(scope="module")
def alias_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("alias") / "run"
    assert run_cli("verify", "alias", "--seeds", "1", "--out", out).exit_code == 0
    assert run_cli("report", out).exit_code == 0
    return out


def _copy(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    (dest / ".run.lock").unlink(missing_ok=True)
    return dest


def test_report_refuses_a_string_typed_part_with_exit_2_and_keeps_outputs(alias_run, tmp_path):
    out = _copy(alias_run, tmp_path / "run")
    md = (out / "alias.md").read_text()
    part = sorted((out / "alias").glob("part-*.parquet"))[0]
    tbl = pq.read_table(part)
    pq.write_table(pa.table({n: pa.array([None if v is None else str(v)
                                           for v in tbl.column(n).to_pylist()],
                                          type=pa.string())
                             for n in tbl.schema.names}), part)
    res = run_cli("report", out)
    assert res.exit_code == 2, res.output
    assert str(part) in res.output and "does not match" in res.output
    assert (out / "alias.md").read_text() == md  # earlier outputs kept


def test_report_refuses_a_deleted_rows_folder_and_keeps_outputs(alias_run, tmp_path):
    out = _copy(alias_run, tmp_path / "run")
    shutil.rmtree(out / "alias")
    res = run_cli("report", out)
    assert res.exit_code == 2, res.output
    assert "is missing, though its sidecar" in res.output
    assert (out / "alias.md").exists()


def test_report_on_an_unreadable_part_keeps_outputs_and_never_says_delete(alias_run, tmp_path,
                                                                         monkeypatch):
    import stateremat.paper.records._store as store

    out = _copy(alias_run, tmp_path / "run")
    part = sorted((out / "alias").glob("part-*.parquet"))[0]
    read = store.pq.read_table

    def unreadable(path, *a, **k):  # what a part without read permission does (even as root)
        if Path(path) == part:
            raise PermissionError(13, "Permission denied", str(path))
        return read(path, *a, **k)

    monkeypatch.setattr(store.pq, "read_table", unreadable)
    md = (out / "alias.md").read_bytes()
    res = run_cli("report", out)
    assert res.exit_code == 2, res.output
    assert str(part) in res.output and "make it readable" in res.output
    assert "delete" not in res.output, res.output
    assert (out / "alias.md").read_bytes() == md


def test_temporary_names_fit_when_the_final_name_does(tmp_path):
    for name in ("a" * 255, "a" * 254, "\u00e9" * 127 + "a"):
        assert len(name.encode()) <= 255
        atomic_write_bytes(tmp_path / name, b"x")
        assert (tmp_path / name).read_bytes() == b"x"
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("legacy", [False, True])
def test_a_folder_belongs_to_the_command_that_created_it(alias_run, tmp_path, legacy):
    out = _copy(alias_run, tmp_path / "run")
    if legacy:  # a folder made before manifests: judged by its tables' sidecars
        (out / ".run.json").unlink()
    else:
        assert json.loads((out / ".run.json").read_text())["command"] == \
            "stateremat verify alias"
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    res = run_cli("bench", "fair", "--preset", "cpu", "--out", out)
    assert res.exit_code == 2, res.output
    assert "stateremat verify alias" in res.output and "stateremat bench fair" in res.output
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {k: v for k, v in after.items() if k != ".run.json"} == \
        {k: v for k, v in before.items() if k != ".run.json"}
    assert not (out / "bench.json").exists() and not (out / "cards").exists()
    # its own command resumes there
    assert run_cli("verify", "alias", "--seeds", "1", "--out", out).exit_code == 0


def test_report_runs_on_a_read_only_folder_writing_only_into_out(alias_run, tmp_path):
    src = _copy(alias_run, tmp_path / "run")
    (src / ".run.lock").write_bytes(b"")  # a finished run's lock file, held by nobody
    before = {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    modes = {p: p.stat().st_mode for p in [src, *src.rglob("*")]}
    for p in sorted(modes, reverse=True):
        if p.is_dir():
            p.chmod(0o555)
    try:
        dest = tmp_path / "tables"
        res = run_cli("report", src, "--out", dest)
        assert res.exit_code == 0, res.output
        assert (dest / "alias.md").read_bytes() == before[Path("alias.md")]
    finally:
        for p, m in modes.items():
            p.chmod(m)
    after = {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing removed


def test_report_without_out_on_a_read_only_folder_says_to_pass_out(alias_run, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into any folder")
    src = _copy(alias_run, tmp_path / "run")
    src.chmod(0o555)
    try:
        res = run_cli("report", src)
    finally:
        src.chmod(0o755)
    assert res.exit_code == 2 and "--out" in res.output


def _moco_row(seed: int, method: str, outcome: str, **kw) -> dict:
    return {"seed": seed, "method": method, "outcome": outcome, **kw}


def test_moco_rows_are_checked_for_duplicate_keys_attempts_told_apart(tmp_path):
    """The moco table keeps every attempt of a (seed, method) (a failed run beside its retry),
    told apart by ``attempt``: a part copied in is a duplicate and refused, naming both files."""
    store = RecordStore(tmp_path, "moco", key=["seed", "method"], meta={})
    store.append([_moco_row(1, "eager", "error", attempt=0)])
    store.append([_moco_row(1, "eager", "ok", attempt=1)])
    store.append([_moco_row(1, "whole", "ok", attempt=0)])
    assert len(read_records(tmp_path, "moco")) == 3  # a retry is no duplicate
    part = sorted((tmp_path / "moco").glob("part-*.parquet"))[1]
    copy = part.with_name("part-zz-copy.parquet")
    shutil.copy(part, copy)
    with pytest.raises(RecordsError) as err:
        read_records(tmp_path, "moco")
    msg = str(err.value)
    assert "duplicate key" in msg and str(part) in msg and str(copy) in msg
    with pytest.raises(RecordsError, match="duplicate key"):  # a resume refuses it too
        RecordStore(tmp_path, "moco", key=["seed", "method"], meta={}).done_keys()


def test_older_moco_parts_without_attempts_keep_their_retries(tmp_path):
    """Parts written before ``attempt`` existed: one row each, each part its own attempt."""
    store = RecordStore(tmp_path, "moco", key=["seed", "method"], meta={})
    store.append([_moco_row(1, "eager", "error")])
    store.append([_moco_row(1, "eager", "ok")])
    assert read_records(tmp_path, "moco")["outcome"].tolist() == ["error", "ok"]
    part = next((tmp_path / "moco").glob("part-*.parquet"))
    pq.write_table(pa.concat_tables([pq.read_table(part)] * 2), part)  # one part holding a row twice
    with pytest.raises(RecordsError, match="duplicate key"):
        read_records(tmp_path, "moco")


def test_a_moco_retry_gets_the_next_attempt(tmp_path):
    from stateremat.paper.moco._app import _next_attempts

    store = RecordStore(tmp_path, "moco", key=["seed", "method"], meta={})
    store.append([_moco_row(1, "eager", "error")])  # an older part: no attempt column
    store.append([_moco_row(1, "eager", "error", attempt=1)])
    store.append([_moco_row(2, "eager", "ok", attempt=0)])
    assert _next_attempts(store) == {(1, "eager"): 2, (2, "eager"): 1}


def test_dropping_rows_validates_each_part_first(tmp_path):
    """``drop_rows`` (a moco rerun replacing rows whose score file is gone) reads every part
    through the same checks as ``read_records``: a part with the right names but string types is
    refused, named, and left as it was (not compared as text and silently kept)."""
    part = _status_run(tmp_path)
    store = RecordStore(tmp_path, "cohort_processes", key=STATUS_KEY, meta={"k": 1})
    assert store.drop_rows(lambda df: df["process"] == 2) == 1  # a valid part: the row goes
    tbl = pq.read_table(part)
    junk = pa.table({n: pa.array([str(v) for v in tbl.column(n).to_pylist()])
                     for n in tbl.schema.names})
    pq.write_table(junk, part)
    before = part.read_bytes()
    with pytest.raises(RecordsError) as err:
        store.drop_rows(lambda df: df["process"] == 1)
    assert str(part) in str(err.value) and "has type string, not int64" in str(err.value)
    assert part.read_bytes() == before
    part.write_bytes(b"not parquet")
    with pytest.raises(RecordsError, match="cannot read"):
        store.drop_rows(lambda df: df["process"] == 1)


def test_rows_of_the_wrong_type_are_refused_on_write_naming_the_table(tmp_path):
    """What a writer hands over is checked against the declared types too (a cohort's rows come
    from its processes' files): a clear error, not pyarrow's."""
    store = RecordStore(tmp_path, "cohort_processes", key=STATUS_KEY, meta={})
    bad = _status_rows(2)
    bad[1]["wall_s"] = "slow"
    with pytest.raises(RecordsError) as err:
        store.append(bad)
    assert "'cohort_processes'" in str(err.value) and "wall_s" in str(err.value)
    assert not list((tmp_path / "cohort_processes").glob("part-*"))


def test_a_stop_signal_during_an_atomic_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A stop (SIGINT) whose handler raises right after the temporary file is created, before
    the writer holds its name, still removes it and leaves the old file intact
    (test_interrupts[moco] found a ``.moco.json.*.tmp`` left by a sidecar write cut short right
    after the first part)."""
    import signal

    (tmp_path / "sidecar.json").write_bytes(b'{"old": true}')
    real = os.open

    def open_then_stop(path, *args, **kwargs):
        fd = real(path, *args, **kwargs)
        if str(path).endswith(".tmp"):
            os.kill(os.getpid(), signal.SIGINT)  # the file exists; the handler raises now
        return fd

    monkeypatch.setattr(os, "open", open_then_stop)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            atomic_write_bytes(tmp_path / "sidecar.json", b'{"new": true}')
    finally:
        signal.signal(signal.SIGINT, old)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["sidecar.json"]
    assert (tmp_path / "sidecar.json").read_bytes() == b'{"old": true}'
    atomic_write_bytes(tmp_path / "sidecar.json", b'{"new": true}')  # and it writes as before
    assert (tmp_path / "sidecar.json").read_bytes() == b'{"new": true}'


@pytest.mark.parametrize("field,value", [("config", [1]), ("config", "abc"), ("launches", "x"),
                                         ("launches", [1, 2]), ("has_rows", "yes"),
                                         ("resumed_utc", "now"), ("key", "process")])
def test_a_sidecar_with_a_field_of_the_wrong_kind_is_refused_naming_file_and_field(tmp_path, field,
                                                                                   value):
    """A sidecar is validated like a part: JSON of the right shape, not only an object (a
    list for ``config`` crashed a resume with AttributeError; report rendered over a string
    ``launches``)."""
    _status_run(tmp_path)
    sidecar = tmp_path / "cohort_processes.json"
    doc = json.loads(sidecar.read_text())
    doc[field] = value
    sidecar.write_text(json.dumps(doc))
    for attempt in (lambda: read_records(tmp_path, "cohort_processes"),
                    lambda: check_resumable(tmp_path, "cohort_processes", {"k": 1}),
                    lambda: RecordStore(tmp_path, "cohort_processes", key=STATUS_KEY, meta={"k": 1})):
        with pytest.raises(RecordsError) as err:
            attempt()
        assert str(sidecar) in str(err.value) and repr(field) in str(err.value)
    res = run_cli("report", tmp_path, "--out", tmp_path.parent / f"rep-{tmp_path.name}")
    assert res.exit_code == 2 and str(sidecar) in res.output, res.output


def test_a_sidecar_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    """`report` blocked forever on a sidecar replaced by a named pipe (waiting for a writer);
    now the table is refused at once (exit 2), naming the file and what it is."""
    import signal

    from _runs import copy_run

    out = copy_run(tmp_path, "verify-finite", "finite")
    (out / "finite.json").unlink()
    os.mkfifo(out / "finite.json")

    def hung(signum, frame):
        raise TimeoutError("report blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        res = run_cli("report", out, "--out", tmp_path / "rep")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert res.exit_code == 2, res.output
    assert f"cannot read sidecar {out / 'finite.json'}" in res.output
    assert "it is a named pipe (FIFO), not a regular file" in res.output


@pytest.mark.parametrize("kind, words", [("folder", "it is a folder"),
                                         ("fifo", "it is a named pipe (FIFO)")])
def test_a_part_name_that_is_not_a_file_is_named_for_what_it_is(tmp_path, kind, words):
    """A folder named like a part was read as a dataset ('column suite is missing (a key
    column)'), a named pipe as 'cannot read X: X' with a tip to keep it; both are now named for
    what they are, with a tip to move them out."""
    from _runs import copy_run

    out = copy_run(tmp_path, "verify-finite", "finite")
    part = sorted((out / "finite").glob("part-*.parquet"))[3]
    part.unlink()
    part.mkdir() if kind == "folder" else os.mkfifo(part)
    res = run_cli("report", out, "--out", tmp_path / "rep")
    assert res.exit_code == 2, res.output
    assert f"cannot read {part}: {words}, not a regular file. Tip: a part is a regular file, so " \
           "this is not one; move it out of the folder" in res.output.replace("\n", " ")
