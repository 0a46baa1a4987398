"""Interrupted, then resumed: the rows equal an uninterrupted run's (issue 16, kind 1 and "done").

Each long command runs three times through the real ``stateremat`` command line, in
subprocesses at the smallest sizes that still span several parts: once uninterrupted into a
fresh ``--out`` (the reference), then into another folder that is stopped as soon as its first
finished unit is on disk (SIGINT to the command only, Ctrl-C to its whole process group, or
``kill -9`` of the command), then rerun there to resume. The stopped command must exit
non-zero having kept its finished rows, leave no process running and, once resumed, no
temporary file; the resumed rows must equal the reference's in count, keys and every
deterministic field (times, load, pids, timestamps and attempt counters differ by nature).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from stateremat.paper.records import read_records

pytest.importorskip("torch")

#: Fields that differ between any two runs (measured time, machine load, process ids, clocks,
#: retries): everything else must be equal.
NONDETERMINISTIC = {"step_time_s", "loadavg", "pid", "process_wall_s", "encoder_time_s",
                    "elapsed_s", "created_utc", "attempt", "hostname"}

CASES = {
    "verify": dict(argv=["verify", "finite", "--programs", "1000"], table="finite",
                   key=["suite", "seed", "program", "check"]),
    "semantics": dict(argv=["cohort", "semantics", "--seeds", "0:1", "--no-progress"],
                      table="semantics", key=["backend", "method", "family", "seed", "dtype"]),
    "bench": dict(argv=["bench", "pressure", "--preset", "tiny", "--warmups", "0", "--steps", "1"],
                  table="bench", key=["cell", "method", "step"], frozen="cards"),
    "moco": dict(argv=["app", "moco", "--preset", "tiny", "--seeds", "2701:2702",
                       "--methods", "eager,whole,regions"], table="moco", key=["seed", "method"]),
    "cohort": dict(argv=["cohort", "processes", "--experiment", "fair44", "--preset", "tiny",
                         "--processes", "3", "--jobs", "1", "--warmups", "0", "--steps", "1"],
                   table="cohort_timing", key=["process", "cell", "method", "step"],
                   frozen="profile"),
}
STOPS = {"SIGINT": 128 + signal.SIGINT, "Ctrl-C": 128 + signal.SIGINT, "SIGKILL": -signal.SIGKILL}


def _run_args(case: dict, out: Path, ref: Path | None) -> tuple[list[str], dict]:
    """argv and environment of one launch; stopped and resumed runs plan on the reference's
    frozen profile cards, so budgets and policies match it."""
    argv = [sys.executable, "-m", "stateremat", *case["argv"], "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # no OpenMP spinning on a shared machine
    if ref is not None and case.get("frozen") == "profile":
        argv += ["--profile", str(ref / "profile")]
    if ref is not None and case.get("frozen") == "cards":
        env["STATEREMAT_FROZEN_PROFILE"] = str(ref / "cards")
    return argv, env


def _launch(case, out, ref, log: Path) -> subprocess.Popen:
    argv, env = _run_args(case, out, ref)
    with open(log, "ab") as fh:
        return subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _finish(case, out, ref, log) -> None:
    proc = _launch(case, out, ref, log)
    assert proc.wait(timeout=600) == 0, log.read_text()


def _processes_using(path: Path) -> list[int]:
    """Pids of live processes whose command line mentions ``path``."""
    me, found = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            state = (d / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if str(path) in cmd and state != "Z":
            found.append(int(d.name))
    return found


def _started(out: Path, case: dict) -> bool:
    if not any((out / case["table"]).glob("part-*.parquet")):
        return False
    return case["table"] != "cohort_timing" or len(list((out / ".tmp" / "cohort").glob("*"))) > 0


def _rows(out: Path, case: dict) -> pd.DataFrame:
    df = read_records(out, case["table"])
    assert not df.duplicated(case["key"]).any()  # every unit once
    df = df.drop(columns=[c for c in NONDETERMINISTIC if c in df])
    df = df.astype(object).where(df.notna(), None)  # a part's all-null column reads as None or NaN
    return df.sort_values(case["key"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            ref = tmp_path_factory.mktemp(f"ref-{name}") / "run"
            _finish(CASES[name], ref, None, ref.parent / "log.txt")
            made[name] = ref
        return made[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name, stop", [(n, s) for n in CASES for s in ("SIGINT", "SIGKILL")]
                         + [("cohort", "Ctrl-C")])
def test_interrupted_then_resumed_run_equals_an_uninterrupted_one(references, tmp_path, name,
                                                                 stop):
    case, ref = CASES[name], references(name)
    out, log = tmp_path / "run", tmp_path / "log.txt"
    proc = _launch(case, out, ref, log)
    parts = out / case["table"]
    deadline = time.monotonic() + 300
    while not _started(out, case):  # the first finished unit is on disk (and, for a cohort,
        # the next process is running: stopping it is part of the test)
        assert proc.poll() is None, f"finished before it could be stopped:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    if stop == "Ctrl-C":
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole process group
    else:
        proc.send_signal(signal.SIGKILL if stop == "SIGKILL" else signal.SIGINT)
    assert proc.wait(timeout=120) == STOPS[stop], log.read_text()
    deadline = time.monotonic() + 20  # a killed parent's children die with it (PDEATHSIG)
    while _processes_using(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_using(out) == [], "orphans left running"
    kept = read_records(out, case["table"])
    full = read_records(ref, case["table"])
    assert 0 < len(kept) < len(full), "the stop should fall between the first and the last unit"
    if stop != "SIGKILL":
        text = log.read_text()
        assert "stopped by SIGINT" in text and "rerun the same command to resume" in text, text
        assert not list(out.rglob(".*.tmp")) and not list((out / ".tmp").rglob("rows.parquet"))
    if name == "cohort" and stop != "SIGKILL":
        st = read_records(out, "cohort_processes")
        assert "interrupted" in set(st["status"]), st[["process", "status"]]
        assert set(st[st["status"] == "ok"]["process"]) == set(kept["process"])
    res = subprocess.run([sys.executable, "-m", "stateremat", "report", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 1 and "have no complete rows" in res.stderr, res.stderr

    _finish(case, out, ref, log)  # resume
    got, want = _rows(out, case), _rows(ref, case)
    assert len(got) == len(want) and sorted(got.columns) == sorted(want.columns)
    pd.testing.assert_frame_equal(got[sorted(got.columns)], want[sorted(want.columns)],
                                  check_dtype=False)
    assert not list(out.rglob(".*.tmp")) and not (out / ".tmp").exists()  # no leftovers
    if name == "moco":  # the per-image score files too, byte for byte
        for f in sorted((ref / "scores").rglob("*.npy")):
            assert (out / f.relative_to(ref)).read_bytes() == f.read_bytes()
    res = subprocess.run([sys.executable, "-m", "stateremat", "report", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
