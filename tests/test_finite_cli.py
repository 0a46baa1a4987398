"""``stateremat verify finite``: records, resume, summary recomputed from rows."""
import json

import pytest

from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.contract import read_records
from stateremat.finite import summarise_finite


def test_verify_finite_writes_rows_and_a_summary_from_them(tmp_path):
    out, js = tmp_path / "run", tmp_path / "summary.json"
    res = CliRunner().invoke(app, ["verify", "finite", "--programs", "24", "--seed", "3",
                                   "--out", str(out), "--json", str(js)])
    assert res.exit_code == 0, res.output
    summary = json.loads(js.read_text())
    d, b, cs = summary["derivative_suite"], summary["byte_suite"], summary["complex_step"]
    assert d["programs"] == d["scalar_outputs_exact"] == d["final_storage_control_detected"] == 24
    assert d["max_grad_error"] <= 1e-14
    assert b["programs"] == b["snapshot_replay_match"] == b["region_undo_match"] == 24
    assert b["wrong_rng_detected"] == 24
    assert cs["programs"] == 3 and cs["max_error"] <= 1e-14 and cs["coordinates"] > 0
    rows = read_records(out, "finite")
    assert len(rows) == 24 * 3 + 3 + 24 * 3  # derivative (3 + complex step subset) and byte checks
    assert {"outcome", "max_error", "seed", "source_hash", "program", "check"} <= set(rows.columns)
    assert rows["source_hash"].str.len().eq(64).all() and (rows["seed"] == 3).all()
    assert summarise_finite(rows) == summary

    # resume: a rerun redoes nothing; a lost part is redone, nothing duplicated
    parts = sorted((out / "finite").glob("part-*.parquet"))
    res = CliRunner().invoke(app, ["verify", "finite", "--programs", "24", "--seed", "3", "--out", str(out)])
    assert res.exit_code == 0 and sorted((out / "finite").glob("part-*.parquet")) == parts
    parts[0].unlink()
    res = CliRunner().invoke(app, ["verify", "finite", "--programs", "24", "--seed", "3", "--out", str(out)])
    assert res.exit_code == 0
    again = read_records(out, "finite")
    assert len(again) == len(rows)
    assert not again.duplicated(["suite", "program", "check"]).any()


def test_summary_is_computed_from_the_rows_not_stored(tmp_path):
    out = tmp_path / "run"
    CliRunner().invoke(app, ["verify", "finite", "--programs", "4", "--out", str(out)])
    rows = read_records(out, "finite")
    rows.loc[(rows["check"] == "region_undo") & (rows["program"] == 0), "outcome"] = "D"
    assert summarise_finite(rows)["byte_suite"]["region_undo_match"] == 3


def test_bad_program_count_and_mismatched_resume_are_clear_errors(tmp_path):
    res = CliRunner().invoke(app, ["verify", "finite", "--programs", "0", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--programs must be >= 1" in res.output
    CliRunner().invoke(app, ["verify", "finite", "--programs", "2", "--out", str(tmp_path / "r")])
    res = CliRunner().invoke(app, ["verify", "finite", "--programs", "3", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "written by a run with config" in res.output


@pytest.mark.parametrize("argv, expected", [
    (["finite", "--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    (["engines", "--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    (["alias", "--seeds", "-3:2"], "seeds must be non-negative integers"),
    (["alias", "--seeds", "-2"], "got -2"),
    (["alias", "--seeds", "0"], "got 0"),
    (["alias", "--seeds", "abc"], "expected a seed count"),
])
def test_bad_seeds_are_refused_before_anything_is_created(tmp_path, argv, expected):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["verify", *argv, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert expected in res.output and "Tip:" in res.output
    assert "invalid literal" not in res.output and "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.parametrize("command", ["finite", "engines", "alias"])
def test_unwritable_json_target_is_refused_before_the_run(tmp_path, command):
    out = tmp_path / "run"
    afile = tmp_path / "afile"
    afile.write_text("x")
    size = ["--seeds", "1"] if command == "alias" else ["--programs", "1"]
    for target, expected in ((tmp_path, "is a folder"), (afile / "x.json", "is a file, not a folder"),
                             (afile / "deeper" / "x.json", "is a file, not a folder")):
        res = CliRunner().invoke(app, ["verify", command, *size, "--out", str(out), "--json", str(target)])
        assert res.exit_code == 2 and expected in res.output and "Tip:" in res.output, res.output
        assert not out.exists()
