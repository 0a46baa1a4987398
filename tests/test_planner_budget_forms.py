"""Budgets as a fraction of the all-eager peak, 'fit', and auto_checkpoint planning by the chain
peak (issue 26, item 5)."""
from __future__ import annotations

import pytest

from stateremat.planner import chain_peak_bytes, exhaustive, milp, plan, random_card


@pytest.mark.parametrize("peak", ["eq3", "chain"])
@pytest.mark.parametrize("form", [0.6, "60%", " 60 % "])
def test_a_fraction_of_the_eager_peak_is_that_many_bytes(peak, form):
    card = random_card(6, 2)
    eager = plan(card, 2**53, "eager", peak=peak).predicted_peak_bytes
    want = round(0.6 * eager)
    for res in (plan(card, form, peak=peak), plan(card, form, "eager_whole", peak=peak),
                exhaustive(card, form, peak=peak), milp(card, form, peak=peak),
                plan(card, form, "whole", peak=peak)):
        assert res.budget_bytes == want
        assert any(f"all-eager {peak} peak" in n and f"({eager} B)" in n for n in res.notes)
    assert plan(card, form, peak=peak).options == plan(card, want, peak=peak).options


def test_the_chain_eager_peak_is_the_chain_of_all_eager():
    card = random_card(5, 7)
    assert plan(card, 1.0, peak="chain").budget_bytes == chain_peak_bytes(card, ["eager"] * 5)


@pytest.mark.parametrize("bad", ["0%", "-5%", "abc%", "1e9%", "nan%", "%"])
def test_a_bad_percentage_is_refused(bad):
    with pytest.raises(ValueError, match=r"bad budget_bytes .*percentage of the all-eager peak"):
        plan(random_card(2, 0), bad)


def test_fit_needs_a_device():
    with pytest.raises(ValueError, match=r"budget 'fit' needs a device.*auto_checkpoint"):
        plan(random_card(2, 0), "fit")


def test_a_float_above_one_is_still_bytes():
    card = random_card(3, 0)
    assert plan(card, 1e9).budget_bytes == 10**9
    with pytest.raises(ValueError, match="bad budget_bytes 1.5"):
        plan(card, 1.5)  # a fraction of a byte, not 150 %


def test_cli_takes_a_percentage_and_the_chain_peak(tmp_path):
    import json

    from typer.testing import CliRunner

    from stateremat.cli import app
    from stateremat.contract import save_card

    card = random_card(5, 3)
    path = save_card(card, tmp_path / "card.json")
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(app, ["plan", str(path), "--budget", "90%", "--peak", "chain",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    eager = chain_peak_bytes(card, ["eager"] * 5)
    assert doc["peak"] == "chain" and doc["budget_bytes"] == round(0.9 * eager)
    assert doc["predicted_peak_bytes"] == doc["chain_peak_bytes"] <= doc["budget_bytes"]
    assert "peak model" in res.output
    bad = CliRunner().invoke(app, ["plan", str(path), "--budget", "1GiB", "--peak", "max"])
    assert bad.exit_code == 2 and "--peak must be one of ['eq3', 'chain']" in bad.output
    fit = CliRunner().invoke(app, ["plan", str(path), "--budget", "fit"])
    assert fit.exit_code == 2 and "--budget fit needs the device" in fit.output
    pct = CliRunner().invoke(app, ["plan", str(path), "--budget", "0%"])
    assert pct.exit_code == 2 and "percentage of the all-eager peak" in pct.output
