"""Independent-process cohort runner: resume after a killed process, Dask executor, report.

The timing rows here come from a *fake* worker script (test fixture, clearly not a
measurement) so the runner's process handling is tested in seconds; the real runtime is
exercised by tests/test_process_cohort_real.py.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.contract import ProfileCard
from stateremat.paper.records import RecordsError, read_records
from stateremat.paper.cohort._process_cohort import method_order, run_process_cohort

FAKE_WORKER = textwrap.dedent('''
    """Fake cohort worker (tests only): deterministic rows, optional self-kill."""
    import os, signal, sys
    from types import SimpleNamespace
    from stateremat.paper.cohort._process_cohort import worker_main

    BASE_S = {"eager": 0.5, "regions": 1.2, "eager_whole": 1.0, "joint": 0.8}
    PEAK = {"eager": 300, "regions": 100, "eager_whole": 190, "joint": 180}

    def fake_spec(experiment, preset):
        cell = SimpleNamespace(name="large_sparse", methods=list(BASE_S), budget_bytes=200,
                               warmups=3, steps=20)
        return SimpleNamespace(name=experiment, cells=[cell])

    def fake_runner(spec, cell, methods, *, warmups, steps, device="cpu", order=None,
                    progress=False, card=None):
        p = int(sys.argv[sys.argv.index("--process") + 1])
        marker = os.environ.get("FAKE_KILL_MARKER")
        if marker and p == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # a crashed process: no rows
        if os.environ.get("FAKE_STOP_PARENT") and p == 0:
            os.kill(os.getppid(), int(os.environ["FAKE_STOP_PARENT"]))  # Ctrl-C / SIGTERM to the runner
        rows = []
        for m in methods:
            for s in range(steps):
                t = BASE_S[m] * (1 + 0.01 * p) if m == "joint" else BASE_S[m]
                rows.append({"cell": cell.name, "method": m, "step": s,
                             "step_time_s": t * (1 + 0.001 * s), "peak_bytes": PEAK[m],
                             "fits_budget": PEAK[m] <= cell.budget_bytes, "feasible": True,
                             "policy": None, "semantic_checks": "pass",
                             "predicted_peak_bytes": PEAK[m], "predicted_time_s": t,
                             "profile_hash": card.source_hash() if card else "none",
                             "source_hash": "fakesource",
                             "memory_method": "fake"})
        return rows

    if __name__ == "__main__":
        sys.exit(worker_main(sys.argv[1:], cell_runner=fake_runner, spec_fn=fake_spec))
''')


@pytest.fixture()
def fake(tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    spec = importlib.util.spec_from_file_location("fake_worker", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, [sys.executable, str(script)]


CARD = {"schema_version": 1, "persistent_bytes": 10, "meta": {"note": "hand-written test card"},
        "segments": [{"name": "seg0", "options": {
            "eager": {"retained_bytes": 8, "temp_bytes": 0, "time_s": 0.1},
            "whole": {"retained_bytes": 2, "temp_bytes": 4, "time_s": 0.2}}}]}


def fake_profiles(spec, out_dir, device, profile_dir):
    """Freezes the hand-written card as ``freeze_profiles`` would (``report`` checks it)."""
    (Path(out_dir) / "profile").mkdir(parents=True, exist_ok=True)
    for c in spec.cells:
        (Path(out_dir) / "profile" / f"{c.name}.json").write_text(json.dumps(CARD))
    return {c.name: json.dumps(CARD) for c in spec.cells}


def _run(out, fake, n, **kw):
    mod, cmd = fake
    return run_process_cohort(out, "fair44", n, warmups=1, steps=2, worker_cmd=cmd,
                              spec_fn=mod.fake_spec, profile_fn=fake_profiles, progress=False,
                              **kw)


def test_killed_process_is_recorded_and_rerun_on_resume_finished_ones_never_redone(
        tmp_path, fake, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("FAKE_KILL_MARKER", str(tmp_path / "killed-once"))
    first = _run(out, fake, 3, jobs=2)
    assert first["ok"] == 2 and first["failed"] == [1]
    st = read_records(out, "cohort_processes")
    bad = st[st["process"] == 1].iloc[0]
    assert bad["status"] == "failed" and bad["exit_code"] == -9  # SIGKILL
    assert bad["stderr_tail"].endswith("killed by signal 9")
    assert sorted(read_records(out, "cohort_timing")["process"].unique()) == [0, 2]
    parts_before = sorted((out / "cohort_timing").glob("part-*.parquet"))

    second = _run(out, fake, 3, jobs=2)
    assert second == {"out_dir": str(out), "processes": 3, "already_done": 2, "ran": 1, "ok": 1,
                      "failed": [], "interrupted": None, "stopped": [], "not_started": 0}
    rows = read_records(out, "cohort_timing")
    assert sorted(rows["process"].unique()) == [0, 1, 2]
    assert len(rows) == 3 * 4 * 2  # processes x methods x steps, each kept once
    assert set(rows[rows["process"] == 1]["attempt"]) == {2}
    assert set(parts_before) < set((out / "cohort_timing").glob("part-*.parquet"))
    st = read_records(out, "cohort_processes")
    assert st.groupby("process").size().to_dict() == {0: 1, 1: 2, 2: 1}  # every attempt kept
    assert _run(out, fake, 3)["ran"] == 0
    assert _run(out, fake, 4)["ran"] == 1  # extended after results: the records say so
    assert sorted(read_records(out, "cohort_processes")["requested_processes"].unique()) == [3, 4]
    # each process ran every method in its own recorded, seeded order
    for p, g in rows.groupby("process"):
        order = g.sort_values("order_index").drop_duplicates("method")["method"].tolist()
        assert order == method_order(list(fake[0].BASE_S), 0, p)


def test_resume_with_other_options_is_refused(tmp_path, fake):
    out = tmp_path / "run"
    _run(out, fake, 1)
    with pytest.raises(RecordsError, match="config"):
        run_process_cohort(out, "fair44", 1, warmups=1, steps=3, worker_cmd=fake[1],
                           spec_fn=fake[0].fake_spec, profile_fn=fake_profiles, progress=False)


def test_method_order_is_a_seeded_permutation():
    ms = ["eager", "whole", "regions", "functional", "state_agnostic", "eager_whole", "joint"]
    orders = [method_order(ms, 0, p) for p in range(10)]
    assert all(sorted(o) == sorted(ms) for o in orders)
    assert orders[3] == method_order(ms, 0, 3) and len({tuple(o) for o in orders}) > 5


def test_report_recomputes_summary_and_figures_from_raw_rows(tmp_path, fake):
    out = tmp_path / "run"
    _run(out, fake, 3, jobs=2)
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    [c] = s["comparisons"]
    assert c["comparison"] == "joint/eager_whole"
    # joint/eager_whole = 0.8 (1 + 0.01 p) per process (step factors cancel): geometric mean
    want = 0.8 * math.prod(1 + 0.01 * p for p in range(3)) ** (1 / 3)
    assert c["time_ratio"] == pytest.approx(want, rel=1e-9)
    assert c["ci"][0] <= c["time_ratio"] <= c["ci"][1]
    assert c["ci"] == pytest.approx([0.8, 0.8 * 1.02])  # 3 processes: [min, max] (see test_stats)
    assert c["peak_ratio"] == pytest.approx(180 / 190) and c["peak_ci"] == [c["peak_ratio"]] * 2
    assert c["fits"] == {"joint": 3, "eager_whole": 3} and c["confidence_level"] == 0.975
    eager = next(r for r in s["methods"] if r["method"] == "eager")
    assert eager["fits"] == 0 and eager["mean_step_time_s"] == pytest.approx(0.5 * 1.0005)
    for f in ("figure1.png", "figure1.svg", "figure3.png", "figure3.svg", "cohort.md",
              "processes.md"):
        assert (out / f).stat().st_size > 0, f
    md = (out / "cohort.md").read_text()
    assert "OOM" not in md and "over budget" in md and "{n}" not in md
    assert "3 completed independent processes (launches asked for N = 3)" in md
    assert "arithmetic mean of the 3 process means" in md
    assert "| Eager | 500.25 | 0.293 | 0/3 | 3/3 |" in md
    # every process planned on the one frozen card, passed to it by the parent
    assert s["profile_frozen"] is True and s["profile_hashes"] == [ProfileCard.from_dict(CARD).source_hash()]


def test_cli_rejects_bad_input_and_report_needs_records(tmp_path):
    r = CliRunner().invoke(app, ["cohort", "processes", "--experiment", "fair45",
                                 "--processes", "2", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "fair44" in r.output
    r = CliRunner().invoke(app, ["cohort", "processes", "--experiment", "fair44",
                                 "--processes", "0", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--processes must be >= 1" in r.output
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(app, ["report", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "holds no records" in r.output


@pytest.mark.dist
def test_dask_local_cluster_executor(tmp_path, fake):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, host="127.0.0.1") as cluster:
        res = _run(tmp_path / "run", fake, 2, dask_address=cluster.scheduler_address)
    assert res["ok"] == 2 and res["failed"] == []
    st = read_records(tmp_path / "run", "cohort_processes")
    assert set(st["executor"]) == {"dask"} and set(st["status"]) == {"ok"}
    rows = read_records(tmp_path / "run", "cohort_timing")
    assert sorted(rows["process"].unique()) == [0, 1]
    # each task launched its own fresh interpreter (not the parent, not a shared worker)
    assert rows.groupby("process")["pid"].nunique().eq(1).all() and rows["pid"].nunique() == 2
    assert os.getpid() not in set(rows["pid"])


BUDGET_WORKER = textwrap.dedent('''
    """Fake cohort worker (tests only): echoes the budget each cell was planned under."""
    import sys
    from stateremat.paper.cohort._process_cohort import worker_main

    def echo_runner(spec, cell, methods, *, warmups, steps, device="cpu", order=None,
                    progress=False, card=None):
        return [{"cell": cell.name, "method": m, "step": 0, "step_time_s": 1.0,
                 "peak_bytes": cell.budget_bytes, "budget_bytes": cell.budget_bytes,
                 "fits_budget": True, "feasible": True,
                 "policy": None, "semantic_checks": "pass", "predicted_peak_bytes": 0,
                 "predicted_time_s": 1.0, "source_hash": "x",
                 "profile_hash": card.source_hash() if card else "none",  # as a real worker
                 "memory_method": "fake"} for m in methods]

    if __name__ == "__main__":
        sys.exit(worker_main(sys.argv[1:], cell_runner=echo_runner))
''')


def test_budget_override_reaches_the_config_and_every_process(tmp_path):
    script = tmp_path / "budget_worker.py"
    script.write_text(BUDGET_WORKER)
    budget = 46 * 2**20
    out = tmp_path / "c"
    res = run_process_cohort(out, "fair44", 2, warmups=0, steps=1,
                             worker_cmd=[sys.executable, str(script)],
                             profile_fn=fake_profiles, budget_bytes=budget, progress=False)
    assert res["ok"] == 2
    config = json.loads((out / "cohort_timing.json").read_text())["config"]
    assert [c["budget_bytes"] for c in config["cells"]] == [budget]
    rows = read_records(out, "cohort_timing")
    assert set(rows["peak_bytes"]) == {budget} and set(rows["process"]) == {0, 1}
    # resuming with another budget is refused, naming what differs
    with pytest.raises(RecordsError, match=r"cells\[0\]\.budget_bytes: 48234496 -> 50331648"):
        run_process_cohort(out, "fair44", 2, warmups=0, steps=1,
                           worker_cmd=[sys.executable, str(script)], profile_fn=fake_profiles,
                           budget_bytes=budget + 2**21, progress=False)
    # a process whose rows were planned under another budget makes the report refuse
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stateremat.paper.report._cohort import cohort_summary

    cohort_summary(out)  # consistent rows: fine
    part = sorted((out / "cohort_timing").glob("part-*.parquet"))[-1]
    orig = pq.read_table(part)
    t = orig.to_pandas()
    t["budget_bytes"] += 1
    edited = pa.Table.from_pandas(t, preserve_index=False)  # keep the writer's note of absent columns
    edited = edited.replace_schema_metadata({**(edited.schema.metadata or {}), **(orig.schema.metadata or {})})
    pq.write_table(edited, part)
    with pytest.raises(RecordsError, match=r"'budget_bytes' = \d+, not its cell's budget_bytes"):
        cohort_summary(out)  # refused as it is read: the row's budget is not its cell's


def test_cli_rejects_an_out_path_that_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    res = CliRunner().invoke(app, ["cohort", "processes", "--experiment", "fair44",
                                   "--processes", "1", "--out", str(f)])
    assert res.exit_code == 2 and "is a file, not a folder" in res.output


@pytest.mark.parametrize("args,msg", [
    (["--timeout-s", "-5"], "--timeout-s must be > 0"),
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
])
def test_cli_rejects_bad_timeout_and_device_before_running(tmp_path, args, msg):
    res = CliRunner().invoke(app, ["cohort", "processes", "--experiment", "fair44",
                                   "--processes", "1", "--out", str(tmp_path / "o"), *args])
    assert res.exit_code == 2 and msg in res.output
    assert not (tmp_path / "o").exists()


def test_report_refuses_a_sidecar_without_config(tmp_path):
    (tmp_path / "cohort_timing").mkdir()
    import pandas as pd

    pd.DataFrame({"process": [0], "cell": ["c"], "method": ["eager"], "step": [0]}).to_parquet(
        tmp_path / "cohort_timing" / "part-x.parquet")
    (tmp_path / "cohort_timing.json").write_text('{"table": "cohort_timing"}')
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    # report judges every sidecar the same way first: no run config, nothing can be checked (exit 2)
    assert res.exit_code == 2 and "holds no run config" in (res.output + str(res.exception))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_in_process_run_re_raises_a_stop_and_gives_the_hosts_handlers_back(tmp_path, fake, monkeypatch, signum):
    """issue 27 item 6: called as a library, a stop signal is not swallowed (CohortStopped, a
    KeyboardInterrupt, carries the summary) and the host's own handlers are back afterwards."""
    from stateremat.paper.cohort import CohortStopped

    seen = []
    host = lambda s, f: seen.append(s)  # noqa: E731  the host program's own handler
    old = {s: signal.signal(s, host) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        monkeypatch.setenv("FAKE_STOP_PARENT", str(int(signum)))
        with pytest.raises(CohortStopped) as info:
            _run(tmp_path / "run", fake, 1, jobs=1)
        assert isinstance(info.value, KeyboardInterrupt) and info.value.signum == signum
        assert info.value.summary["interrupted"] == signal.Signals(signum).name
        assert signal.getsignal(signal.SIGINT) is host and signal.getsignal(signal.SIGTERM) is host
        os.kill(os.getpid(), signum)  # the host's handler runs again
        assert seen == [signum]
        monkeypatch.delenv("FAKE_STOP_PARENT")
        res = _run(tmp_path / "run", fake, 1, jobs=1)  # the rerun resumes
        assert res["interrupted"] is None and res["already_done"] + res["ok"] == 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@pytest.mark.parametrize("column, value", [("process", 77), ("attempt", 2)])
def test_timing_rows_of_an_attempt_the_run_never_recorded_are_refused(tmp_path, fake, column,
                                                                       value):
    """A timing part whose process (or attempt) has no ok status row was not written by the run:
    report exits 2 naming the part (it counted 77 as a third process of N = 2 and exited 0), and
    a rerun refuses the folder instead of keeping those rows for good."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stateremat.paper.report._cohort import cohort_summary

    out = tmp_path / "run"
    _run(out, fake, 2)
    part = next(p for p in sorted((out / "cohort_timing").glob("part-*.parquet"))
                if set(pq.read_table(p)["process"].to_pylist()) == {1})
    t = pq.read_table(part)
    t = t.set_column(t.column_names.index(column), column, pa.array([value] * t.num_rows, pa.int64()))
    pq.write_table(t, part)
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 2, res.output
    assert part.name in res.output and "Traceback" not in res.output
    assert not (out / "cohort.md").exists()
    with pytest.raises(RecordsError, match=part.name):
        cohort_summary(out, n_resamples=100)
    with pytest.raises(RecordsError, match=f"rows of process {1 if column == 'attempt' else 77}"):
        _run(out, fake, 2)
    assert len(list((out / "cohort_timing").glob("part-*.parquet"))) == 2  # nothing added
    assert pq.read_table(part)[column].to_pylist() == [value] * t.num_rows  # nor removed


def test_rows_of_an_attempt_killed_before_its_status_row_are_still_the_runs(tmp_path, fake):
    """``kill -9`` between a process's rows and its status row: those rows stay the run's own
    (report renders them, a rerun keeps them and does not redo the process)."""
    import pyarrow.parquet as pq

    out = tmp_path / "run"
    _run(out, fake, 2)
    [st1] = [p for p in (out / "cohort_processes").glob("part-*.parquet")
             if pq.read_table(p)["process"].to_pylist() == [1]]
    st1.unlink()
    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 completed independent processes" in (out / "cohort.md").read_text()
    summary = _run(out, fake, 2)
    assert summary["already_done"] == 2 and summary["ran"] == 0
