"""`stateremat report` never presents incomplete data as complete (issue 16, kind 6).

It checks every table against its run's config (units per process, seed and method), names
what is missing, exits 1 unless ``--allow-incomplete``, names outputs that are stale (never
deleting them), refuses rows whose sidecar is gone (and a rerun does not write a fresh one as if
the run had just started), and reports ``verify`` folders too.
"""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.paper.records import RecordsError, read_records

from test_process_cohort import _run, fake  # noqa: F401  (fake is a fixture)

COHORT_OUTPUTS = ("summary.json", "cohort.md", "figure1.png", "figure1.svg", "figure3.png",
                  "figure3.svg")


def _report(out, *extra):
    return CliRunner().invoke(app, ["report", str(out), *extra])


def test_a_lost_part_is_named_and_not_reported_as_complete(tmp_path, fake):  # noqa: F811
    out = tmp_path / "run"
    _run(out, fake, 3, jobs=1)
    assert _report(out).exit_code == 0
    assert all((out / f).exists() for f in COHORT_OUTPUTS)
    timing = read_records(out, "cohort_timing")
    assert len(timing) == 3 * 4 * 2
    # lose the part of process 1 (one part per process)
    [part] = [p for p in (out / "cohort_timing").glob("part-*.parquet")
              if set(pq.read_table(p).column("process").to_pylist()) == {1}]
    before = {f: (out / f).read_bytes() for f in COHORT_OUTPUTS}
    part.unlink()
    res = _report(out)
    assert res.exit_code == 1, res.output
    assert ("cohort_timing: 4 of 12 (process, cell, method) units have no complete rows "
            "(16 rows present): 1, large_sparse, eager; 1, large_sparse, eager_whole") in res.output
    # never deleted (only a successful new output replaces one): kept as they were, named stale
    assert "earlier outputs kept but stale: summary.json, cohort.md, figure1.png" in res.output
    assert {f: (out / f).read_bytes() for f in COHORT_OUTPUTS} == before
    assert (out / "processes.md").exists()  # the attempt log is complete as it is
    res = _report(out, "--allow-incomplete")
    assert res.exit_code == 0 and "warning: rendering incomplete rows: cohort_timing" in res.output
    assert json.loads((out / "summary.json").read_text())["n_processes"] == 2
    # resuming re-runs process 1 (its rows are gone, so it is not done) and completes the run
    assert _run(out, fake, 3)["ran"] == 1
    assert _report(out).exit_code == 0


def test_a_lost_sidecar_is_refused_by_report_and_by_a_rerun(tmp_path, fake):  # noqa: F811
    out = tmp_path / "run"
    _run(out, fake, 2)
    assert _report(out).exit_code == 0
    (out / "cohort_timing.json").unlink()
    res = _report(out)
    assert res.exit_code == 2 and "incomplete: cohort_timing: rows in" in res.output
    # rows it cannot describe say nothing about the earlier outputs: they stay
    assert "but no sidecar" in res.output and "stale" not in res.output
    assert (out / "cohort.md").exists()
    assert _report(out, "--allow-incomplete").exit_code == 2  # nothing says what the rows are
    with pytest.raises(RecordsError, match="holds rows but its sidecar .* is missing"):
        _run(out, fake, 2)
    assert not (out / "cohort_timing.json").exists()  # no fresh provenance written as if new


def test_report_accepts_verify_folders_and_checks_them(tmp_path):
    out = tmp_path / "finite"
    res = CliRunner().invoke(app, ["verify", "finite", "--programs", "40", "--out", str(out),
                                   "--json", str(tmp_path / "printed.json")])
    assert res.exit_code == 0, res.output
    res = _report(out)
    assert res.exit_code == 0 and "finite: wrote" in res.output, res.output
    summary = json.loads((out / "finite_summary.json").read_text())
    assert summary == json.loads((tmp_path / "printed.json").read_text())
    assert "derivative_suite.programs | 40" in (out / "finite.md").read_text()
    parts = sorted((out / "finite").glob("part-*.parquet"))  # 64 units per part: 2 parts
    assert len(parts) == 2
    parts[-1].unlink()
    res = _report(out)
    assert res.exit_code == 1
    assert "finite: 16 of 80 (suite, seed, program) units have no complete rows" in res.output
    assert "byte, 0, 24; byte, 0, 25" in res.output
    assert "earlier outputs kept but stale: finite_summary.json, finite.md" in res.output
    assert "derivative_suite.programs | 40" in (out / "finite.md").read_text()  # kept
    for cmd, table in ((["engines", "--programs", "2"], "engines"), (["alias", "--seeds", "1"], "alias")):
        d = tmp_path / table
        assert CliRunner().invoke(app, ["verify", *cmd, "--out", str(d)]).exit_code == 0
        res = _report(d)
        assert res.exit_code == 0 and (d / f"{table}.md").exists(), res.output
        assert json.loads((d / f"{table}_summary.json").read_text())
