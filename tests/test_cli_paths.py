"""Output paths never replace what a command reads or what a run owns; `-` is stdout; `plan`
exits 1 when nothing fits; sizes are whole bytes in a bounded range (user review, paths).

Every test goes through the real `stateremat` command line (typer's runner on the app).
"""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from stateremat.contract import save_card
from stateremat.planner import random_card
from _cli import run_cli

ROOT = Path(__file__).resolve().parents[1]

_run = run_cli


@pytest.fixture()
def card_path(tmp_path):
    return save_card(random_card(6, 0), tmp_path / "card.json")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


# ------------------------------------------------------------ 1. --json inside the run folder
@pytest.fixture(scope="module")
def finite_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vs") / "vs"
    res = _run("verify", "finite", "--programs", "2", "--out", out)
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("name", ["finite.json", "finite/part-x.parquet", ".run.lock",
                                  "finite_summary.json", "finite.md", ".finite.json.abc.tmp"])
def test_verify_json_naming_a_run_file_is_refused_before_any_work(finite_run, tmp_path, name):
    out = tmp_path / "vs"
    shutil.copytree(finite_run, out)
    before = _snapshot(out)
    res = _run("verify", "finite", "--programs", "2", "--out", out, "--json", out / name)
    assert res.exit_code == 2, res.output
    assert "would replace the run's own file" in res.output and "Tip:" in res.output
    assert _snapshot(out) == before  # the sidecar is intact: the run can still be resumed
    assert _run("report", out).exit_code == 0


def test_verify_json_beside_the_run_files_is_fine(finite_run, tmp_path):
    out = tmp_path / "vs"
    shutil.copytree(finite_run, out)
    res = _run("verify", "finite", "--programs", "2", "--out", out, "--json", out / "summary.json")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["derivative_suite"]["programs"] == 2
    assert json.loads((out / "finite.json").read_text())["table"] == "finite"


def test_semantics_json_naming_its_sidecar_is_refused_before_any_work(tmp_path):
    out = tmp_path / "run"
    res = _run("cohort", "semantics", "--seeds", "0:1", "--out", out, "--json",
               out / "semantics.json", "--no-progress")
    assert res.exit_code == 2 and "would replace the run's own file" in res.output, res.output
    assert not out.exists()


def test_report_on_a_sidecar_without_config_is_incomplete_not_complete(finite_run, tmp_path):
    out = tmp_path / "vs"
    shutil.copytree(finite_run, out)
    (out / "finite.json").write_text(json.dumps({"programs": 2, "checks": {}}))  # a summary
    res = _run("report", out)
    assert res.exit_code == 2, res.output  # a damaged run folder: refused (issue 27)
    assert "holds no run config" in res.output and "cannot be checked" in res.output
    assert not (out / "finite.md").exists()
    assert _run("report", out, "--allow-incomplete").exit_code == 2  # refused, not merely incomplete


# ------------------------------------------------------------ 2. an output that is an input
@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dotdot"])
def test_plan_json_that_is_the_input_card_is_refused(card_path, tmp_path, how):
    before = card_path.read_bytes()
    target = {"same": lambda: card_path,
              "symlink": lambda: (tmp_path / "l.json").symlink_to(card_path) or tmp_path / "l.json",
              "hardlink": lambda: os.link(card_path, tmp_path / "h.json") or tmp_path / "h.json",
              "dotdot": lambda: tmp_path / "sub" / ".." / "card.json"}[how]()
    (tmp_path / "sub").mkdir(exist_ok=True)
    res = _run("plan", card_path, "--budget", "46MiB", "--json", target)
    assert res.exit_code == 2, res.output
    assert "is the same file as the input CARD.json" in res.output
    assert card_path.read_bytes() == before


def test_profile_out_that_is_the_target_module_is_refused(tmp_path, monkeypatch):
    mod = tmp_path / "mymodel_paths.py"
    mod.write_text("def build():\n    raise SystemExit('profiled')\n")
    monkeypatch.chdir(tmp_path)
    res = _run("profile", "mymodel_paths:build", "--out", "mymodel_paths.py")
    assert res.exit_code == 2, res.output
    assert "is the same file as the input mymodel_paths:build" in res.output
    assert mod.read_text().startswith("def build():")


# ------------------------------------------------------------ 3. an output that is a link
def test_plan_json_through_a_symlink_writes_the_target_and_keeps_the_link(card_path, tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    res = _run("plan", card_path, "--budget", "1GiB", "--json", link)
    assert res.exit_code == 0, res.output
    assert os.path.islink(link) and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["budget_bytes"] == 1024**3
    assert not list(tmp_path.glob(".*.tmp"))


# ------------------------------------------------------------ 4. --out checks
def test_unrelated_fifo_and_broken_link_in_out_are_left_alone(tmp_path):
    # in a run folder (a folder that is not a run's is refused whole: tests/test_cli_hostile.py)
    out = tmp_path / "run"
    assert _run("verify", "finite", "--programs", "1", "--out", out).exit_code == 0
    os.mkfifo(out / "notes.fifo")
    os.symlink(tmp_path / "gone", out / "old-results")
    res = _run("verify", "finite", "--programs", "1", "--out", out)
    assert res.exit_code == 0, res.output
    assert stat.S_ISFIFO(os.lstat(out / "notes.fifo").st_mode)
    assert os.path.islink(out / "old-results")
    assert (out / "finite.json").is_file()


def test_a_fifo_where_the_run_writes_is_still_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "finite.json")
    res = _run("verify", "finite", "--programs", "1", "--out", out)
    assert res.exit_code == 2 and "'finite.json' in it is a named pipe (FIFO)" in res.output
    assert sorted(p.name for p in out.iterdir()) == ["finite.json"]


@pytest.mark.parametrize("argv", [["verify", "finite", "--programs", "1", "--out"],
                                  ["bench", "fair", "--preset", "tiny", "--out"],
                                  ["main", "--out"], ["report"],
                                  ["plan", "CARD", "--budget", "1GiB", "--json"],
                                  ["profile", "feature_queue", "--out"]])
def test_an_empty_path_is_refused(tmp_path, monkeypatch, card_path, argv):
    monkeypatch.chdir(tmp_path)
    argv = [str(card_path) if a == "CARD" else a for a in argv]
    before = sorted(os.listdir(tmp_path))
    res = _run(*argv, "")
    assert res.exit_code == 2, res.output
    assert "an empty path is not allowed" in res.output
    assert sorted(os.listdir(tmp_path)) == before


# ------------------------------------------------------------ 5. report on a non-run folder
def test_report_on_a_folder_that_is_not_a_run_writes_nothing(tmp_path):
    d = tmp_path / "emptydir"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    res = _run("report", d)
    assert res.exit_code == 2, res.output
    assert "not a run folder (no sidecars" in res.output
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]


# ------------------------------------------------------------ 6. report reproduces results/
@pytest.mark.parametrize("folder", ["bench-fair", "bench-fair-44MiB", "verify-finite",
                                    "verify-alias", "app-moco"])
def test_report_on_committed_results_reproduces_them_byte_for_byte(tmp_path, folder):
    src = ROOT / "results" / "cpu" / folder
    out = tmp_path / folder
    shutil.copytree(src, out)
    res = _run("report", out)
    assert res.exit_code == 0, res.output
    made = {p.relative_to(out) for p in out.rglob("*") if p.is_file()} - {Path(".run.lock")}
    committed = {p.relative_to(src) for p in src.rglob("*") if p.is_file()}
    assert made == committed  # nothing new: every output of report is committed
    for rel in sorted(committed):
        assert filecmp.cmp(out / rel, src / rel, shallow=False), f"{rel} differs"


# ------------------------------------------------------------ 7. --json -
def test_plan_json_dash_is_stdout_not_a_file(card_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _run("plan", card_path, "--budget", "1GiB", "--json", "-")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # stdout is the JSON alone; the table went to stderr
    assert doc["budget_bytes"] == 1024**3 and doc["fits_budget"] is True
    assert "plan: joint" in res.stderr
    assert not (tmp_path / "-").exists()
    assert "standard output" in _run("plan", "--help").output


def test_verify_json_dash_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _run("verify", "finite", "--programs", "1", "--out", tmp_path / "vs", "--json", "-")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["derivative_suite"]["programs"] == 1
    assert not (tmp_path / "-").exists()


def test_profile_out_dash_is_refused_and_devices_still_are(card_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _run("profile", "feature_queue", "--preset", "tiny", "--out", "-")
    assert res.exit_code == 2 and "'-' (standard output) is not supported" in res.output
    res = _run("plan", card_path, "--budget", "1GiB", "--json", os.devnull)
    assert res.exit_code == 2 and "is a character device" in res.output
    assert not (tmp_path / "-").exists()


# ------------------------------------------------------------ 8. plan exit codes
def test_plan_over_budget_exits_1_after_writing_the_json(card_path, tmp_path):
    out = tmp_path / "p.json"
    res = _run("plan", card_path, "--planner", "eager", "--budget", "1MiB", "--json", out)
    assert res.exit_code == 1, res.output
    doc = json.loads(out.read_text())
    assert doc["fits_budget"] is False
    assert "EXCEEDS budget" in res.stdout and "fits budget" in res.stdout
    assert "feasible True\n" not in res.stdout.replace("│", "").replace("  ", " ")
    assert "no eager plan fits the budget 1.00 MiB" in res.stderr
    joint = _run("plan", card_path, "--planner", "joint", "--budget", "1KiB")
    assert joint.exit_code == 1 and "no joint plan fits the budget" in joint.stderr
    assert "Exit status" in _run("plan", "--help").output


# ------------------------------------------------------------ 9. sizes
@pytest.mark.parametrize("budget, msg", [
    ("1e999", "above the supported maximum of 9,007,199,254,740,992 bytes"),
    ("1e999999999", "above the supported maximum"),
    ("46.7", "not a whole number of bytes"),
    ("46.7MiB", "48,968,499.20 bytes, not a whole number of bytes"),
    ("46XB", "use B, KiB, MiB, GiB, TiB (powers of 1024) or kB, MB, GB, TB (powers of 1000)"),
])
def test_bad_sizes_are_refused_clearly(card_path, budget, msg):
    res = _run("plan", card_path, "--budget", budget)
    assert res.exit_code == 2 and msg in res.output, res.output
    assert len(res.output) < 600  # no thousand-digit numbers


@pytest.mark.parametrize("budget, nbytes", [("46MB", 46_000_000), ("46.5MiB", 48758784),
                                            ("4096", 4096), ("1e3", 1000)])
def test_whole_byte_sizes_are_accepted(card_path, tmp_path, budget, nbytes):
    out = tmp_path / "p.json"
    res = _run("plan", card_path, "--budget", budget, "--json", out)
    assert res.exit_code in (0, 1), res.output
    assert json.loads(out.read_text())["budget_bytes"] == nbytes


# ------------------------------------------------------------ names past the file system's limit
@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_json_name_past_the_name_limit_is_refused_before_work_and_255_bytes_is_written(
        card_path, tmp_path, where):
    long = "n" * 251 + ".json"  # 256 bytes: one past the usual 255-byte limit
    target = tmp_path / long if where == "file" else tmp_path / ("d" * 256) / "plan.json"
    res = _run("plan", card_path, "--budget", "46MiB", "--json", target)
    assert res.exit_code == 2, res.output
    assert "256 bytes" in res.output and "limit of 255 bytes" in res.output and "Tip:" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["card.json"]  # nothing written
    ok = tmp_path / ("n" * 250 + ".json")  # 255 bytes: written
    assert _run("plan", card_path, "--budget", "46MiB", "--json", ok).exit_code == 0
    assert json.loads(ok.read_text())["options"]


def test_an_out_folder_name_past_the_name_limit_is_refused_before_work(tmp_path):
    res = _run("verify", "finite", "--programs", "2", "--out", tmp_path / ("v" * 256))
    assert res.exit_code == 2, res.output
    assert "256 bytes" in res.output and "Tip:" in res.output
    assert list(tmp_path.iterdir()) == []
