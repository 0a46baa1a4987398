"""Planner: Pareto DP against exhaustive enumeration and the MILP, Table 5, the controls."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from stateremat.contract import OptionCost, ProfileCard, ProfileCardError, SegmentCard
from stateremat.planner import (
    PLAN_KEYS,
    PLANNERS,
    PlanResult,
    activation_pressure_card,
    exhaustive,
    milp,
    plan,
    random_card,
)

GiB = 1024**3
DP_PLANNERS = ("joint", "eager_whole", "state_agnostic")


def _budgets(card, planner, rng, count=3):
    """Budgets from just below the planner's min peak to above all-eager (some infeasible)."""
    lo = plan(card, 0, planner).min_feasible_peak_bytes
    hi = plan(card, 0, "eager").predicted_peak_bytes
    spread = max(hi - lo, 8)
    return [int(lo) - 1, int(lo)] + [int(rng.integers(lo - spread // 8, hi + spread // 8 + 1))
                                     for _ in range(count)]


def _same(a: PlanResult, b: PlanResult):
    assert a.feasible == b.feasible, (a.to_dict(), b.to_dict())
    assert a.min_feasible_peak_bytes == b.min_feasible_peak_bytes
    assert a.options == b.options  # same optimum and the same tie-break
    assert a.predicted_time_s == b.predicted_time_s
    assert a.predicted_peak_bytes == b.predicted_peak_bytes


@pytest.mark.parametrize("seed", range(12))
def test_dp_equals_exhaustive_on_random_cards_up_to_10_segments(seed):
    rng = np.random.default_rng(seed)
    n = 10 if seed < 2 else int(rng.integers(1, 10))
    card = random_card(n, rng, small_ints=seed % 3 == 0)
    for planner in DP_PLANNERS:
        for budget in _budgets(card, planner, rng):
            ref = exhaustive(card, budget, options=planner)
            assert ref.solver == "exhaustive" and ref.optimal
            for pruning in (True, False):
                got = plan(card, budget, planner, bound_pruning=pruning)
                _same(got, ref)
                assert got.truncated is False and got.optimal and got.solver == "dp"
                if got.feasible:
                    assert got.model_peak_bytes <= budget
                    if planner != "state_agnostic":
                        assert got.fits_budget and got.predicted_peak_bytes <= budget


def test_ties_are_broken_by_cost_then_peak_then_first_policy():
    # Two identical segments with equal-cost options: every policy costs 2.0 s.
    seg = {"eager": OptionCost(4, 0, 1.0), "whole": OptionCost(1, 0, 1.0), "region": OptionCost(1, 0, 1.0)}
    card = ProfileCard(0, [SegmentCard("a", seg), SegmentCard("b", seg)])
    res = plan(card, 100)
    # All cost 2.0; lowest peak is 2 bytes (whole/region anywhere); first such policy: whole, whole.
    assert res.options == ["whole", "whole"] and res.predicted_peak_bytes == 2
    assert exhaustive(card, 100).options == res.options
    assert plan(card, 100, bound_pruning=False).options == res.options


@pytest.mark.parametrize("seed", range(3))
def test_dp_equals_milp_optimum_on_50_segments(seed):
    rng = np.random.default_rng(100 + seed)
    card = random_card(50, rng)
    for planner in DP_PLANNERS:
        lo = plan(card, 0, planner).min_feasible_peak_bytes
        hi = plan(card, 0, "eager").predicted_peak_bytes
        for budget in (lo - 1, (2 * lo + hi) // 3, (lo + 2 * hi) // 3):
            got, ref = plan(card, budget, planner), milp(card, budget, options=planner)
            assert got.feasible == ref.feasible
            assert got.min_feasible_peak_bytes == ref.min_feasible_peak_bytes
            if got.feasible:
                assert ref.optimal, ref.notes
                assert got.predicted_time_s == pytest.approx(ref.predicted_time_s, rel=1e-9)
                assert got.model_time_s == pytest.approx(ref.model_time_s, rel=1e-9)
                assert got.model_peak_bytes <= budget and ref.model_peak_bytes <= budget
                assert got.frontier_size >= 1 and not got.truncated


def _combined_memory_dp(card: ProfileCard, budget: int):
    """The UNSAFE DP: dominance on (retained + temporary, cost) only. Returns best cost or None."""
    states = [(0, 0, 0.0)]  # (retained, temp max, cost)
    for seg in card.segments:
        cand = [(r + o.retained_bytes, max(q, o.temp_bytes), c + o.time_s)
                for (r, q, c) in states for o in seg.options.values()]
        cand = [s for s in cand if card.persistent_bytes + s[0] + s[1] <= budget]
        states = [s for s in cand if not any((t[0] + t[1] <= s[0] + s[1] and t[2] <= s[2])
                                             and t != s for t in cand)]
    return min((s[2] for s in states), default=None)


def test_combined_memory_dominance_would_be_wrong():
    # Segment a: "keep" retains 4 B with no workspace; "replay" retains 0 B but needs 5 B of
    # workspace. Combined memory says keep (4) dominates replay (5) at lower cost. Segment b
    # needs 10 B of workspace anyway, which hides replay's workspace: replay + b peaks at 10 B,
    # keep + b at 14 B. At a 12 B budget only replay is feasible.
    a = SegmentCard("a", {"eager": OptionCost(4, 0, 1.0), "whole": OptionCost(0, 5, 2.0)})
    b = SegmentCard("b", {"eager": OptionCost(0, 10, 1.0), "whole": OptionCost(0, 10, 1.0)})
    card = ProfileCard(0, [a, b])
    assert _combined_memory_dp(card, 12) is None  # the unsafe rule loses the only policy
    res = plan(card, 12)
    assert res.feasible and res.options == ["whole", "eager"]
    assert res.predicted_peak_bytes == 10 and res.predicted_time_s == 3.0
    assert exhaustive(card, 12).options == res.options
    # And it can also lose the optimum while staying feasible (not just feasibility):
    assert _combined_memory_dp(card, 14) == 2.0 and plan(card, 14).predicted_time_s == 2.0


def test_table5_joint_fits_32gib_where_no_eager_whole_policy_does():
    card = activation_pressure_card(dense=False, large=True)
    joint = plan(card, "32GiB", "joint")
    ew = plan(card, "32GiB", "eager_whole")
    assert joint.feasible and joint.fits_budget and joint.predicted_peak_bytes <= 32 * GiB
    assert "region" in joint.options
    # eager/whole: infeasible, with its minimum predicted peak reported (not an exception).
    assert not ew.feasible and ew.options is None and ew.predicted_peak_bytes is None
    # By hand: all whole = P + 16·(0.25 GiB input + 2 GiB snapshot) + 2.75 GiB workspace.
    assert ew.min_feasible_peak_bytes == 2 * GiB + 16 * int(2.25 * GiB) + int(2.75 * GiB)
    assert ew.min_feasible_peak_bytes > 32 * GiB
    full = exhaustive(card, "32GiB", options=("eager", "whole"))  # all 2^16 policies
    assert not full.feasible and full.min_feasible_peak_bytes == ew.min_feasible_peak_bytes
    assert milp(card, "32GiB", options="eager_whole").feasible is False
    assert milp(card, "32GiB").predicted_time_s == pytest.approx(joint.predicted_time_s, rel=1e-9)
    # At 44 GiB both are feasible; regions make joint faster (§10).
    j44, ew44 = plan(card, "44GiB", "joint"), plan(card, "44GiB", "eager_whole")
    assert j44.fits_budget and ew44.fits_budget
    assert j44.predicted_time_s < ew44.predicted_time_s
    assert ew44.options.count("eager") == 6 and set(ew44.options) == {"eager", "whole"}


def test_table5_dense_and_small_cells():
    dense = plan(activation_pressure_card(dense=True), "32GiB", "joint")
    assert not dense.feasible and dense.min_feasible_peak_bytes > 32 * GiB
    for planner in ("joint", "eager_whole", "state_agnostic"):
        small = plan(activation_pressure_card(large=False), "32GiB", planner)
        assert small.options == ["eager"] * 16 and small.fits_budget


def test_state_agnostic_exceeds_budget_when_preservation_is_expensive():
    card = activation_pressure_card()
    res = plan(card, "32GiB", "state_agnostic")
    assert res.feasible and res.model_peak_bytes <= 32 * GiB  # it believes the policy fits
    assert not res.fits_budget and res.predicted_peak_bytes > 32 * GiB
    k = res.options.count("eager")
    # True cost of its choice, by hand: eager 2.75 GiB, whole 2.25 GiB retained each.
    assert res.predicted_peak_bytes == 2 * GiB + k * int(2.75 * GiB) + (16 - k) * int(2.25 * GiB) \
        + int(2.75 * GiB)
    assert res.model_peak_bytes == 2 * GiB + k * int(2.75 * GiB) + (16 - k) * int(0.25 * GiB) \
        + int(2.75 * GiB)
    assert res.predicted_time_s == pytest.approx(0.18 * k + 0.245 * (16 - k))
    assert "EXCEEDS" in res.explain()


def test_state_agnostic_without_recompute_only_falls_back_to_whole():
    d = activation_pressure_card().to_dict()
    for s in d["segments"]:
        del s["options"]["recompute_only"]
    card = ProfileCard.from_dict(d)
    sa, ew = plan(card, "44GiB", "state_agnostic"), plan(card, "44GiB", "eager_whole")
    assert sa.options == ew.options and sa.predicted_time_s == ew.predicted_time_s
    assert any("no recompute_only" in n for n in sa.notes)


def test_frontier_cap_is_recorded_and_drops_the_optimality_claim():
    card = random_card(40, 7)
    lo = plan(card, 0).min_feasible_peak_bytes
    budget = lo + (plan(card, 0, "eager").predicted_peak_bytes - lo) // 2
    exact = plan(card, budget, bound_pruning=False)
    capped = plan(card, budget, frontier_cap=2, bound_pruning=False)
    assert exact.frontier_size > 2 and not exact.truncated and exact.optimal
    assert capped.truncated and not capped.optimal and capped.frontier_size <= 2
    assert any("truncated" in n for n in capped.notes)
    assert capped.predicted_time_s >= exact.predicted_time_s
    assert capped.min_feasible_peak_bytes == exact.min_feasible_peak_bytes  # independent of cap
    with pytest.raises(ValueError, match="frontier_cap must be a positive int"):
        plan(card, budget, frontier_cap=0)


def test_fixed_methods_and_registry():
    card = activation_pressure_card()
    assert set(PLANNERS) == {"joint", "eager_whole", "state_agnostic", "eager", "whole", "region"}
    eager = plan(card, "44GiB", "eager")
    assert eager.options == ["eager"] * 16 and eager.feasible and not eager.fits_budget
    assert eager.predicted_peak_bytes == 2 * GiB + 16 * int(2.75 * GiB) + int(0.25 * GiB)
    assert plan(card, "44GiB", "region").predicted_peak_bytes == \
        2 * GiB + 16 * int(0.25 * GiB + 1024**2) + int(2.75 * GiB)
    # A segment without a region profile runs whole under the fixed-region method.
    d = card.to_dict()
    del d["segments"][3]["options"]["region"]
    reg = plan(ProfileCard.from_dict(d), "44GiB", "region")
    assert reg.options[3] == "whole" and reg.options.count("region") == 15


def test_plan_result_record_and_errors():
    card = random_card(5, 3)
    res = plan(card, 10**12)
    d = res.to_dict()
    assert tuple(d) == PLAN_KEYS
    assert {"planner", "budget_bytes", "feasible", "options", "predicted_peak_bytes",
            "predicted_time_s", "frontier_size", "truncated", "min_feasible_peak_bytes",
            "segment_names", "solve_time_s"} <= set(d)
    json.dumps(d)
    assert d["segment_names"] == card.segment_names and res.option_for("seg2") == d["options"][2]
    inf = plan(card, 1)
    assert inf.to_dict()["options"] is None and len(inf.min_peak_options) == 5
    with pytest.raises(ValueError, match="found no policy.*Tip: raise the budget"):
        inf.option_for("seg0")
    with pytest.raises(KeyError, match="no segment 'nope'"):
        res.option_for("nope")
    with pytest.raises(ValueError, match="unknown planner 'fast'.*Tip"):
        plan(card, 100, "fast")
    with pytest.raises(ValueError, match="bad budget_bytes '12 parsecs'"):
        plan(card, "12 parsecs")
    with pytest.raises(ProfileCardError, match="expected a ProfileCard, got dict"):
        plan(card.to_dict(), 100)
    with pytest.raises(ValueError, match="exceeds max_policies"):
        exhaustive(random_card(20, 1), 10**12, max_policies=10**6)


def test_explain_lists_every_segment_with_option_bytes_seconds_and_reason():
    card = activation_pressure_card()
    res = plan(card, "32GiB")
    text = res.explain()
    for name, opt in zip(res.segment_names, res.options):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(name + " "))
        assert opt in line and ("GiB" in line or "MiB" in line)
        assert ("fastest option" in line) or ("budget binds" in line)
    assert "peak = persistent 2.00 GiB" in text
    inf = plan(card, "32GiB", "eager_whole").explain()
    assert "INFEASIBLE" in inf and "40.75 GiB" in inf


def test_min_peak_sweep_matches_enumeration_on_all_small_policies():
    rng = np.random.default_rng(11)
    for _ in range(20):
        card = random_card(int(rng.integers(1, 6)), rng, small_ints=bool(rng.integers(2)))
        peaks = []
        for combo in itertools.product(*[list(s.options) for s in card.segments]):
            if "recompute_only" in combo:
                continue
            cs = [s.options[o] for s, o in zip(card.segments, combo)]
            peaks.append(card.persistent_bytes + sum(c.retained_bytes for c in cs)
                         + max(c.temp_bytes for c in cs))
        assert plan(card, 0).min_feasible_peak_bytes == min(peaks)


def test_bound_pruned_dp_retries_with_wider_beams_and_stays_exact(monkeypatch):
    from stateremat.planner import _dp

    # Tiny beams and abort limits force every retry path; the answer must not change.
    monkeypatch.setattr(_dp, "_SCHEDULE", ((1, 2), (2, 3), (1, None)))
    real, aborted = _dp._dp, []

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        aborted.append(out.aborted)
        return out

    monkeypatch.setattr(_dp, "_dp", spy)
    rng = np.random.default_rng(21)
    for _ in range(6):
        card = random_card(8, rng)
        for budget in _budgets(card, "joint", rng, count=2):
            _same(plan(card, budget), exhaustive(card, budget))
    assert sum(aborted) >= 5  # the retry path really ran
    from stateremat.planner._model import cost_tables

    tables = cost_tables(random_card(12, 3))
    out = _dp.dp_solve(tables, 10**12, bound_pruning=True, upper_bound_s=1e9, abort_above=2)
    assert out.aborted and out.codes is None
