"""``PlanResult``: the one record every solver and control returns (STYLE §3, §12)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..contract import ProfileCard, format_bytes

#: Keys of ``PlanResult.to_dict()`` (the PLAN.json written by ``stateremat plan``).
PLAN_KEYS = ("planner", "budget_bytes", "feasible", "options", "segment_names",
             "predicted_peak_bytes", "predicted_time_s", "frontier_size", "truncated",
             "min_feasible_peak_bytes", "solve_time_s", "solver", "optimal", "fits_budget",
             "model_peak_bytes", "model_time_s", "min_peak_options", "persistent_bytes",
             "bound_pruning", "frontier_candidates_max", "peak", "bound_peak_bytes",
             "chain_peak_bytes", "notes")


@dataclass(frozen=True)
class PlanResult:
    """A checkpoint policy for a profile card under a logical budget, with its prediction.

    Args:
        planner: planner or fixed-method name (``joint``, ``eager_whole``, ``state_agnostic``,
            ``eager``, ``whole``, ``region``).
        budget_bytes: logical budget ``M``.
        feasible: the method admitted a policy under *its own* cost model (eq. 3). For ``joint``
            and ``eager_whole`` this equals ``fits_budget``. ``state_agnostic`` may be feasible
            in its model while its true prediction exceeds ``M``; fixed methods have no budget
            model and are always feasible.
        options: option per segment (``eager``/``whole``/``region``), or ``None`` when
            infeasible — an infeasible plan never carries a best-effort policy (the min-peak
            policy is in ``min_peak_options``).
        segment_names: card segment names, aligned with ``options``.
        predicted_peak_bytes: true predicted peak of ``options`` in the ``peak`` model (eq. 3's
            ``P + Σ r + max q`` by default; ``None`` if infeasible).
        predicted_time_s: true predicted ``Σ c`` seconds per step (``None`` if infeasible).
        frontier_size: largest DP Pareto frontier over the segments (``None`` for non-DP
            solvers); with ``bound_pruning`` it counts only points that survive the bound, and
            it is 0 when the exact minimum-peak test proves infeasibility before the DP runs.
        truncated: a frontier cap dropped points; the result then claims no optimality.
        min_feasible_peak_bytes: minimum predicted peak over the method's option set in its own
            model (Table 5); for ``state_agnostic`` that is the model without preservation.
        solve_time_s: wall seconds spent solving.
        solver: ``dp``, ``exhaustive``, ``milp`` or ``fixed``.
        optimal: the solver proved optimality within the model (False when truncated).
        fits_budget: ``predicted_peak_bytes ≤ budget_bytes`` with true costs.
        model_peak_bytes: peak in the planner's own model (differs only for ``state_agnostic``).
        model_time_s: time in the planner's own model.
        min_peak_options: one policy attaining ``min_feasible_peak_bytes``.
        persistent_bytes: ``P`` from the card.
        bound_pruning: the DP dropped prefixes by an exact Lagrangian cost bound (optimality
            is kept; the stored frontier is the part that can still beat an incumbent).
        frontier_candidates_max: largest number of budget-feasible candidate prefixes the DP
            examined at one segment (children of the stored frontier before bound pruning and
            the Pareto filter; ``None`` for non-DP solvers). With bound pruning this shows the
            work the bound removed; the size of the *full* Pareto frontier is only known from
            a run with ``bound_pruning=False`` (its ``frontier_size``).
        peak: the peak model the budget bounds: ``"eq3"`` (``P + Σ r + max q``) or
            ``"chain"`` (the peak when the segments run as a chain); ``predicted_peak_bytes``,
            ``model_peak_bytes``, ``min_feasible_peak_bytes`` and ``fits_budget`` are in it.
        bound_peak_bytes: eq. (3)'s bound of ``options`` with true costs (``None`` if infeasible).
        chain_peak_bytes: the chain peak of ``options`` with true costs (``None`` if infeasible).
        notes: caveats (fallbacks, truncation).
        card: the card planned on (for :meth:`explain`; not serialised).

    References:
        Paper §4 eq. (3), §9.1, Table 5.
    """

    planner: str
    budget_bytes: int
    feasible: bool
    options: list[str] | None
    segment_names: list[str]
    predicted_peak_bytes: int | None
    predicted_time_s: float | None
    frontier_size: int | None
    truncated: bool
    min_feasible_peak_bytes: int
    solve_time_s: float
    solver: str = "dp"
    optimal: bool = True
    fits_budget: bool = False
    model_peak_bytes: int | None = None
    model_time_s: float | None = None
    min_peak_options: list[str] = field(default_factory=list)
    persistent_bytes: int = 0
    bound_pruning: bool = False
    frontier_candidates_max: int | None = None
    notes: list[str] = field(default_factory=list)
    peak: str = "eq3"
    bound_peak_bytes: int | None = None
    chain_peak_bytes: int | None = None
    card: ProfileCard | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The PLAN.json object: :data:`PLAN_KEYS` (JSON-serialisable, no card)."""
        return {k: (list(v) if isinstance(v := getattr(self, k), list) else v) for k in PLAN_KEYS}

    def option_for(self, name: str) -> str:
        """The option chosen for segment ``name``.

        Raises:
            KeyError: unknown segment name; ValueError: the plan is infeasible.
        """
        if self.options is None:
            raise ValueError(f"PlanResult.option_for: planner {self.planner!r} found no policy "
                             f"within {format_bytes(self.budget_bytes)} (min predicted peak "
                             f"{format_bytes(self.min_feasible_peak_bytes)}). Tip: raise the budget.")
        if name not in self.segment_names:
            raise KeyError(f"PlanResult.option_for: no segment {name!r}; the card has "
                           f"{self.segment_names[:5]}{'…' if len(self.segment_names) > 5 else ''}. "
                           "Tip: plan on the card profiled from this model.")
        return self.options[self.segment_names.index(name)]

    def explain(self) -> str:
        """Per segment: option, retained bytes, predicted seconds, and why it was chosen."""
        from ._explain import explain
        return explain(self)
