"""``stateremat verify finite``: records, resume, summary recomputed from rows."""
import json

import pytest

from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.paper.records import read_records
from stateremat.paper.verify import summarise_finite


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
    assert res.exit_code == 2 and "written by a run with another config (programs: 2 -> 3)" in res.output


@pytest.mark.parametrize("argv, expected", [
    (["finite", "--seed", "-1"], "--seed must be >= 0 and <= 4,294,967,295, got -1"),
    (["engines", "--seed", "-1"], "--seed must be >= 0 and <= 4,294,967,295, got -1"),
    (["finite", "--seed", "4294967296"], "--seed must be >= 0 and <= 4,294,967,295, got 4294967296"),
    (["alias", "--seeds", "-3:2"], "seeds must be non-negative integers"),
    (["alias", "--seeds", "-2"], "got '-2'"),
    (["alias", "--seeds", "0"], "got 0"),
    (["alias", "--seeds", "abc"], "expected a seed count"),
    # 20-digit ranges are refused from their bounds, before a list of seeds is built
    (["alias", "--seeds", "0:100000000000000000000"], "seeds must be at most 4294967295"),
    (["alias", "--seeds", "100000000000000000000"], "seeds must be at most 4294967295"),
    (["alias", "--seeds", "0:10001"], "10,001 seeds, more than the 10,000 allowed"),
    (["finite", "--programs", "99999999999999999999"], "--programs must be >= 1 and <= 100,000"),
    (["engines", "--programs", "99999999999999999999"], "--programs must be >= 1 and <= 100,000"),
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


def _tamper(out, table, where, column, value):
    """Rewrite the stored part holding the rows selected by ``where(df)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in sorted((out / table).glob("part-*.parquet")):
        tbl = pq.read_table(part)
        df = tbl.to_pandas()
        sel = where(df)
        if sel.any():
            df.loc[sel, column] = value  # the part keeps its schema (else it is refused)
            pq.write_table(pa.Table.from_pandas(df, schema=tbl.schema, preserve_index=False),
                           part)
            return
    raise AssertionError("no row selected")


def test_verify_exits_1_listing_failed_targets_after_writing_the_summary(tmp_path):
    out, js = tmp_path / "run", tmp_path / "s.json"
    argv = ["verify", "finite", "--programs", "4", "--out", str(out), "--json", str(js)]
    assert CliRunner().invoke(app, argv).exit_code == 0
    _tamper(out, "finite", lambda df: (df["check"] == "gradient") & (df["program"] == 1), "max_error", 0.5)
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 1
    assert "derivative_suite.max_grad_error = 0.5, expected <= 1e-14" in res.output
    assert json.loads(js.read_text())["derivative_suite"]["max_grad_error"] == 0.5  # still written
    wrong_rng_2 = lambda df: (df["check"] == "wrong_rng") & (df["program"] == 2)  # noqa: E731
    _tamper(out, "finite", wrong_rng_2, "detected", False)  # a missed control: its outcome says so too
    _tamper(out, "finite", wrong_rng_2, "outcome", "M")  # (detected and outcome must agree: exit 2)
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 1 and "byte_suite.wrong_rng_detected = 3, expected 4" in res.output


def test_targets_of_engines_and_alias_summaries_fail_on_a_bad_value():
    from stateremat.paper.verify._targets import alias_failures, engines_failures

    eng = {"programs": 2, "engines": ["a", "b"], "recoveries_checked": 4, "recoveries_matched": 4,
           "max_grad_error": 1e-16, "complex_step": {"programs": 1, "matched": 1, "max_error": 0.0}}
    assert engines_failures(eng, 2, ["a", "b"]) == []
    assert engines_failures({**eng, "recoveries_matched": 3}, 2, ["a", "b"]) == [
        "recoveries_matched = 3, expected 4"]
    assert engines_failures({**eng, "max_grad_error": float("nan")}, 2, ["a", "b"])  # NaN fails
    al = {"inputs": 6, "supported_recoveries": 30, "matched": 30, "unsupported": 6,
          "integer_writes_not_refused": 0, "stored_operations_consistent": 6, "max_grad_error": 0.0}
    assert alias_failures(al, 1, 5, 6) == []
    assert alias_failures({**al, "matched": 29}, 1, 5, 6) == ["matched = 29, expected 30"]


def test_summary_counts_distinct_units_keeping_the_last_duplicate(tmp_path):
    import pandas as pd

    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["verify", "finite", "--programs", "3", "--out", str(out)]).exit_code == 0
    rows = read_records(out, "finite")
    once = summarise_finite(rows)
    dup = rows.copy()
    dup.loc[(dup["check"] == "region_undo") & (dup["program"] == 0), "outcome"] = "D"
    # a second writer's copy of every row (what two unlocked concurrent runs would leave)
    # is refused on read since issue 27 (tests/test_records_validation.py); the summary
    # itself still keeps the last copy of a key
    twice = pd.concat([rows, dup], ignore_index=True)
    assert len(twice) == 2 * len(rows)
    s = summarise_finite(twice)
    assert s["byte_suite"]["programs"] == s["byte_suite"]["snapshot_replay_match"] == 3
    assert s["derivative_suite"] == once["derivative_suite"]
    assert s["byte_suite"]["region_undo_match"] == 2  # the last copy of the key wins


def test_each_row_names_its_program_seed_and_reproduces_alone(tmp_path):
    import numpy as np

    from stateremat._shared.io import source_hash
    from stateremat.paper.verify import byte_program, derivative_program
    from stateremat.paper.verify._gen import SUITE_CODES

    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["verify", "finite", "--programs", "3", "--seed", "5",
                                    "--out", str(out)]).exit_code == 0
    rows = read_records(out, "finite")
    make = {"derivative": derivative_program, "byte": byte_program}
    for r in rows.drop_duplicates(["suite", "program"]).itertuples():
        entropy = json.loads(r.program_seed)
        assert entropy == [5, SUITE_CODES[r.suite], r.program]
        p = make[r.suite](entropy[0], entropy[2])
        assert source_hash(p.spec()) == r.source_hash
        np.random.default_rng(entropy)  # a valid generator seed on its own
