"""A cohort's status table after a stop (att27b).

- With ``cohort_processes`` emptied or deleted (sidecar and all), ``report`` counted every
  ``cohort_timing`` row in: a copied-in process 5 became a third process of N = 2 (exit 0). Only
  one process's first attempt can lack a status row (a stop between the run's first two appends).
- That genuine cut (``kill -9`` after process 0's rows, before its status row) left a
  ``--processes 1`` run refused by ``report`` for good ("rerun to finish it"), while the rerun had
  nothing left to do: the resume now writes the lost ``ok`` status row.
- A status row with a missing ``exit_code`` or ``n_rows`` (the schema allows both) crashed
  ``report``'s processes table: ``ValueError: cannot convert float NaN to integer``.
"""
import pandas as pd
import pytest

from stateremat.paper.records import RecordsError
from stateremat.paper.cohort._tables import STATUS_TABLE, check_timing_attempts
from stateremat.paper.records import RecordStore, read_records

CONFIG = {"experiment": "fair44", "preset": "tiny", "device": "cpu", "seed": 0, "threads": 1,
          "cells": [{"cell": "large_sparse", "methods": ["eager"], "budget_bytes": 1,
                     "warmups": 0, "steps": 1}]}
NO_STATUS = pd.DataFrame()


def _timing(*pairs):
    return pd.DataFrame([{"process": p, "attempt": a, "cell": "large_sparse", "method": "eager",
                          "step": 0, "process_wall_s": 2.5, "hostname": "h"} for p, a in pairs])


def test_with_no_status_rows_only_one_first_attempt_is_the_runs(tmp_path):
    check_timing_attempts(tmp_path, _timing((0, 1)), NO_STATUS)  # the genuine cut
    check_timing_attempts(tmp_path, _timing((3, 1)), NO_STATUS, processes=4)
    for pairs in [((0, 1), (1, 1)), ((0, 1), (5, 1)), ((0, 2),)]:
        with pytest.raises(RecordsError, match="no status row of the run records"):
            check_timing_attempts(tmp_path, _timing(*pairs), NO_STATUS)
    with pytest.raises(RecordsError, match="process 3, attempt 1"):
        check_timing_attempts(tmp_path, _timing((3, 1)), NO_STATUS, processes=2)


def test_a_resume_records_the_status_row_a_stop_cut_off(tmp_path):
    from stateremat.paper.cohort._process_cohort import _record_cut_attempts

    status = RecordStore(tmp_path, STATUS_TABLE, key=["process", "attempt"], meta=CONFIG)
    status.append([{"process": 1, "attempt": 1, "status": "failed", "exit_code": 1,
                    "stderr_tail": "x", "wall_s": 1.0, "hostname": "h", "n_rows": 0,
                    "executor": "local", "requested_processes": 3},
                   {"process": 2, "attempt": 1, "status": "ok", "exit_code": 0,
                    "stderr_tail": "", "wall_s": 1.0, "hostname": "h", "n_rows": 1,
                    "executor": "local", "requested_processes": 3}])
    timing = pd.concat([_timing((0, 1)), _timing((1, 2)), _timing((2, 1))])
    _record_cut_attempts(status, timing, status.read(), 3)
    st = read_records(tmp_path, STATUS_TABLE).sort_values(["process", "attempt"])
    got = [(int(r.process), int(r.attempt), r.status, int(r.exit_code), int(r.n_rows), r.executor)
           for r in st.itertuples()]
    assert got == [(0, 1, "ok", 0, 1, "recovered"), (1, 1, "failed", 1, 0, "local"),
                   (1, 2, "ok", 0, 1, "recovered"), (2, 1, "ok", 0, 1, "local")]
    check_timing_attempts(tmp_path, timing, st)  # all the run's own now
    _record_cut_attempts(status, timing, st, 3)  # a second resume adds nothing
    assert len(read_records(tmp_path, STATUS_TABLE)) == 4


def test_processes_table_renders_a_missing_exit_code(tmp_path):
    from stateremat.paper.report._cohort import report_processes

    RecordStore(tmp_path, STATUS_TABLE, key=["process", "attempt"], meta=CONFIG).append(
        [{"process": 0, "attempt": 1, "status": "failed", "exit_code": None,
          "stderr_tail": "lost", "wall_s": 1.0, "hostname": "h", "n_rows": None,
          "executor": "dask", "requested_processes": 1}])
    (out,) = report_processes(tmp_path)
    assert "| 0 | 1 | failed | – | h | 1.0 | – | lost |" in out.read_text()
