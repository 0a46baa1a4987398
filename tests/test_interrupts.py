"""Interrupted, then resumed: the rows equal an uninterrupted run's (issue 16, kind 1 and "done").

Each long command runs through the real ``stateremat`` command line, in subprocesses at the
smallest sizes that still span several parts: once uninterrupted into a fresh ``--out`` (the
reference), and once into another folder that is stopped several times, each stop as soon as a
new finished unit is on disk, and rerun there after each stop: first a SIGINT to the command
only (a fresh folder), then ``kill -9`` of the resumed command, and for the cohort also Ctrl-C
to the whole process group of the run resumed after the kill. One folder per command takes
every stop kind, so the commands are launched once per stop and once to finish, not twice per
stop. Each stopped command must exit non-zero having kept its finished rows (more than at the
stop before, fewer than the reference's), leave no process running and, once resumed, no
temporary file; the resumed rows must equal the reference's in count, keys and every
deterministic field (times, load, pids, timestamps and attempt counters differ by nature).

The reference runs while the stops are made (two cores); where the stopped runs plan on its
frozen profile cards, they wait until those are final (a cohort's sidecar is written, a bench's
run is done).
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

from _cli import run_cli
from stateremat.paper.records import read_records

pytest.importorskip("torch")

#: Fields that differ between any two runs (measured time, machine load, process ids, clocks,
#: retries): everything else must be equal.
NONDETERMINISTIC = {"step_time_s", "loadavg", "pid", "process_wall_s", "encoder_time_s",
                    "elapsed_s", "created_utc", "attempt", "hostname"}

#: Stops of each command's folder, in order: SIGINT of a fresh run, then kill -9 of the resumed
#: one (and Ctrl-C after that for the cohort, which has a unit per stop and one more).
TWO_STOPS = ("SIGINT", "SIGKILL")
CASES = {
    "verify": dict(argv=["verify", "finite", "--programs", "1000"], table="finite",
                   key=["suite", "seed", "program", "check"], stops=TWO_STOPS),
    "semantics": dict(argv=["cohort", "semantics", "--seeds", "0:1", "--no-progress"],
                      table="semantics", key=["backend", "method", "family", "seed", "dtype"],
                      stops=TWO_STOPS),
    "bench": dict(argv=["bench", "pressure", "--preset", "tiny", "--warmups", "0", "--steps", "1"],
                  table="bench", key=["cell", "method", "step"], frozen="cards", stops=TWO_STOPS),
    "moco": dict(argv=["app", "moco", "--preset", "tiny", "--seeds", "2701:2702",
                       "--methods", "eager,whole,regions"], table="moco", key=["seed", "method"],
                 stops=TWO_STOPS),
    "cohort": dict(argv=["cohort", "processes", "--experiment", "fair44", "--preset", "tiny",
                         "--processes", "4", "--jobs", "1", "--warmups", "0", "--steps", "1"],
                   table="cohort_timing", key=["process", "cell", "method", "step"],
                   frozen="profile", stops=("SIGINT", "SIGKILL", "Ctrl-C")),
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


def _wait_ok(proc: subprocess.Popen, log: Path) -> None:
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


def _parts(out: Path, case: dict) -> set[str]:
    return {p.name for p in (out / case["table"]).glob("part-*.parquet")}


def _started(out: Path, case: dict, before: set[str]) -> bool:
    """A unit finished since the launch (a part not among ``before``) and, for a cohort, the
    next process is running (its work folder exists: a finished one's is gone before its part
    is written): stopping it is part of the test."""
    if not _parts(out, case) - before:
        return False
    return case["table"] != "cohort_timing" or any((out / ".tmp" / "cohort").glob("*"))


def _rows(out: Path, case: dict) -> pd.DataFrame:
    df = read_records(out, case["table"])
    assert not df.duplicated(case["key"]).any()  # every unit once
    df = df.drop(columns=[c for c in NONDETERMINISTIC if c in df])
    df = df.astype(object).where(df.notna(), None)  # a part's all-null column reads as None or NaN
    return df.sort_values(case["key"]).reset_index(drop=True)


class Reference:
    """The uninterrupted run of one command, launched once and waited for when needed."""

    def __init__(self, name: str, root: Path):
        self.case, self.out, self.log = CASES[name], root / "run", root / "log.txt"
        self.proc = _launch(self.case, self.out, None, self.log)

    def wait(self) -> Path:
        _wait_ok(self.proc, self.log)
        return self.out

    def frozen(self) -> Path:
        """The folder, once the profile cards the stopped runs plan on are final: a cohort's
        when its sidecar is written (the cards are frozen before it); a bench's per-cell cards
        only when it is done."""
        if self.case.get("frozen") != "profile":
            return self.wait() if self.case.get("frozen") else self.out
        deadline = time.monotonic() + 300
        while not (self.out / f"{self.case['table']}.json").exists() and self.proc.poll() is None:
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)
        assert self.proc.poll() in (None, 0), self.log.read_text()
        return self.out


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    made: dict[str, Reference] = {}

    def get(name: str) -> Reference:
        if name not in made:
            made[name] = Reference(name, tmp_path_factory.mktemp(f"ref-{name}"))
        return made[name]

    yield get
    for ref in made.values():  # a failed test leaves none running
        if ref.proc.poll() is None:
            os.killpg(ref.proc.pid, signal.SIGKILL)
            ref.proc.wait()


def _stop_once(case: dict, out: Path, ref: Path, log: Path, stop: str) -> int:
    """Launch the command into ``out``, stop it with ``stop`` once a new unit is on disk and
    check what the stop left; returns the number of rows kept."""
    before = _parts(out, case)
    proc = _launch(case, out, ref, log)
    deadline = time.monotonic() + 300
    while not _started(out, case, before):
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
        time.sleep(0.05)
    assert _processes_using(out) == [], "orphans left running"
    # the stop came as a cohort process started, so no process's rows can be on disk: a killed
    # parent's child that ran on to the end (in under 20 s: tiny) left them in its work folder
    assert not list((out / ".tmp").rglob("rows.parquet")), "a process outlived its parent"
    kept = read_records(out, case["table"])
    if stop != "SIGKILL":
        text = log.read_text()
        assert "stopped by SIGINT" in text and "rerun the same command to resume" in text, text
        assert not list(out.rglob(".*.tmp"))
    if case["table"] == "cohort_timing" and stop != "SIGKILL":
        st = read_records(out, "cohort_processes")
        assert "interrupted" in set(st["status"]), st[["process", "status"]]
        assert set(st[st["status"] == "ok"]["process"]) == set(kept["process"])
    res = run_cli("report", out, "--out", log.with_suffix(".report"))  # in process: --out, so
    # it holds no lock on the run folder (a report into the folder locks it for its lifetime)
    assert res.exit_code == 1 and "have no complete rows" in res.output, res.output
    return len(kept)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_stopped_at_each_kind_then_resumed_run_equals_an_uninterrupted_one(references, tmp_path,
                                                                           name):
    case, reference = CASES[name], references(name)
    ref = reference.frozen()
    out = tmp_path / "run"
    kept = []
    for i, stop in enumerate(case["stops"]):
        kept.append(_stop_once(case, out, ref, tmp_path / f"log-{i}-{stop}.txt", stop))
    log = tmp_path / "log-resume.txt"
    _wait_ok(_launch(case, out, ref, log), log)  # resume to the end
    full = len(read_records(reference.wait(), case["table"]))
    assert 0 < kept[0] and kept == sorted(set(kept)) and kept[-1] < full, \
        f"each stop should keep more rows than the one before and fewer than all: {kept} of {full}"
    got, want = _rows(out, case), _rows(ref, case)
    assert len(got) == len(want) and sorted(got.columns) == sorted(want.columns)
    pd.testing.assert_frame_equal(got[sorted(got.columns)], want[sorted(want.columns)],
                                  check_dtype=False)
    assert not list(out.rglob(".*.tmp")) and not (out / ".tmp").exists()  # no leftovers
    if name == "moco":  # the per-image score files too, byte for byte
        for f in sorted((ref / "scores").rglob("*.npy")):
            assert (out / f.relative_to(ref)).read_bytes() == f.read_bytes()
    res = run_cli("report", out, "--out", tmp_path / "report")
    assert res.exit_code == 0, res.output
