"""Runs review: damaged MoCo score files, unambiguous --seeds, frozen profile cards, config
diffs naming the field, --dask addresses and early signals — each through the real CLI."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from stateremat.paper.records import read_records
from _cli import catches_signal, run_cli

SRC = Path(__file__).resolve().parents[1] / "src"

_run = run_cli


# --- 1. MoCo score files -----------------------------------------------------------------

MOCO = ["app", "moco", "--preset", "tiny", "--seeds", "2701:2703", "--methods", "eager,whole"]


@pytest.fixture(scope="module")
def moco_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("moco") / "run"
    res = _run(*MOCO, "--out", out)
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("damage", ["delete", "junk"])
def test_damaged_score_file_is_incomplete_in_report_and_redone_by_a_rerun(moco_run, tmp_path,
                                                                          damage):
    out = tmp_path / "run"
    shutil.copytree(moco_run, out)
    f = out / "scores" / "seed-2701" / "whole.npy"
    good = f.read_bytes()
    if damage == "delete":
        f.unlink()
    else:
        f.write_bytes(b"\x93NUMPY junk")
    res = _run("report", out)
    assert res.exit_code == 1, res.output
    assert "scores/seed-2701/whole.npy" in res.output and "moco" in res.output
    assert not (out / "moco_table9.md").exists()  # no equality claim from damaged files
    res = _run("report", out, "--allow-incomplete")
    assert res.exit_code == 0, res.output
    md = (out / "moco_table9.md").read_text()
    assert "**False**" not in md and "**True**" not in md
    assert "**not assessed**: score files missing or differing" in md
    assert "scores/seed-2701/whole.npy" in md
    n_before = len(read_records(out, "moco"))
    res = _run(*MOCO, "--out", out)  # the rerun redoes exactly that (seed, method)
    assert res.exit_code == 0, res.output
    assert "mismatch" not in res.output
    assert f.read_bytes() == good
    rows = read_records(out, "moco")
    assert len(rows) == n_before  # replaced, not added
    ok = rows[(rows["seed"] == 2701) & (rows["method"] == "whole")]
    assert len(ok) == 1 and ok.iloc[0]["scores_sha256"] == hashlib.sha256(good).hexdigest()
    res = _run("report", out)
    assert res.exit_code == 0, res.output
    md = (out / "moco_table9.md").read_text()
    assert "**not assessed** (a subset of the seven methods" in md and "score file mismatch" not in md


# --- 2. --seeds: a range, never a bare number (except verify alias's count) ---------------

def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


@pytest.mark.parametrize("argv", [["cohort", "semantics"], ["app", "moco", "--preset", "tiny"]])
def test_bare_seed_number_is_refused_asking_for_a_range(argv, tmp_path):
    out = tmp_path / "run"
    res = _run(*argv, "--seeds", "3", "--out", out)
    assert res.exit_code == 2, res.output
    text = _flat(res.output)
    assert "--seeds '3'" in text and "half-open range A:B" in text, text
    assert "--seeds 3:4" in text and "--seeds 0:3" in text, text
    assert not out.exists()  # refused before anything is written
    res = _run(*argv, "--seeds", "0", "--out", out)
    assert res.exit_code == 2 and "--seeds 0:1" in _flat(res.output), res.output
    help_text = _flat(_run(*argv, "--help").output)
    assert "half-open" in help_text.lower() and "bare N is refused" in help_text, help_text


def test_verify_alias_help_says_its_seeds_option_is_a_count():
    res = _run("verify", "alias", "--help")
    assert res.exit_code == 0, res.output
    text = _flat(res.output)
    assert "A count N of seeds: seeds 0..N-1" in text, text


# --- 4. another config: the innermost differing fields -----------------------------------

def test_config_mismatch_names_the_innermost_field(moco_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(moco_run, out)
    argv = [a if a != "tiny" else "cpu" for a in MOCO]
    res = _run(*argv, "--out", out)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "another config (preset.name: 'tiny' -> 'cpu'; preset.width: 4 -> 8;" in text, text
    assert "more)" in text and "'preset': {" not in text and "{'name'" not in text, text
    assert "Tip: use a new --out folder" in text


# --- 3. cohort processes: frozen cards vs --profile; the config checked before any card ----

COHORT = ["cohort", "processes", "--experiment", "fair44", "--preset", "tiny", "--processes",
          "1", "--jobs", "1", "--warmups", "0", "--steps", "1"]


@pytest.fixture(scope="module")
def cohort_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cohort") / "run"
    res = _run(*COHORT, "--out", out)
    assert res.exit_code == 0, res.output
    return out


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_profile_other_than_the_frozen_cards_is_refused_before_anything(cohort_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(cohort_run, out)
    frozen = out / "profile" / "large_sparse.json"
    other = tmp_path / "cards"
    other.mkdir()
    doc = json.loads(frozen.read_text())
    doc["segments"][0]["options"]["eager"]["time_s"] *= 2  # measured differently
    (other / "large_sparse.json").write_text(json.dumps(doc))
    before = _snapshot(out)
    res = _run(*COHORT, "--processes", "2", "--out", out, "--profile", other)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert f"{other / 'large_sparse.json'} differs from {frozen}" in text, text
    assert "Tip: rerun without --profile" in text
    assert _snapshot(out) == before  # nothing measured, written or run
    same = tmp_path / "same"
    shutil.copytree(out / "profile", same)
    res = _run(*COHORT, "--out", out, "--profile", same)  # the frozen cards themselves: resumes
    assert res.exit_code == 0 and "1 processes already done, ran 0" in res.output, res.output


def test_cohort_config_is_checked_before_any_card_is_measured(cohort_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(cohort_run, out)
    (out / "profile" / "large_sparse.json").unlink()  # would be measured again
    argv = [a if a != "1" or i != COHORT.index("--steps") + 1 else "2"
            for i, a in enumerate(COHORT)]
    res = _run(*argv, "--out", out)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "another config (cells[0].steps: 1 -> 2)" in text, text
    assert not (out / "profile" / "large_sparse.json").exists()


# --- 5. --dask: checked first, in seconds --------------------------------------------------

@pytest.mark.parametrize("address", ["nonsense", "http://host:8786", "tcp://host:99999",
                                     "tcp://host", "tcp://:8786"])
def test_malformed_dask_address_is_refused_before_anything(address, tmp_path):
    out = tmp_path / "run"
    res = _run(*COHORT, "--out", out, "--dask", address)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert f"--dask {address!r}: expected host:port or scheme://host:port" in text, text
    assert "Tip:" in text and not out.exists()


def test_unreachable_dask_scheduler_fails_in_seconds(tmp_path):
    import socket
    import time

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    with socket.socket() as silent:  # accepts connections (backlog), never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        for address, said in ((f"tcp://127.0.0.1:{free}", "no Dask scheduler there"),
                              (f"127.0.0.1:{silent.getsockname()[1]}",
                               "no Dask scheduler answered within 5 s")):
            t = time.monotonic()
            res = _run(*COHORT, "--out", tmp_path / "run", "--dask", address)
            assert time.monotonic() - t < 20
            assert res.exit_code == 2, res.output
            text = " ".join(res.output.split())
            assert f"--dask {address!r}: {said}" in text and "Tip:" in text, text
            assert not (tmp_path / "run").exists()


# --- 6. a stop signal during the CLI's startup imports: one line, 128 + signal -------------

_catches = catches_signal


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_signal_during_startup_imports_prints_one_line(signame, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    signum = getattr(signal, signame)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "stateremat", "cohort", "semantics",
                             "--seeds", "0:1", "--no-progress", "--out", str(tmp_path / "run")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    # the handlers are installed first thing; the paper wing's imports (pandas, torch) follow
    while not _catches(proc.pid, signal.SIGHUP) and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"stopped by {signame}" in err and err.startswith("error: "), err
