"""The planner on large or tampered cards (issue 16, kinds 8 and 9).

Long plans report progress and warn when the frontier grows past FRONTIER_WARN_POINTS (with
the two ways out: a frontier cap or the MILP); a card cannot change after validation, and a
value forced in anyway is refused before planning instead of giving a silently wrong plan.
"""
from __future__ import annotations

import dataclasses
import warnings

import pytest
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.contract import OptionCost, ProfileCardError, save_card
from stateremat.planner import FRONTIER_WARN_POINTS, FrontierWarning, joint, plan, random_card

#: 50 random segments without bound pruning: the exact frontier passes 10,000 points (0.3 s).
WIDE = dict(n=50, seed=1, budget="100GiB")


def test_progress_reports_every_segment_of_every_pass():
    card = random_card(40, 0)
    calls = []
    res = plan(card, "40MiB", progress=lambda *a: calls.append(a))
    assert res.feasible
    stages = list(dict.fromkeys(c[0] for c in calls))
    for stage in stages:  # each pass counts its segments 1..n in order
        done = [c[1] for c in calls if c[0] == stage]
        assert done == list(range(1, 41)) and {c[2] for c in calls if c[0] == stage} == {40}
    assert stages[0].startswith("incumbent 1/3: beam of 32") and stages[1].startswith("exact 1/3")
    assert all(c[3] >= 1 for c in calls)  # the frontier size after that segment
    # fixed methods have no passes
    plan(card, "40MiB", "eager", progress=lambda *a: pytest.fail("called"))


def test_a_frontier_past_the_threshold_warns_once_with_the_ways_out():
    card = random_card(WIDE["n"], WIDE["seed"])
    with pytest.warns(FrontierWarning, match=r"holds 1\d,\d{3} points after segment \d+ of 50"
                      ) as rec:
        res = plan(card, WIDE["budget"], bound_pruning=False)
    assert res.frontier_size > FRONTIER_WARN_POINTS and len(rec) == 1
    assert "frontier_cap=1000" in str(rec[0].message) and "stateremat.planner.milp" in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a capped plan stays quiet
        assert plan(card, WIDE["budget"], bound_pruning=False, frontier_cap=1000).truncated


def test_plan_cli_prints_the_frontier_warning_as_it_happens(tmp_path):
    path = save_card(random_card(WIDE["n"], WIDE["seed"]), tmp_path / "card.json")
    res = CliRunner().invoke(app, ["plan", str(path), "--budget", WIDE["budget"],
                                   "--no-bound-pruning"])
    assert res.exit_code == 0, res.output
    assert "warning: stateremat.planner: the exact plan's Pareto frontier holds" in res.output
    assert "--frontier-cap 1000" in res.output and "UserWarning" not in res.output


def test_plan_budget_zero_is_refused_like_bench_and_cohort(tmp_path):
    path = save_card(random_card(3, 0), tmp_path / "card.json")
    for cmd in (["plan", str(path)], ["bench", "fair", "--out", str(tmp_path / "b")],
                ["cohort", "processes", "--experiment", "fair44", "--processes", "1",
                 "--out", str(tmp_path / "c")]):
        res = CliRunner().invoke(app, [*cmd, "--budget", "0"])
        assert res.exit_code == 2 and "--budget must be positive, got '0'" in res.output


def test_a_built_card_cannot_be_changed():
    card = random_card(3, 0)
    with pytest.raises(AttributeError):
        card.segments.append(card.segments[0])  # a tuple
    with pytest.raises(TypeError):
        card.segments[0].options["eager"] = OptionCost(1, 1, 1.0)  # read-only options
    with pytest.raises(dataclasses.FrozenInstanceError):
        card.segments[0].options["eager"].retained_bytes = -999_951_541_248
    with pytest.raises(dataclasses.FrozenInstanceError):
        card.persistent_bytes = -1


def test_a_value_forced_in_after_validation_is_refused_before_planning():
    card = random_card(3, 0)
    good = joint(card, "1GiB")
    kept = card.segments[1].options["eager"].retained_bytes
    # what the issue saw: a negative size planned into a negative peak that "fits"
    object.__setattr__(card.segments[1].options["eager"], "retained_bytes", -999_951_541_248)
    with pytest.raises(ProfileCardError, match=r"segment .seg1.\.options\.eager\.retained_bytes: "
                                               r"expected a non-negative integer "
                                               r"number of bytes, got -999951541248"):
        joint(card, "1GiB")
    object.__setattr__(card.segments[1].options["eager"], "retained_bytes", kept)
    assert joint(card, "1GiB").options == good.options
    # a duplicate segment forced into the tuple: refused, naming both indices
    object.__setattr__(card, "segments", card.segments + (card.segments[0],))
    with pytest.raises(ProfileCardError, match=r"duplicate name \(segments\[0\] and segments\[3\]\)"):
        plan(card, "1GiB", "eager_whole")
