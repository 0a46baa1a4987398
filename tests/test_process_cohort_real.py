"""A tiny *real* independent-process cohort (fair44, cpu preset, 2 processes, 1 warmup, 2
steps): the runtime executes every method in fresh interpreters, the report recomputes the
summary from the raw rows, checked here against an independent pandas recomputation."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.paper.records import read_records

pytest.importorskip("torch")


@pytest.mark.slow
def test_report_on_a_tiny_real_fair44_cohort(tmp_path):
    from stateremat.paper.bench import experiment_spec
    from stateremat.paper.cohort import run_process_cohort
    from stateremat.paper.bench._spec import resolve_budget

    res = run_process_cohort(tmp_path, "fair44", 2, warmups=1, steps=2, jobs=2, progress=False)
    st = read_records(tmp_path, "cohort_processes")
    assert res["ok"] == 2, st[["process", "status", "stderr_tail"]].to_string()
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "summary.json").read_text())
    rows = read_records(tmp_path, "cohort_timing")
    spec = experiment_spec("fair44", "cpu")
    [cell] = spec.cells
    assert set(rows["method"]) == set(cell.methods) and s["n_processes"] == 2
    # one frozen card for the whole cohort: every row planned on it
    config = json.loads((tmp_path / "cohort_timing.json").read_text())["config"]
    assert set(rows["profile_hash"]) == {config["profile"][cell.name]} and s["profile_frozen"]
    # the budget is the paper's budget / eager-peak ratio on the frozen card, the same everywhere
    from stateremat.contract import load_card
    from stateremat.planner import eager_fraction_budget

    budget = eager_fraction_budget(load_card(tmp_path / "profile" / f"{cell.name}.json"), 44 / 46.063)
    assert config["cells"][0]["budget_bytes"] == budget and set(rows["budget_bytes"]) == {budget}
    cell = resolve_budget(cell, load_card(tmp_path / "profile" / f"{cell.name}.json"))
    # independent recomputation of Table 7 from the raw rows
    for m in s["methods"]:
        g = rows[(rows["method"] == m["method"]) & rows["feasible"].astype(bool)]
        if g.empty:
            assert m["mean_step_time_s"] is None and m["fits"] == 0
            continue
        assert len(g) == 2 * 2  # processes x measured steps
        per_proc = g.groupby("process")["step_time_s"].mean()
        assert m["mean_step_time_s"] == pytest.approx(per_proc.mean(), rel=1e-12)
        assert m["fits"] == int(g.groupby("process")["fits_budget"].all().sum())
        assert (g["peak_bytes"] <= cell.budget_bytes).all() == (m["fits"] == 2)
    [c] = s["comparisons"]
    assert c["comparison"] == "joint/eager_whole" and c["confidence_level"] == 0.975
    # at that budget both planners admit a policy (sizes on the card are exact byte counts)
    assert rows[rows["method"].isin(["joint", "eager_whole"])]["feasible"].astype(bool).all()
    t = rows[rows["feasible"].astype(bool)].groupby(["method", "process"])["step_time_s"].mean()
    ratios = (t["joint"] / t["eager_whole"]).to_numpy()
    assert c["time_ratio"] == pytest.approx(math.exp(np.log(ratios).mean()), rel=1e-12)
    assert c["ci"][0] <= c["time_ratio"] <= c["ci"][1]
    for f in ("figure1.png", "figure1.svg", "figure3.png", "figure3.svg", "cohort.md"):
        assert (tmp_path / f).stat().st_size > 0
