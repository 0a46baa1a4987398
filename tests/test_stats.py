"""stateremat.stats against hand-computed values on a small synthetic cohort (paper §11)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from stateremat.contract import RecordsError
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
