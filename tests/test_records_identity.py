"""A part knows its table and run, and every row keeps its table's declared value rules.

Each case copies one committed run's table from ``results/cpu`` (the folder ``report`` reads)
into a temporary folder and changes one thing as a careless or hostile user would: a part of
another table or run moved in, one value edited, one sidecar config field of another kind.
Every read (``read_records``: report, resume, the readers) refuses it by file and cause.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _cli import run_cli
from _runs import copy_run
from stateremat.paper.records import PART_KEY, RecordStore, RecordsError, read_records, table_spec

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "results" / "cpu"


_copy = copy_run


def _edit(part: Path, select, column: str, value) -> None:
    """Set ``column`` of the first row ``select`` picks to ``value``; the part keeps its schema
    and notes (as an edit in place would)."""
    tbl = pq.read_table(part)
    df = tbl.to_pandas()
    i = int(np.flatnonzero(select(df).to_numpy())[0])
    df.loc[df.index[i], column] = value
    pq.write_table(pa.Table.from_pandas(df, schema=tbl.schema, preserve_index=False), part)


def test_committed_runs_read_and_name_their_table_and_run():
    for sc in sorted(CPU.rglob("*.json")):
        rows = sc.parent / sc.stem
        if rows.is_dir() and table_spec(sc.stem) is not None and any(rows.glob("part-*.parquet")):
            assert len(read_records(sc.parent, sc.stem)) > 0
            for part in rows.glob("part-*.parquet"):
                ident = json.loads(pq.read_schema(part).metadata[PART_KEY])
                assert ident["table"] == sc.stem
                assert ident["config"] == json.loads(sc.read_text())["config"]


def test_a_part_of_another_table_of_the_run_is_refused(tmp_path):
    out = _copy(tmp_path, "cohort-semantics", "semantics", "semantics_stateremat_jax")
    moved = sorted((out / "semantics").glob("part-*.parquet"))[0]
    dest = out / "semantics_stateremat_jax" / ("part-zz-" + moved.name)
    shutil.copy(moved, dest)
    for read in (lambda: read_records(out, "semantics_stateremat_jax"),
                 lambda: RecordStore(out, "semantics_stateremat_jax",
                                     key=table_spec("semantics").key,
                                     meta=json.loads((out / "semantics_stateremat_jax.json")
                                                     .read_text())["config"]).done_keys()):
        with pytest.raises(RecordsError) as err:  # report and resume alike
            read()
        assert str(dest) in str(err.value)
        assert "is a part of table 'semantics', not of 'semantics_stateremat_jax'" in str(err.value)


@pytest.mark.parametrize("run,table,field,value,shown", [
    ("verify-finite", "finite", "programs", 5, "programs: 5 -> 1024"),
    ("verify-finite", "finite", "seed", 3, "seed: 3 -> 0"),
    ("bench-fair", "bench", "preset", "cpu-faithful", "preset: 'cpu-faithful' -> 'cpu'"),
    ("cohort-pressure32", "cohort_timing", "experiment", "fair44",
     "experiment: 'fair44' -> 'pressure32'"),
])
def test_a_part_of_another_run_of_the_table_is_refused(tmp_path, run, table, field, value, shown):
    out = _copy(tmp_path, run, table)
    part = sorted((out / table).glob("part-*.parquet"))[0]
    tbl = pq.read_table(part)
    ident = json.loads(tbl.schema.metadata[PART_KEY])
    ident["config"][field] = value  # the same rows, as another run's part
    pq.write_table(tbl.replace_schema_metadata({**tbl.schema.metadata,
                                                PART_KEY: json.dumps(ident).encode()}), part)
    with pytest.raises(RecordsError) as err:
        read_records(out, table)
    assert str(part) in str(err.value) and "another run" in str(err.value)
    assert shown in str(err.value)


def test_a_part_that_names_no_run_is_refused_until_stamped(tmp_path):
    out = _copy(tmp_path, "bench-fair", "bench")
    part = next((out / "bench").glob("part-*.parquet"))
    tbl = pq.read_table(part)
    before = tbl.to_pandas()
    meta = dict(tbl.schema.metadata)
    del meta[PART_KEY]
    pq.write_table(tbl.replace_schema_metadata(meta), part)
    with pytest.raises(RecordsError, match="does not say which table and run") as err:
        read_records(out, "bench")
    assert str(part) in str(err.value) and "tools/stamp_parts.py" in str(err.value)
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "stamp_parts.py"), str(out)],
                         capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src")})
    assert res.returncode == 0 and "stamped 1 part(s)" in res.stdout, res.stderr
    assert read_records(out, "bench").equals(before)  # the tip works; rows unchanged


def _is(column, value):
    return lambda df: df[column] == value


@pytest.mark.parametrize("run,table,select,column,value,words", [
    ("verify-finite", "finite", _is("check", "gradient"), "outcome", "Q", "one of ['D', 'M'"),
    ("verify-finite", "finite", _is("check", "gradient"), "max_error", float("nan"),
     "null or NaN only where check is one of"),
    ("verify-finite", "finite", _is("check", "gradient"), "max_error", -1.0, ">= 0"),
    ("verify-finite", "finite", _is("check", "gradient"), "program", 1024,
     "in [0, the run config's programs)"),
    ("verify-finite", "finite", _is("check", "gradient"), "seed", 1, "the run config's seed"),
    ("verify-engines", "engines", _is("check", "recovery"), "engine", "psychic", "one of ['', "),
    ("verify-alias", "alias", _is("check", "recovery"), "seed", 4242,
     "one of the run config's seeds"),
    ("bench-fair", "bench", _is("step", 3), "peak_bytes", -5, ">= 0"),
    ("bench-fair", "bench", _is("step", 3), "step_time_s", -0.25, ">= 0"),
    ("bench-fair", "bench", _is("step", 3), "step_time_s", float("inf"), "a finite number"),
    ("bench-fair", "bench", _is("step", 3), "budget_bytes", 47290070,
     "the run config's budget_bytes"),
    ("bench-fair", "bench", _is("step", 3), "preset", "cpu-faithful", "the run config's preset"),
    ("cohort-pressure32", "cohort_timing", _is("step", 3), "budget_bytes", 33554433,
     "its cell's budget_bytes in the run config's cells"),
    ("cohort-pressure32", "cohort_timing", _is("step", 3), "method", "deferred",
     "one of its cell's methods"),
    ("cohort-pressure32", "cohort_processes", _is("process", 0), "status", "fine",
     "one of ['failed', 'interrupted', 'ok', 'timeout']"),
    ("cohort-semantics", "semantics", _is("outcome", "M"), "outcome", "Q", "one of ['D', 'M'"),
    ("cohort-semantics", "semantics", _is("outcome", "M"), "family", "other_family",
     "one of the run config's families"),
    ("app-moco", "moco", _is("outcome", "ok"), "test_accuracy", 1.5, "in [0, 1]"),
])
def test_a_row_value_no_run_writes_is_refused_on_every_read(tmp_path, run, table, select, column,
                                                           value, words):
    out = _copy(tmp_path, run, table)
    part = next(p for p in sorted((out / table).glob("part-*.parquet"))
                if select(pq.read_table(p).to_pandas()).any())
    _edit(part, select, column, value)
    with pytest.raises(RecordsError) as err:
        read_records(out, table)
    msg = str(err.value)
    assert str(part) in msg and f"gives {column!r} = " in msg and words in msg, msg
    assert "row {" in msg  # the row's key is named
    if table in ("finite", "bench"):  # a resume reads the same way, before any work
        cfg = json.loads((out / f"{table}.json").read_text())["config"]
        with pytest.raises(RecordsError, match=f"gives {column!r}"):
            RecordStore(out, table, key=table_spec(table).key, meta=cfg).done_keys()


@pytest.mark.parametrize("run,table,path,value,where", [
    ("verify-finite", "finite", ["programs"], "20", "config.programs as '20' (str)"),
    ("verify-finite", "finite", ["programs"], 10**12, "config.programs as 1000000000000"),
    ("verify-finite", "finite", ["programs"], True, "config.programs as True (bool)"),
    ("verify-finite", "finite", ["seed"], -1, "config.seed as -1"),
    ("verify-alias", "alias", ["seeds"], ["0"], "config.seeds as ['0']"),
    ("bench-fair", "bench", ["steps"], 10**9, "config.steps as 1000000000"),
    ("cohort-pressure32", "cohort_timing", ["cells", 0, "budget_bytes"], "32MiB",
     "config.cells[0].budget_bytes as '32MiB'"),
    ("cohort-semantics", "semantics", ["seeds"], list(range(20_000)), "config.seeds as [0, 1,"),
])
def test_a_sidecar_config_field_of_another_kind_or_range_is_refused(tmp_path, run, table, path,
                                                                    value, where):
    out = _copy(tmp_path, run, table)
    sidecar = out / f"{table}.json"
    doc = json.loads(sidecar.read_text())
    node = doc["config"]
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    sidecar.write_text(json.dumps(doc))
    with pytest.raises(RecordsError) as err:
        read_records(out, table)
    assert str(sidecar) in str(err.value) and where in str(err.value), str(err.value)
    res = run_cli("report", out)  # refused before any work is sized from it
    assert res.exit_code == 2, res.output
    assert where.split(" as ")[0] in res.output


def test_report_refuses_a_copied_in_part_with_exit_2(tmp_path):
    out = _copy(tmp_path, "verify-finite", "finite")
    part = sorted((out / "finite").glob("part-*.parquet"))[0]
    _edit(part, _is("check", "gradient"), "outcome", "Q")
    res = run_cli("report", out)
    assert res.exit_code == 2, res.output
    assert "'outcome'" in res.output and "'Q'" in res.output
