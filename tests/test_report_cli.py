"""`stateremat report DIR`: dispatch by records table, clear errors, public stats surface."""
from __future__ import annotations

from typer.testing import CliRunner

import stateremat.paper.stats as stats
from stateremat.cli import app
from stateremat.paper.records import RecordStore
from stateremat.paper.report import REPORTERS


def test_cohort_reporters_are_registered():
    assert {"cohort_timing", "cohort_processes"} <= set(REPORTERS)


def test_report_refuses_a_folder_whose_tables_have_no_reporter(tmp_path):
    RecordStore(tmp_path, "zz_unknown_table", key=["k"]).append([{"k": 1}])
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "no reporter for the tables ['zz_unknown_table']" in r.output


def test_report_refuses_a_missing_folder(tmp_path):
    r = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "is not a folder" in r.output


def test_cohort_reporter_needs_rows(tmp_path):
    # a cohort whose processes all failed so far: sidecar but no rows -> incomplete, exit 1
    RecordStore(tmp_path, "cohort_timing", key=["process"], meta={"experiment": "fair44"})
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 1 and "incomplete: cohort_timing: no rows yet" in r.output


def test_stats_public_names():
    public = sorted(n for n in dir(stats) if not n.startswith("_"))
    assert public == sorted([
        "Comparison", "FAMILY_ALPHA", "N_RESAMPLES", "RatioEstimate", "bonferroni_level",
        "bootstrap_ratio", "compare", "comparisons_from", "family_size", "geometric_mean",
        "method_table", "paired_ratios", "process_means"])
