"""auto_checkpoint plans by the chain peak by default, reports both peaks, takes fractions of the
eager peak and 'fit', and says the least feasible and all-eager peaks when nothing fits (issue 26)."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from stateremat.planner import chain_peak_bytes, plan
from stateremat.torch import auto_checkpoint, expected_peak_bytes, profile


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 256), *[nn.Sequential(nn.Linear(256, 256), nn.BatchNorm1d(256), nn.Tanh())
                                              for _ in range(4)], nn.Linear(256, 2))


X = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))


def _wrapped(model):
    return {n for n, m in model.named_modules() if "forward" in vars(m)}


def test_chain_is_the_default_and_both_peaks_are_reported():
    model = _mlp()
    res = auto_checkpoint(model, "97%", sample=X, repeats=1)
    card = res.card
    assert res.peak == "chain" and res.predicted_peak_bytes == res.chain_peak_bytes
    assert res.chain_peak_bytes == expected_peak_bytes(card, res.options) == chain_peak_bytes(card, res.options)
    costs = [s.options[o] for s, o in zip(card.segments, res.options)]
    assert res.bound_peak_bytes == card.persistent_bytes + sum(c.retained_bytes for c in costs) \
        + max(c.temp_bytes for c in costs)
    eager = chain_peak_bytes(card, ["eager"] * len(card.segments))
    assert res.budget_bytes == round(0.97 * eager) and res.chain_peak_bytes <= res.budget_bytes
    note = next(n for n in res.notes if n.startswith("planned by the chain peak"))
    assert f"({res.chain_peak_bytes} B)" in note and f"({res.bound_peak_bytes} B)" in note
    assert any("all-eager chain peak" in n for n in res.notes)
    assert _wrapped(model)  # something is checkpointed at 97 %


def test_eq3_on_request_plans_by_the_bound():
    model = _mlp()
    res = auto_checkpoint(model, 0.97, sample=X, repeats=1, peak="eq3")
    assert res.peak == "eq3" and res.predicted_peak_bytes == res.bound_peak_bytes <= res.budget_bytes


def test_nothing_fits_states_the_least_feasible_and_the_all_eager_peaks():
    model = _mlp()
    with pytest.raises(ValueError, match=r"no checkpoint plan fits the budget 1.00 KiB \(1024 B, chain peak\); "
                                         r"the least feasible peak is .* \((\d+) B\) with .*all-eager peaks at "
                                         r".* \((\d+) B\) as a chain, .* \((\d+) B\) by eq. \(3\)") as info:
        auto_checkpoint(model, 1024, sample=X, repeats=1)
    least, eager_chain, eager_bound = map(int, re.search(
        r"least feasible peak is .*? \((\d+) B\).*all-eager peaks at .*? \((\d+) B\) as a chain, .*? \((\d+) B\)",
        str(info.value)).groups())
    card = info.value.plan.card
    assert least == plan(card, 0, peak="chain").min_feasible_peak_bytes
    assert eager_chain == chain_peak_bytes(card, ["eager"] * len(card.segments))
    assert eager_bound == plan(card, 2**53, "eager").predicted_peak_bytes >= eager_chain
    assert not _wrapped(model)


def test_fit_plans_under_free_memory():
    model = _mlp()
    res = auto_checkpoint(model, "fit", sample=X, repeats=1)
    assert res.notes[0].startswith("budget 'fit' = ") and "available" in res.notes[0]
    eager = chain_peak_bytes(res.card, ["eager"] * len(res.card.segments))
    assert res.fits_budget and res.budget_bytes > eager  # host memory dwarfs this model
    assert res.budget_bytes >= res.card.persistent_bytes


@pytest.mark.parametrize("bad", ["abc", -1, "8 PiBs"])
def test_a_bad_size_is_refused_before_profiling(bad, monkeypatch):
    import stateremat.torch._auto as auto

    monkeypatch.setattr(auto, "profile", lambda *a, **k: pytest.fail("profiled"))
    with pytest.raises(ValueError, match=r"bad budget .*Tip: bytes, a size such as '8GiB', a fraction"):
        auto_checkpoint(_mlp(), bad, sample=X, repeats=1)


@pytest.mark.parametrize("bad", ["sixty%", "0%"])
def test_a_bad_percentage_is_refused_and_nothing_applied(bad):
    model = _mlp()
    with pytest.raises(ValueError, match=r"bad budget .*percentage of the all-eager peak"):
        auto_checkpoint(model, bad, sample=X, repeats=1)
    assert not _wrapped(model)


def test_an_unknown_peak_model_is_refused():
    with pytest.raises(ValueError, match=r"peak must be 'chain' or 'eq3', got 'bound'"):
        auto_checkpoint(_mlp(), "1GiB", sample=X, repeats=1, peak="bound")


def test_no_budget_is_an_error_not_a_default(monkeypatch):
    import stateremat.torch._auto as auto

    monkeypatch.setattr(auto, "profile", lambda *a, **k: pytest.fail("profiled"))
    model = _mlp()
    with pytest.raises(ValueError, match=r"a budget is required \(there is no default\); got none\. "
                                         r"Tip: auto_checkpoint\(model, '8GiB'"):
        auto_checkpoint(model, sample=X, repeats=1)
    with pytest.raises(ValueError, match=r"a budget is required"):
        auto_checkpoint(model, None, sample=X)
    assert not _wrapped(model)
