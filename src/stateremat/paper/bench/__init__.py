"""The cost-runtime experiments (paper §8–§10): specs, methods, the one runner, summaries.

An :class:`ExperimentSpec` names cells (workload shapes), methods, budget and step counts;
:func:`run_cell_methods` plans each method on the cell's profile card, checks it semantically
and times it (spec -> rows); :func:`run_experiment` runs a whole spec into a records folder and
summarises the rows once (:func:`summarize`).
"""
from ._bench import bench_summary as bench_summary, run_experiment as run_experiment
from ._methods import MethodRun as MethodRun, build_method as build_method, method_plan as method_plan, policy_json as policy_json
from ._runner import FROZEN_PROFILE_ENV as FROZEN_PROFILE_ENV, cell_card as cell_card, run_cell_methods as run_cell_methods
from ._semantic import check_method as check_method
from ._spec import (
    EXPERIMENTS as EXPERIMENTS,
    FAIR_EAGER_FRACTION as FAIR_EAGER_FRACTION,
    METHODS as METHODS,
    SIX_METHODS as SIX_METHODS,
    Cell as Cell,
    ExperimentSpec as ExperimentSpec,
    budget_rule as budget_rule,
    experiment_spec as experiment_spec,
    resolve_budget as resolve_budget,
    resolve_spec as resolve_spec,
    with_budget as with_budget,
)
from ._summary import TABLE as TABLE, summarize as summarize
from ._tables import render as render_bench, write_tables as write_bench_tables

__all__ = [
    "Cell", "EXPERIMENTS", "ExperimentSpec", "FAIR_EAGER_FRACTION", "FROZEN_PROFILE_ENV",
    "METHODS", "MethodRun", "SIX_METHODS", "TABLE", "bench_summary", "budget_rule",
    "build_method", "cell_card",
    "check_method", "experiment_spec", "method_plan", "policy_json", "resolve_budget",
    "render_bench", "resolve_spec", "run_cell_methods", "run_experiment", "summarize",
    "with_budget", "write_bench_tables",
]
