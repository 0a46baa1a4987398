"""Outputs and messages that cannot lie (issue 27, the output half): where `report` may write,
never deleting outputs, clear messages, tips that work when followed, valid JSON, duplicate
JSON keys refused, and a stop during exit handlers exiting non-zero."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stateremat._shared.io import atomic_write_bytes
from stateremat.contract import ProfileCardError, load_card

from _cli import run_cli

import stateremat  # noqa: E402

SRC = Path(stateremat.__file__).resolve().parents[1]  # the stateremat under test


@pytest.fixture(scope="module")
def finite_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finite") / "run"
    assert run_cli("verify", "finite", "--programs", "40", "--out", out).exit_code == 0
    return out


def _copy(src, dst):
    shutil.copytree(src, dst)
    (dst / ".run.lock").unlink(missing_ok=True)
    return dst


def _files(d: Path) -> dict:
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _tip_out(output: str) -> str:
    return re.search(r"--out (\S+?)\.?$", output.strip().splitlines()[-1]).group(1)


# ------------------------------------------------------------ 1. where --out may be
@pytest.mark.parametrize("kind", ["other-run", "rows-folder", "run-itself", "other-files",
                                  "other-report"])
def test_report_out_is_new_empty_or_its_own_else_refused_with_a_tip_that_works(
        finite_run, tmp_path, kind):
    run = _copy(finite_run, tmp_path / "run")
    other = _copy(finite_run, tmp_path / "other")
    if kind == "other-report":
        assert run_cli("report", other, "--out", tmp_path / "rep").exit_code == 0
    target = {"other-run": other, "rows-folder": run / "finite", "run-itself": run,
              "other-files": tmp_path / "notes", "other-report": tmp_path / "rep"}[kind]
    if kind == "other-files":
        target.mkdir()
        (target / "finite.md").write_text("my notes")
    before, run_before = _files(target), _files(run)
    res = run_cli("report", run, "--out", target)
    assert res.exit_code == 2, res.output
    assert _files(target) == before and _files(run) == run_before  # nothing written anywhere
    tip = _tip_out(res.output)
    res = run_cli("report", run, "--out", tip)  # the tip, followed literally
    assert res.exit_code == 0, res.output
    assert (Path(tip) / "finite.md").is_file()
    assert _files(run) == run_before


def test_report_rewrites_its_own_out_folder_for_the_same_run(finite_run, tmp_path):
    run = _copy(finite_run, tmp_path / "run")
    (tmp_path / "empty").mkdir()
    for dest in (tmp_path / "new", tmp_path / "empty"):
        for _ in range(2):
            res = run_cli("report", run, "--out", dest)
            assert res.exit_code == 0, res.output
        assert json.loads((dest / ".report.json").read_text())["run"] == os.path.realpath(run)


# ------------------------------------------------------------ 2. links and folders at outputs
@pytest.mark.parametrize("into", ["run", "out"])
@pytest.mark.parametrize("what", ["dangling-link", "link-to-file", "folder"])
def test_an_output_that_is_a_link_or_folder_is_refused_and_never_followed(
        finite_run, tmp_path, into, what):
    run = _copy(finite_run, tmp_path / "run")
    dest = run
    if into == "out":
        dest = tmp_path / "rep"
        assert run_cli("report", run, "--out", dest).exit_code == 0
    (dest / "finite.md").unlink(missing_ok=True)
    outside = tmp_path / "elsewhere" / "sub" / "x.md"
    if what == "dangling-link":
        os.symlink(outside, dest / "finite.md")
    elif what == "link-to-file":
        (tmp_path / "mine.md").write_text("mine")
        os.symlink(tmp_path / "mine.md", dest / "finite.md")
    else:
        (dest / "finite.md").mkdir()
    extra = ["--out", dest] if into == "out" else []
    res = run_cli("report", run, *extra)
    assert res.exit_code == 2, res.output
    assert f"{dest / 'finite.md'}" in res.output and ".tmp" not in res.output
    assert not (tmp_path / "elsewhere").exists()  # no folder made outside
    if what == "link-to-file":
        assert (tmp_path / "mine.md").read_text() == "mine"
    move = re.search(r"\(mv (\S+) (\S+)\)", res.output)
    os.rename(move.group(1), move.group(2))  # the tip, followed
    assert run_cli("report", run, *extra).exit_code == 0
    assert (dest / "finite.md").is_file() and not (dest / "finite.md").is_symlink()


def test_atomic_write_never_creates_a_dangling_links_target_and_names_a_folder(tmp_path):
    link = tmp_path / "out.json"
    os.symlink(tmp_path / "gone" / "deeper" / "t.json", link)
    with pytest.raises(FileNotFoundError, match="symbolic link"):
        atomic_write_bytes(link, b"x")
    assert not (tmp_path / "gone").exists()
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(IsADirectoryError) as err:
        atomic_write_bytes(tmp_path / "dir.json", b"x")
    assert "dir.json is a folder" in str(err.value) and ".tmp" not in str(err.value)
    assert not list(tmp_path.glob(".*.tmp"))


# ------------------------------------------------------------ 3. never delete outputs
def _lose_part(d):
    sorted((d / "finite").glob("part-*.parquet"))[-1].unlink()


def _alter_part(d):  # one row's column of another type: refused by the schema
    p = sorted((d / "finite").glob("part-*.parquet"))[0]
    t = pq.read_table(p)
    i = t.schema.get_field_index("program")
    pq.write_table(t.set_column(i, "program", pa.array([str(v) for v in
                                                        t.column(i).to_pylist()])), p)


@pytest.mark.parametrize("damage", [_lose_part, _alter_part], ids=["lost-part", "altered-part"])
def test_report_never_deletes_earlier_outputs(finite_run, tmp_path, damage):
    run = _copy(finite_run, tmp_path / "run")
    assert run_cli("report", run).exit_code == 0
    outputs = {n: (run / n).read_bytes() for n in ("finite.md", "finite_summary.json")}
    damage(run)
    res = run_cli("report", run)
    assert res.exit_code in (1, 2), res.output
    assert "removed" not in res.output
    assert {n: (run / n).read_bytes() for n in outputs} == outputs


def test_incomplete_tips_are_sentences_that_work(finite_run, tmp_path):
    run = _copy(finite_run, tmp_path / "run")
    assert run_cli("report", run).exit_code == 0
    _lose_part(run)
    res = run_cli("report", run)
    assert res.exit_code == 1 and "stale: finite_summary.json, finite.md" in res.output
    assert "then or" not in res.output
    assert res.output.rstrip().endswith("rerun the run's command with the same --out to finish "
                                        "it, or pass --allow-incomplete to render the rows "
                                        "there are."), res.output
    assert run_cli("report", run, "--allow-incomplete").exit_code == 0  # followed: works
    assert run_cli("verify", "finite", "--programs", "40", "--out", run).exit_code == 0  # rerun
    assert run_cli("report", run).exit_code == 0


# ------------------------------------------------------------ 4. clear messages
def test_a_rows_folder_that_cannot_be_listed_is_not_called_empty(finite_run, tmp_path,
                                                                 monkeypatch):
    run = _copy(finite_run, tmp_path / "run")
    real = os.scandir

    def scandir(path="."):  # what chmod 000 does to a non-root user
        if Path(path) == run / "finite":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    res = run_cli("report", run)
    assert res.exit_code == 2, res.output
    assert f"cannot list the rows folder {run / 'finite'}: Permission denied" in res.output
    assert "empty" not in res.output


def test_a_looping_part_link_says_why(finite_run, tmp_path):
    run = _copy(finite_run, tmp_path / "run")
    os.symlink("part-loop.parquet", run / "finite" / "part-loop.parquet")
    res = run_cli("report", run)
    assert res.exit_code == 2, res.output
    p = run / "finite" / "part-loop.parquet"
    assert f"cannot read {p}: Too many levels of symbolic links" in res.output
    assert f"{p}: {p}" not in res.output and "symbolic link that loops" in res.output


def test_a_part_name_that_is_not_utf8_is_read_and_shown_escaped(finite_run, tmp_path):
    run = _copy(finite_run, tmp_path / "run")
    first = sorted((run / "finite").glob("part-*.parquet"))[0]
    odd = os.fsdecode(bytes(run / "finite") + b"/part-\xff\xfe.parquet")
    shutil.copyfile(first, odd)  # a copied part: its keys are duplicates
    res = run_cli("report", run)
    assert res.exit_code == 2, res.output
    assert "duplicate key" in res.output and "part-\\xff\\xfe.parquet" in res.output
    assert "surrogates" not in res.output and "\\udc" not in res.output


@pytest.mark.parametrize("text,where", [
    ('{"config": {},\r\n"x": ,}', "line 2 column 6 (char 21)"),
    ('{"config": {},\r"x": ,}', "line 1 column 21 (char 20)")], ids=["crlf", "cr"])
def test_sidecar_json_errors_give_the_files_own_position(finite_run, tmp_path, text, where):
    run = _copy(finite_run, tmp_path / "run")
    (run / "finite.json").write_bytes(text.encode())
    res = run_cli("report", run)
    assert res.exit_code == 2 and where in res.output, res.output


# ------------------------------------------------------------ 5/6. plan: tips and JSON
CARD = {"schema_version": 1, "persistent_bytes": 10, "meta": {},
        "segments": [{"name": "s0", "options": {
            "eager": {"retained_bytes": 8, "temp_bytes": 0, "time_s": 0.1},
            "whole": {"retained_bytes": 2, "temp_bytes": 4, "time_s": 0.2}}}]}


@pytest.mark.parametrize("budget", ["11", "17"])
@pytest.mark.parametrize("planner", ["joint", "eager_whole", "state_agnostic", "eager", "whole"])
@pytest.mark.parametrize("peak", ["eq3", "chain"])
def test_plan_tips_never_suggest_themselves_and_work_when_followed(tmp_path, planner, budget,
                                                                   peak):
    card = tmp_path / "card.json"
    card.write_text(json.dumps(CARD))
    args = ["plan", card, "--budget", budget, "--planner", planner, "--peak", peak]
    res = run_cli(*args)
    if res.exit_code == 0:
        return
    assert res.exit_code == 1, res.output
    tip = res.output.split("Tip: ")[-1]
    assert f"--planner {planner}" not in tip, tip
    m = re.search(r"--budget (\d+)", tip)
    assert m, tip
    assert run_cli(*args[:3], m.group(1), *args[4:]).exit_code == 0
    if "--planner joint" in tip:
        assert run_cli(*args[:5], "joint", *args[6:]).exit_code == 0


@pytest.mark.parametrize("to", ["stdout", "file"])
def test_plan_json_is_rfc8259_with_null_for_a_time_past_float_range(tmp_path, to):
    card = dict(CARD, segments=[dict(CARD["segments"][0], name=f"s{i}", options={
        k: dict(v, time_s=1e308) for k, v in CARD["segments"][0]["options"].items()})
        for i in range(2)])
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    out = tmp_path / "plan.json"
    res = run_cli("plan", path, "--budget", "1KiB", "--json", "-" if to == "stdout" else out)
    assert res.exit_code == 0, res.output
    text = res.stdout if to == "stdout" else out.read_text()

    def refuse(name):
        raise AssertionError(f"not JSON: {name}")

    doc = json.loads(text, parse_constant=refuse)
    assert doc["predicted_time_s"] is None and doc["model_time_s"] is None


# ------------------------------------------------------------ 7. duplicate JSON keys
@pytest.mark.parametrize("where,key", [
    ('"persistent_bytes": 10,', "persistent_bytes"),
    ('"time_s": 0.1,', "time_s")], ids=["top", "nested"])
def test_a_card_or_sidecar_with_a_duplicate_key_is_refused_naming_key_and_file(
        finite_run, tmp_path, where, key):
    text = json.dumps(CARD)
    card = tmp_path / "card.json"
    card.write_text(text.replace(where.rstrip(","), where + " " + where.rstrip(","), 1)
                    if key == "persistent_bytes" else
                    text.replace('"time_s": 0.1', '"time_s": 0.1, "time_s": 0.1', 1))
    with pytest.raises(ProfileCardError, match=f"{re.escape(str(card))}.*'{key}' appears twice"):
        load_card(card)
    res = run_cli("plan", card, "--budget", "1KiB")
    assert res.exit_code == 2 and f"'{key}' appears twice" in res.output, res.output
    run = _copy(finite_run, tmp_path / "run")
    sidecar = run / "finite.json"
    sidecar.write_text(sidecar.read_text().replace("{", '{"table": "x", "table": "y", ', 1))
    res = run_cli("report", run)
    assert res.exit_code == 2, res.output
    assert f"{sidecar}: the key 'table' appears twice" in res.output


# ------------------------------------------------------------ 8. a stop in exit handlers
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_during_exit_handlers_exits_with_the_signals_code(tmp_path, signame):
    script = tmp_path / "slow_exit.py"
    script.write_text(textwrap.dedent("""
        import atexit, time
        from stateremat._shared.signals import install_stop_handlers, stop_on_signal
        install_stop_handlers(stop_on_signal)
        def slow():
            print("ready", flush=True)
            time.sleep(30)
        atexit.register(slow)
    """))
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(getattr(signal, signame))
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    signum = getattr(signal, signame)
    assert f"stopped by {signame}" in err
    assert proc.returncode == 128 + signum, err
    assert time.monotonic() - t0 < 10
