"""``stateremat plan``: JSON written atomically with the contract keys; bad input exits 2."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.contract import save_card
from stateremat.planner import activation_pressure_card, plan, random_card

runner = CliRunner()
KEYS = {"planner", "budget_bytes", "feasible", "options", "predicted_peak_bytes",
        "predicted_time_s", "frontier_size", "truncated", "min_feasible_peak_bytes"}


@pytest.fixture()
def card_path(tmp_path):
    return save_card(activation_pressure_card(), tmp_path / "card.json")


def test_plan_writes_json_and_prints_table(card_path, tmp_path):
    out = tmp_path / "PLAN.json"
    res = runner.invoke(app, ["plan", str(card_path), "--budget", "32GiB", "--planner", "joint",
                              "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert KEYS <= set(doc)
    ref = plan(activation_pressure_card(), 32 * 1024**3)
    assert doc["budget_bytes"] == 32 * 1024**3 and doc["feasible"] is True
    assert doc["options"] == ref.options and doc["predicted_time_s"] == ref.predicted_time_s
    assert doc["truncated"] is False and doc["card"]["source_hash"]
    assert "predicted peak" in res.output and "layer15" in res.output


def test_plan_infeasible_budget_writes_the_result_and_exits_1(card_path, tmp_path):
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["plan", str(card_path), "--budget", str(32 * 1024**3),
                              "--planner", "eager_whole", "--json", str(out), "--explain"])
    assert res.exit_code == 1, res.output
    doc = json.loads(out.read_text())  # written before the exit
    assert doc["feasible"] is False and doc["options"] is None and doc["fits_budget"] is False
    assert doc["min_feasible_peak_bytes"] == int(40.75 * 1024**3)
    assert "INFEASIBLE" in res.output
    assert "no eager_whole plan fits the budget 32.00 GiB" in res.output


def test_plan_frontier_cap_marks_truncated(tmp_path):
    path = save_card(random_card(40, 7), tmp_path / "r.json")
    out = tmp_path / "p.json"
    lo = plan(random_card(40, 7), 0).min_feasible_peak_bytes
    res = runner.invoke(app, ["plan", str(path), "--budget", str(lo * 2), "--frontier-cap", "1",
                              "--no-bound-pruning", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["truncated"] is True and doc["optimal"] is False and doc["frontier_size"] == 1


@pytest.mark.parametrize("args, match", [
    (["--budget", "32 parsecs"], "--budget: size '32 parsecs': unknown unit"),
    (["--budget", "-5"], "--budget"),
    (["--budget", "1GiB", "--planner", "fast"], "--planner 'fast' is unknown"),
    (["--budget", "1GiB", "--frontier-cap", "0"], "--frontier-cap must be >= 1 and <= 10,000,000, got 0"),
    (["--budget", "1GiB", "--frontier-cap", "99999999999999999999"], "--frontier-cap must be >= 1"),
    (["--budget", "0"], "--budget must be positive, got '0'"),  # as in bench and cohort
    (["--budget", "0GiB"], "--budget must be positive, got '0GiB'"),
])
def test_plan_bad_arguments_exit_2(card_path, args, match):
    res = runner.invoke(app, ["plan", str(card_path), *args])
    assert res.exit_code == 2
    assert match in res.output


def test_plan_bad_card_exits_2_naming_segment_and_field(tmp_path):
    d = activation_pressure_card().to_dict()
    d["segments"][4]["options"]["eager"]["temp_bytes"] = -1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    res = runner.invoke(app, ["plan", str(bad), "--budget", "32GiB", "--json",
                              str(tmp_path / "never.json")])
    assert res.exit_code == 2
    assert "segment 'layer4'.options.eager.temp_bytes" in res.output
    assert not (tmp_path / "never.json").exists()
    res = runner.invoke(app, ["plan", str(tmp_path / "missing.json"), "--budget", "1GiB"])
    assert res.exit_code == 2 and "cannot read" in res.output


@pytest.mark.parametrize("field, value", [("retained_bytes", 2**70), ("temp_bytes", 2**63)])
def test_plan_card_size_beyond_the_cap_exits_2_naming_field(tmp_path, field, value):
    d = activation_pressure_card().to_dict()
    d["segments"][2]["options"]["whole"][field] = value
    bad = tmp_path / "huge.json"
    bad.write_text(json.dumps(d))
    res = runner.invoke(app, ["plan", str(bad), "--budget", "32GiB"])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert f"segment 'layer2'.options.whole.{field}: expected at most 2^53" in res.output


def test_plan_overflow_inside_the_solver_is_a_clean_exit_2(card_path, monkeypatch):
    import stateremat.planner as planner

    def boom(*args, **kwargs):
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(planner, "plan", boom)
    res = runner.invoke(app, ["plan", str(card_path), "--budget", "32GiB"])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit)
    assert "cannot plan" in res.output and "too large" in res.output
