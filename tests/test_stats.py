"""stateremat.stats against hand-computed values on a small synthetic cohort (paper §11)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from stateremat.paper.records import RecordsError
from stateremat.paper.stats import (
    Comparison, bonferroni_level, bootstrap_ratio, compare, family_size, geometric_mean,
    method_table, paired_ratios, process_means,
)

# process -> method -> (step times s, peak bytes)
COHORT = {
    0: {"A": ([1.0, 3.0], 100), "B": ([4.0, 4.0], 200)},
    1: {"A": ([2.0, 2.0], 100), "B": ([1.0, 3.0], 200)},
    2: {"A": ([3.0, 5.0], 100), "B": ([1.0, 1.0], 200)},
}
BUDGET = 150


def rows(cohort=COHORT, cell="c"):
    out = []
    for p, methods in cohort.items():
        for m, (times, peak) in methods.items():
            for s, t in enumerate(times):
                out.append({"process": p, "cell": cell, "method": m, "step": s, "step_time_s": t,
                            "peak_bytes": peak, "fits_budget": peak <= BUDGET, "feasible": True})
    return pd.DataFrame(out)


def test_process_means_are_per_process_arithmetic_means():
    m = process_means(rows()).set_index(["process", "method"])
    assert m.loc[(0, "A"), "mean_step_time_s"] == 2.0
    assert m.loc[(2, "A"), "mean_step_time_s"] == 4.0
    assert m.loc[(1, "B"), "mean_step_time_s"] == 2.0
    assert m.loc[(0, "B"), "peak_bytes"] == 200
    assert bool(m.loc[(0, "A"), "fits_budget"]) and not bool(m.loc[(0, "B"), "fits_budget"])
    assert (m["n_steps"] == 2).all()


def test_paired_ratios_and_geometric_mean_by_hand():
    r = paired_ratios(process_means(rows()), "c", "A", "B", "time")
    assert r.tolist() == [0.5, 1.0, 4.0]
    assert geometric_mean(r) == pytest.approx(2 ** (1 / 3), rel=1e-12)
    assert math.isnan(geometric_mean([]))
    with pytest.raises(ValueError, match="finite and > 0"):
        geometric_mean([1.0, 0.0])


def test_bonferroni_levels_match_the_paper():
    assert bonferroni_level(2) == pytest.approx(0.975)  # two primary comparisons per cohort
    assert bonferroni_level(6) == pytest.approx(1 - 0.05 / 6)  # Table 8: six comparisons
    assert bonferroni_level(1) == pytest.approx(0.95)
    with pytest.raises(ValueError, match="m >= 1"):
        bonferroni_level(0)


def test_bootstrap_interval_of_three_processes_is_hand_computable():
    # With 3 processes a resample is all-min with probability 1/27 = 3.7 % > 1.25 %, so the
    # 97.5 % percentile interval of the mean log ratio is exactly [log min, log max].
    est = bootstrap_ratio([0.5, 1.0, 4.0], confidence_level=0.975, seed=1)
    assert est.point == pytest.approx(2 ** (1 / 3))
    assert est.ci_low == pytest.approx(0.5) and est.ci_high == pytest.approx(4.0)
    assert est.n_resamples == 20_000 and est.n_processes == 3 and not est.degenerate


def test_bootstrap_matches_an_independent_hand_rolled_bootstrap():
    rng = np.random.default_rng(7)
    ratios = np.exp(rng.normal(np.log(0.82), 0.01, size=12))
    est = bootstrap_ratio(ratios, confidence_level=0.975, seed=3)
    # independent reference: resample processes, mean of logs, percentiles
    idx = np.random.default_rng(11).integers(0, ratios.size, size=(40_000, ratios.size))
    means = np.log(ratios)[idx].mean(axis=1)
    lo, hi = np.exp(np.quantile(means, [0.0125, 0.9875]))
    assert est.ci_low < est.point < est.ci_high
    assert est.ci_low == pytest.approx(lo, rel=5e-4) and est.ci_high == pytest.approx(hi, rel=5e-4)
    assert est.point == pytest.approx(geometric_mean(ratios))


def test_identical_peaks_give_a_point_interval():
    est = bootstrap_ratio([0.5, 0.5, 0.5], confidence_level=0.975)
    assert (est.point, est.ci_low, est.ci_high) == (0.5, 0.5, 0.5)
    assert est.degenerate and est.n_resamples == 0


def test_one_process_has_no_interval_and_nonpositive_ratios_are_rejected():
    est = bootstrap_ratio([0.7, ], confidence_level=0.975)
    assert est.point == pytest.approx(0.7) and math.isnan(est.ci_low)
    with pytest.raises(ValueError, match="infeasible"):
        bootstrap_ratio([1.0, math.inf], confidence_level=0.975)


def test_compare_summary_fields_by_hand():
    comps = [Comparison("c", "A", "B")]
    assert family_size(comps) == 2
    [s] = compare(rows(), comps, seed=0)
    assert s["comparison"] == "A/B" and s["cell"] == "c"
    assert s["time_ratio"] == pytest.approx(2 ** (1 / 3))
    assert s["ci"] == pytest.approx([0.5, 4.0])
    assert s["peak_ratio"] == 0.5 and s["peak_ci"] == [0.5, 0.5]
    assert s["point_interval"] == {"time": False, "peak": True}
    assert s["fits"] == {"A": 3, "B": 0}
    assert s["confidence_level"] == pytest.approx(0.975) and s["n_processes"] == 3


def test_infeasible_method_gets_no_time_never_infinity():
    df = rows()
    extra = pd.DataFrame([{"process": p, "cell": "c", "method": "C", "step": -1,
                           "step_time_s": None, "peak_bytes": None, "fits_budget": False,
                           "feasible": False} for p in COHORT])
    df = pd.concat([df, extra], ignore_index=True)
    comps = [Comparison("c", "A", "B", ("time",)), Comparison("c", "A", "C", ("peak",))]
    a_b, a_c = compare(df, comps)
    assert a_b["confidence_level"] == pytest.approx(0.975)
    assert a_c["time_ratio"] is None and a_c["ci"] == [None, None] and a_c["peak_ratio"] is None
    assert a_c["fits"] == {"A": 3, "C": 0} and a_c["n_processes"] == 0
    assert a_c["note"].startswith("C: no feasible policy") and a_b["note"] == ""
    table = {r["method"]: r for r in method_table(df, {"c": BUDGET})}
    assert table["C"]["mean_step_time_s"] is None and table["C"]["n_feasible"] == 0
    assert table["A"]["mean_step_time_s"] == pytest.approx(8 / 3)
    assert table["B"]["fits"] == 0 and table["A"]["fits"] == 3
    assert table["A"]["budget_bytes"] == BUDGET


def test_missing_columns_raise_a_records_error():
    with pytest.raises(RecordsError, match="lack columns"):
        process_means(pd.DataFrame({"process": [0]}))


def test_comparison_round_trips_through_json_dicts():
    c = Comparison("cell", "joint", "regions", ("time",))
    assert Comparison.from_dict(c.to_dict()) == c and c.name == "joint/regions"


def _wide_cohort(n=40, seed=5):
    """n processes whose A/B time ratios spread widely (log-normal, sd 0.6): with this many,
    percentile intervals at 0.95 and at 0.975 are clearly different."""
    rng = np.random.default_rng(seed)
    ratio = np.exp(rng.normal(np.log(0.8), 0.6, size=n))
    peak = np.exp(rng.normal(np.log(0.6), 0.2, size=n))
    cohort = {p: {"A": ([ratio[p], ratio[p]], int(1000 * peak[p])), "B": ([1.0, 1.0], 1000)}
              for p in range(n)}
    return rows(cohort), ratio, peak


def test_compare_computes_its_interval_at_the_bonferroni_level_it_records():
    from scipy import stats as sps

    df, ratio, _ = _wide_cohort()
    comps = [Comparison("c", "A", "B")]  # one comparison, two primary metrics: m = 2
    [s] = compare(df, comps, seed=0, n_resamples=20_000)
    assert s["confidence_level"] == pytest.approx(0.975)
    logs = np.log(paired_ratios(process_means(df), "c", "A", "B", "time").to_numpy())
    assert np.allclose(np.exp(logs), ratio)

    def scipy_ci(level, seed, method="percentile"):
        res = sps.bootstrap((logs,), np.mean, n_resamples=20_000, confidence_level=level,
                            method=method, vectorized=True, rng=np.random.default_rng(seed))
        return np.exp(res.confidence_interval)

    at975, at95 = scipy_ci(0.975, 0), scipy_ci(0.95, 0)
    assert s["ci"] == pytest.approx(list(at975), rel=1e-12)  # time: comparison 0, metric 0 -> seed 0
    # the two levels differ here by far more than any resampling noise
    assert at975[0] < at95[0] * 0.98 and at975[1] > at95[1] * 1.02
    assert s["ci"][0] != pytest.approx(at95[0], rel=1e-2)
    assert s["ci"][1] != pytest.approx(at95[1], rel=1e-2)
    assert s["ci"] != pytest.approx(list(scipy_ci(0.975, 0, "BCa")), rel=1e-6)  # percentile, not BCa
    # independent check: a hand-rolled percentile bootstrap at 0.975 lands within 0.5 % of it
    # (the 0.95 interval is more than 2 % away at both ends)
    idx = np.random.default_rng(99).integers(0, logs.size, size=(100_000, logs.size))
    lo, hi = np.exp(np.quantile(logs[idx].mean(axis=1), [0.0125, 0.9875]))
    assert s["ci"] == pytest.approx([lo, hi], rel=5e-3)


def test_a_six_test_family_uses_its_own_level():
    df, _, _ = _wide_cohort(n=30, seed=8)
    df2 = df.assign(cell="d")
    comps = [Comparison(c, "A", "B") for c in ("c", "d")] + [Comparison("c", "B", "A")]
    results = compare(pd.concat([df, df2]), comps, seed=4, n_resamples=5_000)
    assert [r["confidence_level"] for r in results] == pytest.approx([1 - 0.05 / 6] * 3)
    logs = np.log(paired_ratios(process_means(df), "c", "A", "B", "time").to_numpy())
    want = bootstrap_ratio(np.exp(logs), confidence_level=1 - 0.05 / 6, seed=4, n_resamples=5_000)
    assert results[0]["ci"] == pytest.approx([want.ci_low, want.ci_high], rel=1e-12)
