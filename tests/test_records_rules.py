"""Rules across rows and runs (issue 28): a step below the run's steps, the infeasible marker
alone for its (cell, method), values constant where a run writes one, a part of another run
refused by its run id, and the report's mark parsed without last-wins duplicate keys.

Each case copies one committed run's table from ``results/cpu`` into a temporary folder and
changes one thing, as ``tests/test_records_identity.py`` does.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _cli import run_cli
from stateremat.contract import RecordsError
from stateremat.paper.records import PART_KEY, read_records

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "results" / "cpu"


def _copy(tmp: Path, run: str, *tables: str) -> Path:
    out = tmp / run
    out.mkdir(parents=True)
    for t in tables:
        shutil.copytree(CPU / run / t, out / t)
        shutil.copy(CPU / run / f"{t}.json", out / f"{t}.json")
    return out


def _parts(out: Path, table: str) -> list[Path]:
    return sorted((out / table).glob("part-*.parquet"))


def _rewrite(part: Path, change) -> None:
    """Rewrite ``part`` with ``change(df)``'s rows, keeping its schema and notes."""
    tbl = pq.read_table(part)
    df = change(tbl.to_pandas())
    pq.write_table(pa.Table.from_pandas(df, schema=tbl.schema, preserve_index=False), part)


def _refused(out: Path, table: str, *words: str) -> str:
    with pytest.raises(RecordsError) as err:
        read_records(out, table)
    msg = str(err.value)
    for w in words:
        assert w in msg, msg
    return msg


# ------------------------------------------------------------ 7. the report's mark
def test_a_report_mark_with_a_duplicate_key_is_refused(tmp_path):
    out = _copy(tmp_path, "verify-finite", "finite")
    dest = tmp_path / "rep"
    assert run_cli("report", out, "--out", dest).exit_code == 0
    mark = dest / ".report.json"
    doc = json.loads(mark.read_text())
    # the first "run" is another folder's, the last this run's: last-wins would accept it
    text = mark.read_text().replace('"run":', f'"run": {json.dumps(str(tmp_path / "x"))}, "run":', 1)
    mark.write_text(text)
    assert json.loads(text)["run"] == doc["run"]
    res = run_cli("report", out, "--out", dest)
    assert res.exit_code == 2, res.output
    assert ".report.json" in res.output and "twice" in res.output


# ------------------------------------------------------------ 1. a step the run took
def _bench(tmp: Path, run: str = "bench-fair") -> tuple[Path, Path]:
    out = _copy(tmp, run, "bench")
    return out, _parts(out, "bench")[0]


def test_a_step_at_or_past_the_runs_steps_is_refused_by_report(tmp_path):
    out, part = _bench(tmp_path)
    steps = json.loads((out / "bench.json").read_text())["config"]["steps"]

    def extra(df):
        e = df[df.method == "eager"].iloc[[0]]
        more = pd.concat([e.assign(step=k, step_time_s=1e-4) for k in range(steps, steps + 5)])
        return pd.concat([df, more])
    _rewrite(part, extra)
    _refused(out, "bench", "'step'", f"= {steps}", "'method': 'eager'", str(part))
    res = run_cli("report", out, "--out", tmp_path / "rep")
    assert res.exit_code == 2, res.output
    assert "'step'" in res.output and not (tmp_path / "rep" / "tables.md").exists()


def test_a_cohort_step_past_its_cells_steps_is_refused(tmp_path):
    out = _copy(tmp_path, "cohort-fair44", "cohort_timing", "cohort_processes")
    part = _parts(out, "cohort_timing")[0]
    _rewrite(part, lambda df: df.assign(step=np.where(df.step == df.step.max(), 50, df.step)))
    _refused(out, "cohort_timing", "'step' = 50", "its cell's steps")


# ------------------------------------------------------------ 2. the infeasible marker alone
def test_a_minus_one_row_beside_measured_rows_is_refused_and_never_complete(tmp_path):
    out, part = _bench(tmp_path)

    def minus1(df):
        e = df[(df.method == "eager") & (df.step == 0)].assign(step=-1, step_time_s=np.nan,
                                                               peak_bytes=None)
        return pd.concat([df[~((df.method == "eager") & (df.step >= 2))], e])
    _rewrite(part, minus1)
    _refused(out, "bench", "'step' = -1", "only as the one row of its (cell, method)")
    res = run_cli("report", out, "--out", tmp_path / "rep")
    assert res.exit_code == 2, res.output


def test_a_lone_minus_one_row_that_says_feasible_is_refused(tmp_path):
    out = _copy(tmp_path, "bench-pressure", "bench")
    part = next(p for p in _parts(out, "bench") if (pq.read_table(p)["step"].to_numpy() == -1).any())
    _rewrite(part, lambda df: df.assign(feasible=np.where(df.step == -1, True, df.feasible)))
    _refused(out, "bench", "with feasible false")


def test_steps_done_needs_the_minus_one_row_alone():
    from stateremat.paper.report._registry import steps_done
    done = steps_done(3)
    assert done(pd.DataFrame({"step": [-1], "feasible": [False]}))
    assert done(pd.DataFrame({"step": [0, 1, 2], "feasible": [True] * 3}))
    assert not done(pd.DataFrame({"step": [0, 1, -1], "feasible": [True] * 3}))
    assert not done(pd.DataFrame({"step": [-1], "feasible": [True]}))


# ------------------------------------------------------------ 6. one value where a run writes one
def _first(df, column, value, select=None):
    df = df.copy()
    i = df.index[select(df)][0] if select is not None else df.index[0]
    df[column] = df[column].astype(object)
    df.loc[i, column] = value
    return df


@pytest.mark.parametrize("column,value,select,words", [
    ("policy", None, lambda df: (df.method == "joint") & (df.step == 0),
     "every row of its (cell, method)"),
    ("feasible", False, lambda df: (df.method == "joint") & (df.step == 3),
     "true in a row that measured a step"),
    ("predicted_peak_bytes", 1, lambda df: df.method == "whole", "every row of its (cell, method)"),
    ("width", 99999, None, "every row of its (cell)"),
    ("workload", "other", None, "every row of its (cell)"),
    ("dtype", "float64", None, "every row of its (cell)"),
    ("profile_hash", "0" * 16, None, "every row of its (cell)"),
    ("memory_method", "cuda_max_memory_allocated", None, "only on a cuda device"),
    ("memory_method", "other_tracker", None, "every row of its (cell)"),
])
def test_a_value_a_run_writes_once_is_refused_when_rows_differ(tmp_path, column, value, select,
                                                                words):
    out, part = _bench(tmp_path)
    tbl = pq.read_table(part)
    df = _first(tbl.to_pandas(), column, value, select)
    pq.write_table(pa.Table.from_pandas(df, schema=tbl.schema, preserve_index=False), part)
    msg = _refused(out, "bench", f"{column!r}", words, str(part), "(table 'bench')", "'cell':")
    assert "'step':" in msg
    res = run_cli("report", out, "--out", tmp_path / "rep")
    assert res.exit_code == 2, res.output


def test_a_policy_of_another_length_than_the_segments_is_refused(tmp_path):
    out, part = _bench(tmp_path)
    _rewrite(part, lambda df: df.assign(
        policy=np.where(df.method == "whole", json.dumps(["whole"] * 3), df.policy)))
    _refused(out, "bench", "'policy'", "one choice per segment")


def test_cohort_rows_keep_one_value_per_process_cell_and_method(tmp_path):
    out = _copy(tmp_path, "cohort-fair44", "cohort_timing", "cohort_processes")
    part = _parts(out, "cohort_timing")[0]
    _rewrite(part, lambda df: _first(df, "policy", json.dumps(["eager"] * 16),
                                     lambda d: d.method == "whole"))
    _refused(out, "cohort_timing", "'policy'", "its (process, cell, method)")
    shutil.rmtree(out)
    out = _copy(tmp_path, "cohort-fair44", "cohort_timing", "cohort_processes")
    _rewrite(_parts(out, "cohort_timing")[0], lambda df: _first(df, "seed", 7))
    _refused(out, "cohort_timing", "'seed' = 7", "the run config's seed")


# ------------------------------------------------------------ 4b. verify's detected and outcome
@pytest.mark.parametrize("check,detected", [("wrong_rng", False), ("final_storage_control", None),
                                            ("gradient", True)])
def test_a_detected_that_disagrees_with_the_outcome_is_refused(tmp_path, check, detected):
    out = _copy(tmp_path, "verify-finite", "finite")
    part = next(p for p in _parts(out, "finite")
                if (pq.read_table(p)["check"].to_numpy() == check).any())
    _rewrite(part, lambda df: _first(df, "detected", detected, lambda d: d.check == check))
    _refused(out, "finite", "'detected'", "where the outcome is D", str(part))
    res = run_cli("report", out, "--out", tmp_path / "rep")
    assert res.exit_code == 2, res.output
