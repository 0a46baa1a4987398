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
from _runs import copy_run
from stateremat.paper.records import PART_KEY, RecordsError, read_records

_copy = copy_run


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


# ------------------------------------------------------------ 4. a run id per run
def _store(out: Path, **meta):
    from stateremat.paper.records import RecordStore
    return RecordStore(out, "t", key=["k"], meta=meta or {"n": 1})


def _note(part: Path) -> dict:
    return json.loads(pq.read_schema(part).metadata[PART_KEY])


def test_each_run_gets_a_run_id_its_parts_carry(tmp_path):
    from stateremat.paper.records import RUN_ID
    a = _store(tmp_path / "a")
    a.append([{"k": 1, "v": 1.0}])
    rid = json.loads((tmp_path / "a" / "t.json").read_text())[RUN_ID]
    assert len(rid) == 32 and _note(_parts(tmp_path / "a", "t")[0])["run"] == rid
    _store(tmp_path / "a").append([{"k": 2, "v": 2.0}])  # a resume keeps it
    assert {_note(p)["run"] for p in _parts(tmp_path / "a", "t")} == {rid}
    assert json.loads((tmp_path / "a" / "t.json").read_text())[RUN_ID] == rid
    _store(tmp_path / "b").append([{"k": 3, "v": 3.0}])
    assert json.loads((tmp_path / "b" / "t.json").read_text())[RUN_ID] != rid


def test_a_part_of_another_run_with_the_same_config_is_refused_naming_it(tmp_path):
    _store(tmp_path / "a").append([{"k": 1, "v": 1.0}])
    _store(tmp_path / "b").append([{"k": 2, "v": 9.0}])
    moved = tmp_path / "a" / "t" / "part-99999999T999999-1-000000.parquet"
    shutil.copy(_parts(tmp_path / "b", "t")[0], moved)
    _refused(tmp_path / "a", "t", str(moved), "another run", "Tip: move it out")
    with pytest.raises(RecordsError, match="another run"):  # a resume refuses it too
        _store(tmp_path / "a").done_keys()
    moved.rename(tmp_path / "kept.parquet")  # the tip, followed
    assert list(read_records(tmp_path / "a", "t")["k"]) == [1]


def test_a_sidecar_without_its_run_id_refuses_the_runs_parts(tmp_path):
    _store(tmp_path / "a").append([{"k": 1, "v": 1.0}])
    sc = tmp_path / "a" / "t.json"
    doc = json.loads(sc.read_text())
    del doc["run_id"]
    sc.write_text(json.dumps(doc))
    _refused(tmp_path / "a", "t", "the sidecar names none")


def test_a_run_made_before_run_ids_still_reads_and_resumes_without_one(tmp_path):
    out = _copy(tmp_path, "verify-finite", "finite")
    assert "run_id" not in json.loads((out / "finite.json").read_text())
    before = read_records(out, "finite")
    part = _parts(out, "finite")[-1]
    rows = pq.read_table(part).to_pylist()
    part.unlink()
    from stateremat.paper.records import RecordStore
    cfg = json.loads((out / "finite.json").read_text())["config"]
    store = RecordStore(out, "finite", key=["suite", "seed", "program", "check"], meta=cfg)
    store.append(rows)  # a resume of the old run: its new part names no run
    assert "run" not in _note(_parts(out, "finite")[-1])
    assert len(read_records(out, "finite")) == len(before)
    assert "run_id" not in json.loads((out / "finite.json").read_text())


def test_a_rerun_refuses_an_injected_part_of_another_run_and_report_too(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert run_cli("verify", "finite", "--programs", "4", "--out", out).exit_code == 0
    manifest = json.loads((a / ".run.json").read_text())
    assert manifest["run_id"] == json.loads((a / "finite.json").read_text())["run_id"]
    moved = a / "finite" / "part-99999999T999999-1-000000.parquet"
    _rewrite(shutil.copy(_parts(b, "finite")[0], moved) and moved,
             lambda df: df.drop(df.index[df.program > 1]))
    for args in (("verify", "finite", "--programs", "4", "--out", a), ("report", a)):
        res = run_cli(*args)
        assert res.exit_code == 2, res.output
        assert moved.name in res.output and "another run" in res.output
    moved.rename(tmp_path / "kept.parquet")
    assert run_cli("report", a).exit_code == 0


def test_a_cells_budget_rule_or_profile_other_than_the_configs_is_refused(tmp_path):
    out, part = _bench(tmp_path)
    _rewrite(part, lambda df: df.assign(budget_rule="fixed"))
    _refused(out, "bench", "'budget_rule' = 'fixed'", "its cell's entry in the run config's "
             "budget_rule")
    out = _copy(tmp_path / "c", "cohort-fair44", "cohort_timing", "cohort_processes")
    _rewrite(_parts(out, "cohort_timing")[0], lambda df: df.assign(profile_hash="0" * 64))
    _refused(out, "cohort_timing", "'profile_hash'", "the run config's profile")


@pytest.mark.parametrize("column,value,words", [
    ("fits_budget", True, "peak_bytes is at most its budget_bytes"),
    ("semantic_max_error", 1e6, "where semantic_checks is 'pass'"),
    ("error", "boom", "a row that has a step time"),
    ("loadavg", "x", "/proc/loadavg"),
])
def test_a_value_that_contradicts_the_rows_other_columns_is_refused(tmp_path, column, value,
                                                                     words):
    out, part = _bench(tmp_path)  # every eager row edited alike: no row differs from another

    def edit(df):
        df[column] = df[column].astype(object)
        df.loc[df.method == "eager", column] = value
        return df
    if column == "fits_budget":  # eager's peak is over the budget: its rows say False
        eager = pq.read_table(part).to_pandas().query("method == 'eager'")
        assert (eager.peak_bytes > eager.budget_bytes).all()
    _rewrite(part, edit)
    _refused(out, "bench", f"{column!r}", words, "'method': 'eager'")


# ------------------------------------------------------------ the run's device
@pytest.mark.parametrize("run,table", [("bench-fair", "bench"), ("cohort-fair44", "cohort_timing")])
def test_a_row_measured_on_another_device_than_the_runs_is_refused(tmp_path, run, table):
    out = _copy(tmp_path, run, table)
    read_records(out, table)  # the committed run reads
    part = _parts(out, table)[0]
    _rewrite(part, lambda df: df.assign(device=["cuda:0"] + list(df.device[1:])))
    _refused(out, table, part.name, "device", "cuda:0", "the run config's device")


def test_an_indexed_device_belongs_to_a_run_configured_for_its_type():
    import pandas as pd

    from stateremat.paper.records import config_device

    rows = pd.DataFrame({"device": ["cuda:0", "cuda:1", "cuda", "cpu", "cudax:0", None]})
    assert config_device().bad(rows, "device", {"device": "cuda"}).tolist() == \
        [False, False, False, True, True, False]
    assert config_device().bad(rows, "device", {"device": "cuda:0"}).tolist() == \
        [False, True, True, True, True, False]
    assert not config_device().bad(rows, "device", {}).any()  # a config without it: no rule


def test_a_cohort_row_with_other_torch_threads_than_the_runs_is_refused(tmp_path):
    out = _copy(tmp_path, "cohort-fair44", "cohort_timing")
    threads = json.loads((out / "cohort_timing.json").read_text())["config"]["threads"]
    part = _parts(out, "cohort_timing")[0]
    _rewrite(part, lambda df: df.assign(torch_threads=[threads + 1] + list(df.torch_threads[1:])))
    _refused(out, "cohort_timing", part.name, "torch_threads", "the run config's threads")
