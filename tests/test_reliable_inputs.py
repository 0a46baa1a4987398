"""Bad input never crashes, clobbers or starts work (issue 16, kinds 2, 4 and 5).

Every example of the issue is run through the real command line (``stateremat ...``, in
process); each must exit 2 with one ``error:`` line naming the option or file, leave no
traceback, and write nothing: an output path that is a FIFO or a link to a character device
is still exactly that afterwards (never ``/dev/null`` itself: a link to it in ``tmp_path``).
"""
from __future__ import annotations

import json
import os
import stat

import pytest

from stateremat.contract import save_card
from stateremat.planner import random_card
from _cli import run_cli

_run = run_cli


@pytest.fixture()
def card_path(tmp_path):
    return save_card(random_card(6, 0), tmp_path / "card.json")


@pytest.fixture(params=["fifo", "devnull_link"])
def special(request, tmp_path):
    """An existing output path that is not a regular file; checked unchanged afterwards."""
    path = tmp_path / request.param
    if request.param == "fifo":
        os.mkfifo(path)
        kind = "a named pipe (FIFO)"
    else:
        os.symlink(os.devnull, path)
        kind = "a symbolic link to a character device"
    before = (os.lstat(path).st_mode, os.path.islink(path))
    yield path, kind
    assert (os.lstat(path).st_mode, os.path.islink(path)) == before  # still what it was


def _refused(res, where, kind):
    assert res.exit_code == 2, res.output
    assert f"{where}" in res.output and f"is {kind}, not a regular file" in res.output
    assert "Tip:" in res.output


def test_plan_json_that_is_not_a_regular_file_is_refused_before_planning(card_path, special):
    path, kind = special
    _refused(_run("plan", card_path, "--budget", "1GiB", "--json", path), "--json", kind)


@pytest.mark.parametrize("command", [["finite", "--programs", "1"], ["engines", "--programs", "1"],
                                     ["alias", "--seeds", "1"]])
def test_verify_json_that_is_not_a_regular_file_is_refused_before_the_run(tmp_path, special,
                                                                          command):
    path, kind = special
    out = tmp_path / "run"
    _refused(_run("verify", *command, "--out", out, "--json", path), "--json", kind)
    assert not out.exists()


def test_semantics_json_that_is_not_a_regular_file_is_refused(tmp_path, special):
    path, kind = special
    out = tmp_path / "run"
    _refused(_run("cohort", "semantics", "--seeds", "0:1", "--out", out, "--json", path,
                  "--no-progress"), "--json", kind)
    assert not out.exists()


def test_profile_out_that_is_not_a_regular_file_is_refused_before_profiling(special, monkeypatch):
    import stateremat.paper.profile as prof

    monkeypatch.setattr(prof, "profile_workload", lambda *a, **k: pytest.fail("profiled"))
    path, kind = special
    _refused(_run("profile", "feature_queue", "--preset", "tiny", "--out", path), "--out", kind)


def test_profile_out_that_cannot_be_created_is_refused_before_profiling(tmp_path, monkeypatch):
    import stateremat.paper.profile as prof

    monkeypatch.setattr(prof, "profile_workload", lambda *a, **k: pytest.fail("profiled"))
    (tmp_path / "afile").write_text("x")
    res = _run("profile", "feature_queue", "--preset", "tiny", "--out", tmp_path / "afile" / "c.json")
    assert res.exit_code == 2 and "is a file, not a folder" in res.output


@pytest.mark.parametrize("argv, own", [  # own: a file the run writes (only those are checked)
    (["verify", "finite", "--programs", "1"], "finite.json"),
    (["bench", "fair", "--preset", "tiny"], "summary.json"),
    (["cohort", "processes", "--experiment", "fair44", "--processes", "1", "--preset", "tiny"],
     "summary.json"),
    (["cohort", "semantics", "--seeds", "0:1", "--no-progress"], "semantics.json"),
    (["app", "moco", "--preset", "tiny", "--seeds", "1:2"], "summary.json"),
])
def test_run_folders_that_are_not_folders_or_hold_a_fifo_are_refused(tmp_path, special, argv, own):
    path, kind = special
    res = _run(*argv, "--out", path)
    assert res.exit_code == 2 and f"is {kind}, not a folder" in res.output, res.output
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / own)
    res = _run(*argv, "--out", out)
    assert res.exit_code == 2 and f"'{own}' in it is a named pipe (FIFO)" in res.output
    assert sorted(p.name for p in out.iterdir()) == [own]
    assert stat.S_ISFIFO(os.lstat(out / own).st_mode)


# --------------------------------------------------------------------------- ranges (kind 4)
@pytest.mark.parametrize("argv, msg", [
    (["verify", "finite", "--programs", "99999999999999999999"], "--programs must be >= 1 and <= 100,000"),
    (["verify", "engines", "--programs", "99999999999999999999"], "--programs must be >= 1 and <= 100,000"),
    (["verify", "alias", "--seeds", "0:99999999999999999999"], "seeds must be at most 4294967295"),
    (["cohort", "semantics", "--seeds", "0:100000000"], "100,000,000 seeds, more than the 10,000 allowed"),
    (["cohort", "semantics", "--seeds", "99999999999999999999:99999999999999999999999"],
     "seeds must be at most 4294967295"),
    (["app", "moco", "--preset", "tiny", "--seeds", "1:99999999999999999999"],
     "seeds must be at most 4294967295"),
    (["bench", "fair", "--preset", "tiny", "--steps", "100000000000000000000"],
     "--steps must be >= 1 and <= 10,000"),
    (["bench", "fair", "--preset", "tiny", "--warmups", "1000001"], "--warmups must be >= 0 and <= 1,000"),
    (["profile", "feature_queue", "--state-mib", "99999999999"], "--state-mib must be >= 1 and <= 1,048,576"),
    (["profile", "feature_queue", "--live", "100000"], "--live must be >= 1 and <= 1,024"),
    (["profile", "feature_queue", "--write-fraction", "0"], "--write-fraction must be > 0 and <= 1"),
    (["profile", "feature_queue", "--repeats", "0"], "--repeats must be >= 1 and <= 1,000"),
    (["cohort", "processes", "--experiment", "fair44", "--processes", "1", "--timeout-s", "inf"],
     "--timeout-s must be > 0 and <= 604,800.0, got inf"),
    (["cohort", "processes", "--experiment", "fair44", "--processes", "1", "--timeout-s", "nan"],
     "--timeout-s must be > 0 and <= 604,800.0, got nan"),
    (["cohort", "processes", "--experiment", "fair44", "--processes", "1", "--seed", "-1"],
     "--seed must be >= 0 and <= 4,294,967,295, got -1"),
    (["cohort", "processes", "--experiment", "fair44", "--processes", "99999999999999999999"],
     "--processes must be >= 1 and <= 10,000"),
    (["cohort", "processes", "--experiment", "fair44", "--processes", "1", "--jobs", "0"],
     "--jobs must be >= 1"),
])
def test_every_numeric_option_has_a_range_checked_before_any_work(tmp_path, argv, msg):
    out = tmp_path / "run"
    res = _run(*argv, "--out", out / "c.json" if argv[0] == "profile" else out)
    assert res.exit_code == 2 and msg in res.output and "Tip:" in res.output, res.output
    assert not out.exists()


def test_a_non_integer_count_is_a_usage_error_not_a_crash(tmp_path):
    res = _run("bench", "fair", "--steps", "1e20", "--out", tmp_path / "run")
    assert res.exit_code == 2 and "'--steps'" in res.output and not (tmp_path / "run").exists()


def test_work_larger_than_the_machine_is_refused_with_the_estimate(tmp_path, monkeypatch):
    from stateremat._shared import checks as _checks

    monkeypatch.setattr(_checks, "available_memory_bytes", lambda device="cpu": 10 * 2**20)
    for argv in (["profile", "feature_queue", "--out", tmp_path / "c.json"],
                 ["bench", "fair", "--out", tmp_path / "b"],
                 ["verify", "finite", "--programs", "100000", "--out", tmp_path / "v"]):
        res = _run(*argv)
        assert res.exit_code == 2 and "needs about" in res.output, res.output
        assert "estimated), but this machine has 10.00 MiB available" in res.output
    assert not any((tmp_path / n).exists() for n in ("c.json", "b", "v"))


# --------------------------------------------------------------------------- errors (kind 5)
@pytest.mark.parametrize("argv", [
    ["profile", "feature_queue", "--preset", "tiny"],
    ["main"],
    ["bench", "fair", "--preset", "tiny"],
    ["cohort", "processes", "--experiment", "fair44", "--processes", "1"],
    ["cohort", "semantics", "--seeds", "0:1", "--no-progress"],
])
@pytest.mark.parametrize("device", ["tpu", "cuda", "cuda:7"])
def test_unusable_devices_are_refused_before_any_work(tmp_path, monkeypatch, argv, device):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only torch
    out = tmp_path / "run"
    res = _run(*argv, "--device", device, "--out", out / "c.json" if argv[0] == "profile" else out)
    assert res.exit_code == 2 and "--device" in res.output and "Tip:" in res.output, res.output
    assert ("sees no CUDA device" in res.output) == device.startswith("cuda")
    assert not out.exists()


def test_plan_on_deeply_nested_or_undecodable_json_names_the_file(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    res = _run("plan", deep, "--budget", "1GiB")
    assert res.exit_code == 2 and f"'{deep}' nests JSON too deeply" in res.output
    card = random_card(2, 0).to_dict()
    meta = card["meta"]
    for _ in range(500):  # parses, but would overflow every writer that recurses into it
        meta["x"] = {}
        meta = meta["x"]
    deep.write_text(json.dumps(card))
    res = _run("plan", deep, "--budget", "1GiB", "--json", tmp_path / "p.json")
    assert res.exit_code == 2 and "meta: nested more than 64 levels deep" in res.output
    assert not (tmp_path / "p.json").exists()
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"schema_version": 1, "x": "\xff"}')
    res = _run("plan", latin, "--budget", "1GiB")
    assert res.exit_code == 2 and f"'{latin}' is not UTF-8 text" in res.output


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe", b"[1, 2]"])
def test_a_damaged_sidecar_is_named_with_what_to_do(tmp_path, damage):
    out = tmp_path / "run"
    assert _run("verify", "finite", "--programs", "2", "--out", out).exit_code == 0
    (out / "finite.json").write_bytes(damage)
    for argv in (["verify", "finite", "--programs", "2", "--out", out], ["report", out]):
        res = _run(*argv)
        assert res.exit_code in (1, 2) and f"sidecar {out / 'finite.json'}" in res.output, res.output
        assert not res.output.startswith("error: JSONDecodeError")  # the bare message of old
        assert "restore it from a copy" in res.output


def test_a_damaged_frozen_profile_card_is_named(tmp_path):
    out = tmp_path / "run"
    (out / "profile").mkdir(parents=True)
    (out / ".run.lock").touch()  # a run's folder (another folder is refused whole)
    (out / "profile" / "large_sparse.json").write_text("{")
    res = _run("cohort", "processes", "--experiment", "fair44", "--preset", "tiny",
               "--processes", "1", "--out", out)
    assert res.exit_code == 2 and f"'{out / 'profile' / 'large_sparse.json'}' is not valid JSON" \
        in res.output, res.output


@pytest.mark.parametrize("jobs, processes, refused", [(4, 8, True), (4, 2, False), (1, 8, False)])
def test_concurrent_cohort_processes_count_in_the_memory_estimate(tmp_path, monkeypatch, jobs, processes,
                                                                   refused):
    """C18 of the user review: --jobs N runs N copies of the largest cell at once on this machine;
    at most --processes of them."""
    from stateremat._shared import checks as _checks
    from stateremat.paper.bench import experiment_spec

    one = max(c.config.estimated_peak_bytes for c in experiment_spec("fair44", "cpu").cells)
    from stateremat.paper import cohort

    monkeypatch.setattr(_checks, "available_memory_bytes", lambda device="cpu": int(2.5 * one))

    def launched(*a, **k):  # past every check: stop here instead of running the cohort
        raise SystemExit(3)
    monkeypatch.setattr(cohort, "run_process_cohort", launched)
    out = tmp_path / "run"
    res = _run("cohort", "processes", "--experiment", "fair44", "--preset", "cpu", "--processes",
               str(processes), "--jobs", str(jobs), "--out", out)
    if refused:
        assert res.exit_code == 2 and "x 4 concurrent processes (--jobs)" in res.output, res.output
        assert "Tip: lower --jobs" in res.output and not out.exists()
    else:
        assert res.exit_code == 3 and "needs about" not in res.output, res.output
