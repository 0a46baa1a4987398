"""Finite but extreme cards plan or are refused cleanly; hostile card files name the file
(issue 27, item 3 and "Planner and cards").

A card's times may be any finite float (up to 1.8e308), so their sums — and the DP's Lagrangian
products — overflow. The planner's tables then hold the times divided by a power of two (exact),
every solver optimises those same numbers, and a reported time past float range is ``inf``.
"""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from stateremat.cli import app
from stateremat.contract import ProfileCard, ProfileCardError, load_card, save_card
from stateremat.planner import cost_tables, exhaustive, milp, plan, random_card

runner = CliRunner()


def _scaled(card: ProfileCard, factor: float, fixed: float | None = None) -> ProfileCard:
    d = card.to_dict()
    for s in d["segments"]:
        for o in s["options"].values():
            o["time_s"] = fixed if fixed is not None else o["time_s"] * factor
    return ProfileCard.from_dict(d)


@pytest.mark.parametrize("peak", ["eq3", "chain"])
@pytest.mark.parametrize("planner", ["joint", "eager_whole", "state_agnostic"])
def test_every_time_1e308_plans_with_an_infinite_predicted_time(planner, peak):
    card = _scaled(random_card(6, 1), 1.0, fixed=1e308)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow RuntimeWarning from the solvers either
        res = plan(card, 10**15, planner, peak=peak)
        ex = exhaustive(card, 10**15, planner, peak=peak)
        mi = milp(card, 10**15, planner, peak=peak)
    assert res.feasible and res.fits_budget and res.predicted_time_s == math.inf
    assert mi.feasible and mi.predicted_time_s == math.inf
    assert res.model_peak_bytes == ex.model_peak_bytes  # same (scaled) numbers, same tie-break
    if peak == "eq3":
        assert res.options == ex.options
    assert any("past float range" in n for n in res.notes)


def test_huge_times_keep_their_order_and_every_solver_agrees():
    # Times near float's top: the sum overflows, but the scaled tables still rank policies.
    card = _scaled(random_card(7, 3), 2.0**1000)
    tables = cost_tables(card)
    assert tables.time_scale > 1 and np.isfinite(tables.c).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for budget in ("2MiB", "3MiB", "8MiB"):
            dp, ex, mi = plan(card, budget), exhaustive(card, budget), milp(card, budget)
            assert dp.feasible == ex.feasible == mi.feasible
            if dp.feasible:
                assert dp.options == ex.options
                assert mi.predicted_time_s == pytest.approx(ex.predicted_time_s, rel=1e-9)
    # Unscaled, the same card's plan is the same policy (scaling by a power of two is exact).
    small = random_card(7, 3)
    for budget in ("2MiB", "3MiB", "8MiB"):
        assert plan(card, budget).options == plan(small, budget).options


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(2, 6), shift=st.integers(0, 3),
       frac=st.floats(0.3, 1.2), peak=st.sampled_from(["eq3", "chain"]))
def test_dp_matches_exhaustive_on_cards_whose_time_sums_overflow(seed, n, shift, frac, peak):
    base = random_card(n, seed)
    top = max(c.time_s for s in base.segments for c in s.options.values())
    card = _scaled(base, 1.7e308 / top / 2.0**shift)  # the largest time 1.7e308 / 2^shift
    eager_peak = plan(base, 2**53, "eager", peak=peak).predicted_peak_bytes
    budget = max(1, int(frac * eager_peak))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp, ex = plan(card, budget, peak=peak), exhaustive(card, budget, peak=peak)
    assert dp.feasible == ex.feasible
    if dp.feasible:
        assert dp.predicted_peak_bytes == ex.predicted_peak_bytes
        assert cost_tables(card).c.sum() > 0  # (scaled tables are finite)
        assert dp.options == ex.options or (peak == "chain" and dp.model_time_s == ex.model_time_s)


def test_cli_plans_a_card_of_1e308_times_and_writes_null_time(tmp_path):
    path = save_card(_scaled(random_card(5, 2), 1.0, fixed=1e308), tmp_path / "card.json")
    out = tmp_path / "plan.json"
    res = runner.invoke(app, ["plan", str(path), "--budget", "1000TiB", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "internal error" not in res.output
    assert json.loads(out.read_text())["predicted_time_s"] is None  # inf is not JSON


def test_load_card_on_a_5001_digit_integer_names_the_file(tmp_path):
    path = tmp_path / "digits.json"
    path.write_text("1" * 5001)
    with pytest.raises(ProfileCardError, match=r"digits\.json.*cannot read.*4300 digits"):
        load_card(path)
    # the same number inside a real card
    d = random_card(2, 0).to_dict()
    d["persistent_bytes"] = 12345
    path.write_text(json.dumps(d).replace("12345", "9" * 5001))
    with pytest.raises(ProfileCardError, match=r"digits\.json.*Tip: a card's numbers"):
        load_card(path)


def test_load_card_given_a_huge_integer_instead_of_a_path():
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        huge = int("1" * 5001)
    finally:
        sys.set_int_max_str_digits(old)
    with pytest.raises(TypeError, match=r"expected a file path \(str or os.PathLike\), got int"):
        load_card(huge)


def test_a_segment_name_with_a_lone_surrogate_is_refused_naming_the_file(tmp_path):
    d = random_card(3, 0).to_dict()
    d["segments"][1]["name"] = "blk\ud800"
    path = tmp_path / "sur.json"
    path.write_text(json.dumps(d))  # json escapes it as \ud800: valid JSON, invalid text
    with pytest.raises(ProfileCardError, match=r"sur\.json.*segment name.*lone surrogate at index 3"):
        load_card(path)
    res = runner.invoke(app, ["plan", str(path), "--budget", "1GiB"])
    assert res.exit_code == 2 and "lone surrogate" in res.output
    assert "per segment" not in res.output  # nothing half-printed


def test_a_lone_surrogate_in_card_meta_is_refused(tmp_path):
    d = random_card(2, 0).to_dict()
    d["meta"] = {"device": {"name\udfff": "cpu"}}
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileCardError, match=r"meta\.json.*meta: expected valid Unicode text"):
        load_card(path)
