"""Planning checkpoint options under a logical memory budget (paper §4, eq. 3; §9.1).

``plan(card, budget_bytes, planner=...)`` runs a named planner from :data:`PLANNERS`; the
Pareto-frontier DP, the exhaustive enumerator and the MILP all return one :class:`PlanResult`.
Options are those of :data:`stateremat.contract.OPTIONS`, read at call time. This package
imports numpy only (scipy lazily, for the MILP).
"""
from ._budget import eager_fraction_budget as eager_fraction_budget
from ._chain import PEAK_MODELS as PEAK_MODELS, chain_peak_bytes as chain_peak_bytes
from ._dp import FRONTIER_WARN_POINTS as FRONTIER_WARN_POINTS, FrontierWarning as FrontierWarning
from ._model import CostTables as CostTables, cost_tables as cost_tables
from ._planners import (
    PLANNERS as PLANNERS,
    PlannerSpec as PlannerSpec,
    SPECS as SPECS,
    all_eager as all_eager,
    all_region as all_region,
    all_whole as all_whole,
    eager_whole as eager_whole,
    exhaustive as exhaustive,
    joint as joint,
    milp as milp,
    plan as plan,
    state_agnostic as state_agnostic,
)
from ._result import PLAN_KEYS as PLAN_KEYS, PlanResult as PlanResult
from ._examples import activation_pressure_card as activation_pressure_card, random_card as random_card

__all__ = [
    "CostTables", "FRONTIER_WARN_POINTS", "FrontierWarning", "PEAK_MODELS", "PLANNERS", "PLAN_KEYS", "PlanResult",
    "PlannerSpec", "SPECS", "activation_pressure_card", "all_eager", "all_region", "all_whole", "chain_peak_bytes",
    "cost_tables",
    "eager_fraction_budget", "eager_whole", "exhaustive", "joint", "milp", "plan",
    "random_card", "state_agnostic",
]
