"""Report review: a run folder stopped before its first rows, uneven MoCo seed coverage,
--seeds text, error prefixes and damaged parts — each through the real `stateremat` CLI."""
from __future__ import annotations

import json

import shutil
from pathlib import Path

import pytest

from _cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "cpu"

_run = run_cli


# --- 1. a table with a sidecar and no rows yet -----------------------------------------------
EMPTY = [("verify-finite", "finite"), ("verify-alias", "alias"), ("verify-engines", "engines"),
         ("app-moco", "moco"), ("cohort-semantics", "semantics"),
         ("cohort-semantics", "semantics_stateremat_jax"), ("bench-fair", "bench"),
         ("cohort-fair44", "cohort_timing"), ("cohort-fair44", "cohort_processes")]


@pytest.mark.parametrize("allow", [False, True], ids=["strict", "allow-incomplete"])
@pytest.mark.parametrize("folder,table", EMPTY, ids=[f"{f}:{t}" for f, t in EMPTY])
def test_report_on_a_table_without_rows_is_incomplete_not_a_crash(tmp_path, folder, table,
                                                                  allow):
    out = tmp_path / folder
    shutil.copytree(RESULTS / folder, out)
    for part in (out / table).glob("part-*.parquet"):   # stopped before its first unit
        part.unlink()
    res = _run("report", out, *(["--allow-incomplete"] if allow else []))
    assert res.exit_code == 1, res.output
    assert f"incomplete: {table}: " in res.output
    assert "0 rows present" in res.output
    assert f"not rendered: {table}" in res.output
    if "no rows yet" not in res.output:   # the config says which units: they are named
        assert "units have rows" in res.output and "missing: " in res.output
    assert "pass --allow-incomplete" not in res.output   # it would render nothing


def test_verify_alias_stopped_before_its_first_rows_reports_and_resumes(tmp_path):
    out = tmp_path / "alias"
    assert _run("verify", "alias", "--seeds", "2", "--out", out).exit_code == 0
    for part in (out / "alias").glob("part-*.parquet"):
        part.unlink()
    # a run stopped before its first part never said it wrote rows (an emptied folder of a run
    # that did is refused: tests/test_records_validation.py)
    sidecar = json.loads((out / "alias.json").read_text())
    del sidecar["has_rows"]
    (out / "alias.json").write_text(json.dumps(sidecar))
    res = _run("report", out)
    assert res.exit_code == 1, res.output
    assert ("incomplete: alias: 0 of 12 (seed, pattern, dim) units have rows (0 rows present"
            in res.output), res.output
    assert "missing: 0, prototype, 32;" in res.output
    assert _run("verify", "alias", "--seeds", "2", "--out", out).exit_code == 0  # resumes
    assert _run("report", out).exit_code == 0


def test_a_damaged_part_says_to_move_it_away_then_rerun(tmp_path):
    out = tmp_path / "alias"
    assert _run("verify", "alias", "--seeds", "1", "--out", out).exit_code == 0
    part = next((out / "alias").glob("part-*.parquet"))
    part.write_bytes(b"not parquet")
    res = _run("report", out)
    assert res.exit_code == 2, res.output
    assert ".. " not in res.output and "file.." not in res.output   # one period per sentence
    assert "move it out of the folder (or delete it), then rerun" in res.output
    assert "fix what is named above first (its tip says how; a rerun refuses" in res.output
    assert _run("verify", "alias", "--seeds", "1", "--out", out).exit_code == 2  # as said
    part.unlink()
    assert _run("verify", "alias", "--seeds", "1", "--out", out).exit_code == 0
    assert _run("report", out).exit_code == 0


# --- 2. MoCo: methods compared over the seeds they all share -----------------------------------
def test_moco_table_compares_methods_over_shared_seeds_and_names_the_rest(tmp_path):
    import json

    out = tmp_path / "moco"
    res = _run("app", "moco", "--preset", "tiny", "--seeds", "0:2", "--out", out)
    assert res.exit_code == 0, res.output
    assert _run("report", out).exit_code == 0
    even = (out / "moco_table9.md").read_text()
    assert "seeds [0, 1]\n" in even and "not in the comparison" not in even
    res = _run("app", "moco", "--preset", "tiny", "--seeds", "2:3", "--methods", "eager",
               "--out", out)
    assert res.exit_code == 0, res.output
    assert "note: eager: seed 2 not in the comparison: other methods lack it" in res.output
    assert "identical_within_seed=True" in res.output
    res = _run("report", out)
    assert res.exit_code == 0, res.output
    md = (out / "moco_table9.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1, 2] and summary["seeds_compared"] == [0, 1]
    assert summary["not_compared"] == {"eager": [2]}
    assert summary["identical_within_seed"] is True   # over the shared seeds, not None
    assert md.startswith("# Dense-queue application — fashion-mnist, seeds [0, 1] (the seeds "
                         "every method ran; 0, 1, 2 have rows)")
    assert "- eager: seed 2 not in the comparison: other methods lack it" in md
    assert "| Eager | 2/2 |" in md   # eager's numbers are over the shared seeds only
    assert "byte-identical within every seed compared: **True**" in md
    # the means are over seeds 0 and 1 for every method: eager's equal the even run's
    row = lambda text, m: next(l for l in text.splitlines() if l.startswith(f"| {m} |"))
    assert row(md, "Eager") == row(even, "Eager")
    # a plan that differs by seed is shown per seed, never as one seed's plan
    plans = {}
    for e in summary["methods"]:
        if e["seed"] in (0, 1):
            plans.setdefault(e["method"], set()).add(tuple(e["policy"]))
    differing = [m for m, ps in plans.items() if len(ps) > 1]
    labels = {"state_agnostic": "Agnostic", "joint": "Joint", "regions": "Regions",
              "whole": "Whole", "functional": "Functional", "deferred": "Deferred",
              "eager": "Eager"}
    for m in plans:
        cell = row(md, labels[m]).rsplit("|", 2)[1].strip()
        assert cell.startswith("differs by seed: seed 0: ") == (m in differing), (m, cell)
    # and whatever this machine's plans were: a summary whose plans differ renders them per seed
    from stateremat.paper.report._moco import moco_markdown

    for e in summary["methods"]:
        if e["method"] == "whole" and e["seed"] == 1:
            e["policy"] = ["eager"] + e["policy"][1:]
    cell = row(moco_markdown(summary), "Whole").rsplit("|", 2)[1].strip()
    assert cell.startswith("differs by seed: seed 0: whole") and "; seed 1: eager" in cell, cell


# --- 3. --seeds text, ASCII digits, one prefix per command ----------------------------------
@pytest.mark.parametrize("argv,option_form", [
    (["app", "moco", "--preset", "tiny"], "range"), (["cohort", "semantics"], "range"),
    (["verify", "alias"], "count")])
@pytest.mark.parametrize("text", ["x", "1:y", "٠:٢", "٣", "１:２"])
def test_seeds_text_matches_what_is_accepted_and_only_ascii_digits(tmp_path, argv, option_form,
                                                                   text):
    out = tmp_path / "run"
    res = _run(*argv, "--seeds", text, "--out", out)
    assert res.exit_code == 2, res.output
    assert not out.exists()   # refused before anything is written
    cmd = " ".join(argv[:2])
    assert res.output.startswith(f"error: stateremat {cmd}: --seeds {text!r}: "), res.output
    assert "or one seed" not in res.output   # a bare number is not one seed for any of them
    if not text.isascii():
        assert "ASCII digits 0-9" in res.output
    if option_form == "range":
        assert "a bare N is refused" in res.output


def test_bare_number_is_refused_for_range_options_and_a_count_for_alias(tmp_path):
    res = _run("app", "moco", "--preset", "tiny", "--seeds", "3", "--out", tmp_path / "m")
    assert res.exit_code == 2 and "write --seeds 3:4 for the one seed 3" in res.output
    res = _run("verify", "alias", "--seeds", "0", "--out", tmp_path / "a")
    assert res.exit_code == 2 and "expected a seed count >= 1" in res.output


@pytest.mark.parametrize("argv", [
    ["app", "moco", "--preset", "tiny", "--device", "cuda:99"],
    ["app", "moco", "--preset", "tiny", "--device", "tpu"],
    ["app", "moco", "--preset", "nope"],
    ["app", "moco", "--preset", "tiny", "--methods", "eager,eager"],
    ["app", "moco", "--preset", "tiny", "--data", "/nonexistent-dir"],
    ["app", "moco", "--preset", "tiny", "--threads", "0"],
    ["verify", "alias", "--seeds", "-1:2"],
    ["cohort", "semantics", "--seeds", "5:5"],
])
def test_every_paper_command_error_starts_with_stateremat_and_the_command(tmp_path, argv):
    res = _run(*argv, "--out", tmp_path / "run")
    assert res.exit_code == 2, res.output
    cmd = " ".join(argv[:2])
    assert res.output.startswith(f"error: stateremat {cmd}: "), res.output
    assert "Tip:" in res.output and ".. " not in res.output


def test_a_records_error_is_said_as_the_command(tmp_path):
    out = tmp_path / "alias"
    assert _run("verify", "alias", "--seeds", "1", "--out", out).exit_code == 0
    next((out / "alias").glob("part-*.parquet")).write_bytes(b"junk")
    res = _run("verify", "alias", "--seeds", "1", "--out", out)
    assert res.exit_code == 2, res.output
    err = res.output.strip()   # after the progress bar's line
    assert err.startswith("error: stateremat verify alias: cannot read "), res.output
    assert ".. Tip" not in err and ". Tip: a part is written atomically" in err
