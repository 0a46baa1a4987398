"""Which units a finished run holds (issue 27, item 5): a cohort expects every process of its
largest launch, and a timing unit is complete only with all its measured steps. Tiny folders
written by the records store itself (no command runs)."""
from __future__ import annotations

import pandas as pd
import pytest

from stateremat.paper.records import RecordStore, read_records
from stateremat.paper.report._complete import check_complete
from stateremat.paper.report._registry import steps_done

TIMING_KEY = ["process", "cell", "method", "step"]
STATUS_KEY = ["process", "attempt"]
CONFIG = {"cells": [{"cell": "c", "steps": 3, "methods": ["a", "b"]}]}


def _timing(process: int, method: str, steps) -> list[dict]:
    return [{"process": process, "cell": "c", "method": method, "step": s, "attempt": 0,
             "step_time_s": 0.1, "peak_bytes": 10} for s in steps]


def _status(process: int, attempt: int, n: int) -> dict:
    return {"process": process, "attempt": attempt, "status": "ok", "exit_code": 0, "stderr_tail": "",
            "wall_s": 1.0, "hostname": "h", "n_rows": 6, "executor": "local", "requested_processes": n}


def _cohort(out, launches: list[int], timing: list[dict]):
    status = RecordStore(out, "cohort_processes", key=STATUS_KEY, meta=CONFIG)
    for attempt, n in enumerate(launches):  # one launch after another, each asking for n processes
        status.append([_status(p, attempt, n) for p in range(n)])
    # a process's rows are of its first ok attempt (rows of an attempt no status row records are
    # refused: not the run's own)
    first = {p: a for a, n in reversed(list(enumerate(launches))) for p in range(n)}
    timing = [{**r, "attempt": first[r["process"]]} for r in timing]
    RecordStore(out, "cohort_timing", key=TIMING_KEY, meta=CONFIG).append(timing)
    return check_complete(out)["cohort_timing"]


@pytest.mark.parametrize("launches", [[3, 2], [2, 3], [1, 3, 2]])
def test_a_cohort_expects_every_process_of_its_largest_launch(tmp_path, launches):
    """Launches asking for different N (a retry with a smaller N, an extension with a larger one):
    the run is complete only with processes 0..max(N)-1, whatever the order."""
    rows = [r for p in range(2) for m in ("a", "b") for r in _timing(p, m, range(3))]
    st = _cohort(tmp_path, launches, rows)
    assert st.expected == 3 * 2
    assert st.missing == [(2, "c", "a"), (2, "c", "b")]
    assert not st.complete


def test_a_cohort_unit_with_only_part_of_its_steps_is_incomplete(tmp_path):
    rows = [r for p in range(2) for m in ("a", "b") for r in _timing(p, m, range(3))
            if not (p == 1 and m == "b" and r["step"] == 2)]  # process 1's b lacks its last step
    st = _cohort(tmp_path, [2], rows)
    assert st.missing == [(1, "c", "b")]
    assert not st.complete


@pytest.mark.parametrize("steps,complete", [
    ([0, 1, 2], True), ([2, 0, 1], True), ([0, 1, 2, 2], True), ([-1], True),  # -1: an infeasible row
    ([0, 1], False), ([1, 2], False), ([0, 2], False), ([0], False), ([2], False), ([], False)])
def test_steps_done_needs_every_measured_step(steps, complete):
    assert steps_done(3)(pd.DataFrame({"step": pd.Series(steps, dtype="int64")})) is complete


@pytest.mark.parametrize("allow", [False, True], ids=["strict", "allow-incomplete"])
def test_rows_of_a_unit_no_launch_asked_for_are_refused(tmp_path, allow):
    """A moco part of seed 9999 in a run launched for seeds 2701 and 2702: report exited 1 (or 0
    with --allow-incomplete, counting seed 9999 in), and a resume kept the row for good; now it is
    refused naming the part (exit 2), and the resume's check refuses it too."""
    import json
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from _cli import run_cli
    from _runs import CPU, copy_run
    from stateremat.paper.records import RecordsError
    from stateremat.paper.moco import refuse_foreign_rows

    out = copy_run(tmp_path, "app-moco", "moco")
    for extra in ("scores", "cards"):  # the score files the rows' hashes name
        shutil.copytree(CPU / "app-moco" / extra, out / extra)
    doc = json.loads((out / "moco.json").read_text())
    rows = read_records(out, "moco")
    doc["launches"] = [{"seeds": sorted({int(s) for s in rows["seed"]}),
                        "methods": list(dict.fromkeys(rows["method"]))}]
    (out / "moco.json").write_text(json.dumps(doc))
    assert run_cli("report", out, "--out", tmp_path / "ok").exit_code == 0  # the run as it was
    refuse_foreign_rows(out)
    part = sorted((out / "moco").glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    t = t.set_column(t.column_names.index("seed"), "seed", pa.array([9999] * t.num_rows, pa.int64()))
    pq.write_table(t, part)
    res = run_cli("report", out, "--out", tmp_path / "rep", *(["--allow-incomplete"] if allow else []))
    assert res.exit_code == 2, res.output
    assert f"{part.name} holds rows of (seed, method) unit 9999, eager" in res.output
    assert not (tmp_path / "rep" / "moco_table9.md").exists()
    with pytest.raises(RecordsError, match=f"{part.name} holds rows of .* unit 9999, eager"):
        refuse_foreign_rows(out)
