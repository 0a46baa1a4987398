"""plan(..., peak="chain"): the budget bounds the peak of the backward chain (issue 26, item 5).

The DP, the exhaustive enumeration and the MILP solve the chain model independently and must
agree on feasibility, least-peak and least time; the chain peak of a policy is what
``stateremat.torch.expected_peak_bytes`` gives.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from stateremat.contract import ProfileCard, ProfileCardError
from stateremat.planner import chain_peak_bytes, exhaustive, milp, plan, random_card


def _with_parts(card: ProfileCard, base: int | None, before: int, after: int) -> ProfileCard:
    d = card.to_dict()
    parts = {"before_first_segment_peak_bytes": before, "after_backward_peak_bytes": after}
    if base is not None:
        parts["first_segment_entry_bytes"] = base
    d["meta"] = {**d["meta"], "persistent": parts}
    return ProfileCard.from_dict(d)


def _chain_peak_by_hand(card: ProfileCard, options: list[str]) -> int:
    parts = card.meta.get("persistent", {})
    base = parts.get("first_segment_entry_bytes", card.persistent_bytes)
    running = top = 0
    for seg, o in zip(card.segments, options):
        running += seg.options[o].retained_bytes
        top = max(top, running + seg.options[o].temp_bytes)
    return max(base + top, parts.get("before_first_segment_peak_bytes", 0),
               parts.get("after_backward_peak_bytes", 0))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 100_000), n=st.integers(1, 6), frac=st.floats(0.2, 1.1),
       planner=st.sampled_from(["joint", "eager_whole", "state_agnostic"]),
       parts=st.booleans(), pruning=st.booleans())
def test_chain_dp_exhaustive_and_milp_agree(seed, n, frac, planner, parts, pruning):
    card = random_card(n, seed, small_ints=seed % 3 == 0)
    if parts:
        rng = np.random.default_rng(seed)
        card = _with_parts(card, int(rng.integers(0, 2 * card.persistent_bytes + 2)),
                           int(rng.integers(0, 2 * card.persistent_bytes + 2)), 0)
    eager = plan(card, 2**53, "eager", peak="chain").predicted_peak_bytes
    budget = max(1, int(frac * eager))
    dp = plan(card, budget, planner, peak="chain", bound_pruning=pruning)
    ex = exhaustive(card, budget, planner, peak="chain")
    mi = milp(card, budget, planner, peak="chain")
    assert dp.peak == ex.peak == mi.peak == "chain"
    assert dp.feasible == ex.feasible == mi.feasible
    assert dp.min_feasible_peak_bytes == ex.min_feasible_peak_bytes == mi.min_feasible_peak_bytes
    if not dp.feasible:
        assert dp.min_feasible_peak_bytes > budget or planner == "state_agnostic"
        return
    assert dp.model_time_s == ex.model_time_s  # bitwise: same left fold
    assert mi.model_time_s == pytest.approx(ex.model_time_s, rel=1e-9, abs=1e-12)
    assert dp.model_peak_bytes == ex.model_peak_bytes <= budget  # lowest peak among least time
    for res in (dp, ex, mi):
        assert res.chain_peak_bytes == _chain_peak_by_hand(card, res.options)
        assert res.predicted_peak_bytes == res.chain_peak_bytes
        assert res.chain_peak_bytes == chain_peak_bytes(card, res.options)


def test_chain_admits_a_faster_plan_than_the_bound_at_the_same_budget():
    found = 0
    for seed in range(40):
        card = random_card(6, seed)
        eager = plan(card, 2**53, "eager", peak="chain").predicted_peak_bytes
        b = int(0.7 * eager)
        c, e = plan(card, b, peak="chain"), plan(card, b)
        assert c.feasible or not e.feasible  # the chain peak never exceeds eq. 3's bound here
        if c.feasible:
            assert c.chain_peak_bytes <= c.bound_peak_bytes
            assert c.predicted_time_s <= (e.predicted_time_s if e.feasible else np.inf)
            found += (not e.feasible) or c.predicted_time_s < e.predicted_time_s
    assert found >= 5  # the tighter model matters on these cards


def test_eq3_stays_the_default_and_reports_both_peaks():
    card = random_card(5, 4)
    res = plan(card, "8MiB")
    assert res.peak == "eq3" and res.predicted_peak_bytes == res.bound_peak_bytes
    assert res.chain_peak_bytes == chain_peak_bytes(card, res.options)
    d = res.to_dict()
    assert d["peak"] == "eq3" and d["chain_peak_bytes"] == res.chain_peak_bytes


def test_outside_peaks_above_the_budget_make_the_chain_infeasible():
    card = _with_parts(random_card(4, 0), None, 0, 10**9)
    res = plan(card, 10**9 - 1, peak="chain")
    assert not res.feasible and res.min_feasible_peak_bytes == 10**9
    assert not exhaustive(card, 10**9 - 1, peak="chain").feasible
    assert not milp(card, 10**9 - 1, peak="chain").feasible


@pytest.mark.parametrize("bad", ["Chain", "bound", None, 1])
def test_an_unknown_peak_model_is_refused(bad):
    with pytest.raises(ValueError, match=r"peak must be one of \['eq3', 'chain'\], got"):
        plan(random_card(2, 0), "1GiB", peak=bad)


def test_a_bad_recorded_part_is_refused_by_name():
    card = _with_parts(random_card(2, 0), -5, 0, 0)
    with pytest.raises(ProfileCardError, match=r"meta\.persistent\.first_segment_entry_bytes: "
                                               r"expected an integer number of bytes"):
        plan(card, "1GiB", peak="chain")


def test_chain_progress_reports_its_own_pass():
    card = random_card(12, 3)
    calls = []
    res = plan(card, 0.7, peak="chain", progress=lambda *a: calls.append(a))
    assert res.feasible
    chain = [c for c in calls if c[0] == "chain, exact"]
    assert [c[1] for c in chain] == list(range(1, 13)) and {c[2] for c in chain} == {12}


def test_a_capped_chain_plan_is_truncated_and_within_budget():
    card = random_card(30, 8)
    exact = plan(card, 0.6, peak="chain")
    capped = plan(card, 0.6, peak="chain", frontier_cap=2)
    assert exact.feasible and not exact.truncated
    if capped.feasible:
        assert capped.truncated and not capped.optimal
        assert capped.chain_peak_bytes <= capped.budget_bytes
        assert capped.predicted_time_s >= exact.predicted_time_s


def test_explain_names_the_chain_model():
    card = random_card(4, 1)
    text = plan(card, 0.8, peak="chain").explain()
    assert "planned by the chain peak" in text and "eq. (3)'s bound = persistent" in text
    assert "\npeak = persistent" in plan(card, 0.8).explain()
