"""Named planners and fixed methods, each returning a :class:`PlanResult` (STYLE §2, §3, §9).

``joint``, ``eager_whole`` and ``state_agnostic`` run the Pareto DP on their own cost model;
every registered option (``eager``, ``whole``, ``region``, ...) is also a fixed policy.
``exhaustive`` and ``milp`` solve the same models independently and return the same record.
Option names come from :data:`stateremat.contract.OPTIONS`, read at call time: ``joint`` chooses
among every registered option.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..contract import OPTIONS, ProfileCard, ProfileCardError
from ._budget import resolve_budget
from ._dp import OnSegment, dp_solve
from ._exhaustive import enumerate_policies
from ._milp import milp_min_peak, milp_solve
from ._chain import (PEAK_MODELS, chain_dp, chain_enumerate, chain_evaluate, chain_milp_min_peak,
                     chain_milp_solve, chain_min_peak)
from ._model import CostTables, cost_tables, evaluate, min_peak
from ._result import PlanResult


@dataclass(frozen=True)
class PlannerSpec:
    """A planner's cost model: which options it may choose and whether it omits preservation.

    Args:
        name: registry name.
        options: option names it may choose (a subset of :data:`stateremat.contract.OPTIONS`);
            ``None``: every registered option, read when the planner runs.
        omit_preservation: plan with ``whole`` priced as ``recompute_only`` (state-agnostic).
    """

    name: str
    options: tuple[str, ...] | None
    omit_preservation: bool = False

    def option_names(self) -> tuple[str, ...]:
        """The options this planner chooses among, now."""
        return OPTIONS.names if self.options is None else self.options

    def model(self, card: ProfileCard) -> CostTables:
        """The tables this planner optimises over."""
        return cost_tables(card, self.options, self.omit_preservation)

    def truth(self, card: ProfileCard) -> CostTables:
        """The same option set with correct (preservation-inclusive) costs."""
        return cost_tables(card, self.options, False)


SPECS: dict[str, PlannerSpec] = {
    "joint": PlannerSpec("joint", None),
    "eager_whole": PlannerSpec("eager_whole", (OPTIONS.baseline, OPTIONS.control)),
    "state_agnostic": PlannerSpec("state_agnostic", (OPTIONS.baseline, OPTIONS.control), omit_preservation=True),
}


def _budget(budget_bytes, api: str, card: ProfileCard, peak: str) -> tuple[int, list[str]]:
    """Budget bytes and notes: a size, or a fraction of the all-eager peak (0.6, "60%")."""
    if not isinstance(card, ProfileCard):
        raise ProfileCardError(f"{api}: expected a ProfileCard, got {type(card).__name__}. "
                               "Tip: load one with stateremat.contract.load_card(path).")
    value, note = resolve_budget(card, budget_bytes, peak, api)
    return value, [] if note is None else [note]


def _peak(peak, api: str) -> str:
    if not isinstance(peak, str) or peak not in PEAK_MODELS:
        raise ValueError(f"{api}: peak must be one of {list(PEAK_MODELS)}, got {peak!r}. Tip: "
                         "'eq3' is the paper's bound P + Σ r + max q; 'chain' the peak when the "
                         "segments run as a chain (closer to what is measured).")
    return peak


def _spec(options, api: str) -> PlannerSpec:
    if isinstance(options, str):
        if options not in SPECS:
            raise ValueError(f"{api}: unknown planner {options!r}; expected one of {list(SPECS)}. "
                             "Tip: or pass a tuple of option names.")
        return SPECS[options]
    options = tuple(options)
    for spec in SPECS.values():  # a named planner's option set gets its name
        if not spec.omit_preservation and frozenset(spec.option_names()) == frozenset(options):
            return PlannerSpec(spec.name, options)
    return PlannerSpec("+".join(options), options)


def _record(spec: PlannerSpec, card: ProfileCard, budget: int, codes, *, solver: str,
            t0: float, frontier_size=None, truncated=False, optimal=True,
            min_peak_pair=None, extra_notes=(), bound_pruning=False,
            model: CostTables | None = None, candidates_max=None,
            peak: str = "eq3") -> PlanResult:
    model = spec.model(card) if model is None else model
    truth = model if not spec.omit_preservation else spec.truth(card)
    ev = evaluate if peak == "eq3" else chain_evaluate
    if min_peak_pair is None:
        min_peak_pair = min_peak(model) if peak == "eq3" else chain_min_peak(model)
    peak_min, peak_codes = min_peak_pair
    names = model.option_list(peak_codes)
    notes = list(extra_notes)
    if spec.omit_preservation and model.fallback_segments:
        fb = model.fallback_segments
        notes.append(f"state_agnostic: {len(fb)} segment(s) have no recompute_only cost "
                     f"({', '.join(fb[:3])}{'…' if len(fb) > 3 else ''}); used whole's true costs")
    if truncated:
        notes.append("frontier truncated by the cap: the policy is not claimed optimal")
    common = dict(planner=spec.name, budget_bytes=budget, segment_names=card.segment_names,
                  frontier_size=frontier_size, truncated=truncated, min_feasible_peak_bytes=peak_min,
                  solver=solver, min_peak_options=names, persistent_bytes=card.persistent_bytes,
                  notes=notes, card=card, bound_pruning=bound_pruning,
                  frontier_candidates_max=candidates_max, peak=peak)
    if codes is None:
        return PlanResult(feasible=False, options=None, predicted_peak_bytes=None,
                          predicted_time_s=None, optimal=optimal and not truncated,
                          fits_budget=False, solve_time_s=time.perf_counter() - t0, **common)
    model_peak, model_time = ev(model, codes)
    true_peak, true_time = ev(truth, codes)
    # Times in seconds; a card's finite times whose sum is past float range give inf.
    model_time, true_time = model.seconds(model_time), truth.seconds(true_time)
    if not math.isfinite(true_time):
        notes.append("predicted time is past float range (inf): the card's times sum above "
                     "1.8e308 s; the policy is still the least-time one in exact scaled units")
    return PlanResult(feasible=True, options=model.option_list(codes),
                      predicted_peak_bytes=true_peak, predicted_time_s=true_time,
                      optimal=optimal and not truncated, fits_budget=true_peak <= budget,
                      model_peak_bytes=model_peak, model_time_s=model_time,
                      bound_peak_bytes=evaluate(truth, codes)[0],
                      chain_peak_bytes=chain_evaluate(truth, codes)[0],
                      solve_time_s=time.perf_counter() - t0, **common)


def _clamp_chain(budget: int) -> int:
    """The chain solvers' budget in int64 range (every chain peak is below 2^62 + 2^53)."""
    return max(-1, min(int(budget), 2**62))


def _chain_incumbent(model: CostTables, budget: int, frontier_cap, progress) -> float | None:
    """Cost of the cheaper chain-feasible policy among the chain's least-peak policy and eq. (3)'s
    optimum at the same budget (``None`` when neither fits)."""
    best = None
    codes = chain_min_peak(model)[1]
    if chain_evaluate(model, codes)[0] <= budget:
        best = chain_evaluate(model, codes)[1]
    out = dp_solve(model, budget, frontier_cap, bound_pruning=True, on_segment=progress)
    if out.codes is not None:
        peak, cost = chain_evaluate(model, out.codes)
        if peak <= budget and (best is None or cost < best):
            best = cost
    return best


def _dp_planner(spec: PlannerSpec, card: ProfileCard, budget_bytes, frontier_cap,
                bound_pruning: bool = True, progress: OnSegment | None = None,
                peak: str = "eq3") -> PlanResult:
    t0 = time.perf_counter()
    peak = _peak(peak, f"stateremat.planner.{spec.name}")
    budget, bnote = _budget(budget_bytes, f"stateremat.planner.{spec.name}", card, peak)
    if frontier_cap is not None and (isinstance(frontier_cap, bool) or int(frontier_cap) < 1):
        raise ValueError(f"stateremat.planner.{spec.name}: frontier_cap must be a positive int "
                         f"or None, got {frontier_cap!r}. Tip: omit it for an exact frontier.")
    model = spec.model(card)
    cap = None if frontier_cap is None else int(frontier_cap)
    if peak == "chain":
        budget_c = _clamp_chain(budget)
        ub = _chain_incumbent(model, budget_c, cap, progress) if bound_pruning else None  # eq. 3 passes
        stage = "chain, exact" if cap is None else f"chain, capped at {cap:,}"
        out = chain_dp(model, budget_c, upper_bound_s=ub, frontier_cap=cap,
                       on_segment=None if progress is None
                       else lambda done, total, size: progress(stage, done, total, size))
        if out.codes is None and out.truncated:  # the cap, not the budget, emptied the frontier
            codes = chain_min_peak(model)[1]
            if chain_evaluate(model, codes)[0] <= budget_c:
                out = dataclasses.replace(out, codes=codes)
    else:
        out = dp_solve(model, budget, cap, bound_pruning=bool(bound_pruning), on_segment=progress)
    return _record(spec, card, budget, out.codes, solver="dp", t0=t0,
                   frontier_size=out.frontier_size, truncated=out.truncated,
                   bound_pruning=bool(bound_pruning), model=model,
                   candidates_max=out.candidates_max, peak=peak, extra_notes=bnote)


def joint(card: ProfileCard, budget_bytes, frontier_cap: int | None = None,
          bound_pruning: bool = True, progress: OnSegment | None = None,
          peak: str = "eq3") -> PlanResult:
    """Joint planner: eager / whole / region per segment with correct costs (§4).

    Args:
        card: the profile card (bytes and seconds per segment and option).
        budget_bytes: logical budget ``M`` in bytes (int) or a size string such as ``"32GiB"``
            (at most 8 PiB).
        frontier_cap: optional cap on DP frontier points per segment; the result is then
            ``truncated`` and claims no optimality (if the cap drops every completion while the
            exact minimum-peak policy fits, that policy is returned).
        bound_pruning: drop prefixes whose Lagrangian lower bound (with a float-error margin)
            exceeds a feasible incumbent's cost; never changes the answer.
        progress: called as ``progress(stage, done_segments, total_segments, frontier_size)``
            after every segment of every DP pass (the CLI draws it); None: nothing.
        peak: ``"eq3"`` (the budget bounds ``P + Σ r + max q``) or ``"chain"`` (it bounds the
            peak when the segments run as a chain, :func:`chain_peak_bytes`).

    Returns:
        :class:`PlanResult` with ``solver="dp"``; an infeasible budget gives
        ``feasible=False``, ``options=None`` and ``min_feasible_peak_bytes``.

    Raises:
        ValueError: bad budget (unparsable, over 8 PiB) or a cap that is not a positive int.
        ProfileCardError: ``card`` is not a ProfileCard.

    References:
        Paper §4 eq. (3), §9.1.
    """
    return _dp_planner(SPECS["joint"], card, budget_bytes, frontier_cap, bound_pruning, progress,
                       peak)


def eager_whole(card: ProfileCard, budget_bytes, frontier_cap: int | None = None,
                bound_pruning: bool = True, progress: OnSegment | None = None,
                peak: str = "eq3") -> PlanResult:
    """Correctly costed eager/whole control: same costs as joint, no regions (§9.1, Table 5).

    Args:
        card: the profile card (bytes and seconds per segment and option).
        budget_bytes: logical budget ``M`` in bytes (int) or a size string such as ``"32GiB"``
            (at most 8 PiB).
        frontier_cap: optional cap on DP frontier points per segment; the result is then
            ``truncated`` and claims no optimality (if the cap drops every completion while the
            exact minimum-peak policy fits, that policy is returned).
        bound_pruning: drop prefixes whose Lagrangian lower bound (with a float-error margin)
            exceeds a feasible incumbent's cost; never changes the answer.
        progress: called as ``progress(stage, done_segments, total_segments, frontier_size)``
            after every segment of every DP pass (the CLI draws it); None: nothing.
        peak: ``"eq3"`` (the budget bounds ``P + Σ r + max q``) or ``"chain"`` (it bounds the
            peak when the segments run as a chain, :func:`chain_peak_bytes`).

    Returns:
        :class:`PlanResult` with ``solver="dp"``; ``min_feasible_peak_bytes`` is over
        eager/whole policies only; an infeasible budget gives ``feasible=False``,
        ``options=None`` and ``min_feasible_peak_bytes``.

    Raises:
        ValueError: bad budget (unparsable, over 8 PiB) or a cap that is not a positive int.
        ProfileCardError: ``card`` is not a ProfileCard.

    References:
        Paper §4 eq. (3), §9.1, Table 5.
    """
    return _dp_planner(SPECS["eager_whole"], card, budget_bytes, frontier_cap, bound_pruning, progress,
                       peak)


def state_agnostic(card: ProfileCard, budget_bytes, frontier_cap: int | None = None,
                   bound_pruning: bool = True, progress: OnSegment | None = None,
                   peak: str = "eq3") -> PlanResult:
    """State-agnostic control: eager/whole chosen with preservation costs omitted (§4).

    It optimises with ``whole`` priced as the card's ``recompute_only`` entry (replay without
    preservation; ``whole`` itself where absent, noted in ``notes``) and reports the true
    predicted peak/time of its policy, so ``fits_budget`` can be False while ``feasible`` is True.

    Args:
        card: the profile card (bytes and seconds per segment and option).
        budget_bytes: logical budget ``M`` in bytes (int) or a size string such as ``"32GiB"``
            (at most 8 PiB).
        frontier_cap: optional cap on DP frontier points per segment; the result is then
            ``truncated`` and claims no optimality (if the cap drops every completion while the
            exact minimum-peak policy fits, that policy is returned).
        bound_pruning: drop prefixes whose Lagrangian lower bound (with a float-error margin)
            exceeds a feasible incumbent's cost; never changes the answer.
        progress: called as ``progress(stage, done_segments, total_segments, frontier_size)``
            after every segment of every DP pass (the CLI draws it); None: nothing.
        peak: ``"eq3"`` (the budget bounds ``P + Σ r + max q``) or ``"chain"`` (it bounds the
            peak when the segments run as a chain, :func:`chain_peak_bytes`).

    Returns:
        :class:`PlanResult` with ``solver="dp"``: ``model_peak_bytes``/``model_time_s`` in
        its own (preservation-omitting) model, ``predicted_*`` with true costs; an infeasible
        budget (in its model) gives ``feasible=False``, ``options=None`` and
        ``min_feasible_peak_bytes``.

    Raises:
        ValueError: bad budget (unparsable, over 8 PiB) or a cap that is not a positive int.
        ProfileCardError: ``card`` is not a ProfileCard.

    Danger:
        ``feasible`` refers to the planner's own model; judge the policy by ``fits_budget``.

    References:
        Paper §4 eq. (3), §9.1.
    """
    return _dp_planner(SPECS["state_agnostic"], card, budget_bytes, frontier_cap, bound_pruning, progress,
                       peak)


@functools.lru_cache(maxsize=None)
def _fixed(option: str) -> Callable[..., PlanResult]:
    """The fixed method of ``option``: every segment uses it (``whole`` where the card omits it)."""
    def fixed(card: ProfileCard, budget_bytes, frontier_cap: int | None = None,
              bound_pruning: bool = True, progress: OnSegment | None = None,
              peak: str = "eq3") -> PlanResult:
        t0 = time.perf_counter()
        peak = _peak(peak, f"stateremat.planner.{option}")
        budget, bnote = _budget(budget_bytes, f"stateremat.planner.{option}", card, peak)
        spec = PlannerSpec(option, None)
        tables = spec.model(card)
        k = tables.option_names.index(option)
        codes = np.where(tables.valid[:, k], k, tables.option_names.index(OPTIONS.control))
        own = (evaluate if peak == "eq3" else chain_evaluate)(tables, codes)[0]
        return _record(spec, card, budget, codes, solver="fixed", t0=t0, optimal=False,
                       min_peak_pair=(own, codes), model=tables, peak=peak, extra_notes=bnote)
    fixed.__name__ = f"all_{option}"
    fixed.__doc__ = (f"Fixed method: every segment uses {option!r}"
                     + ("." if OPTIONS[option].required else f" (whole where no {option} is profiled)."))
    return fixed


all_eager, all_whole, all_region = _fixed("eager"), _fixed("whole"), _fixed("region")


class _Planners(Mapping):
    """Planner name → ``f(card, budget_bytes, frontier_cap=None, bound_pruning=True,
    progress=None) -> PlanResult``.

    The named planners, then one fixed method per option registered in
    :data:`stateremat.contract.OPTIONS` (read at each lookup).
    """

    _named: dict[str, Callable[..., PlanResult]] = {
        "joint": joint, "eager_whole": eager_whole, "state_agnostic": state_agnostic}

    def __getitem__(self, name: str) -> Callable[..., PlanResult]:
        if name in self._named:
            return self._named[name]
        if name in OPTIONS:
            return _fixed(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter((*self._named, *OPTIONS.names))

    def __len__(self) -> int:
        return len(self._named) + len(OPTIONS)

    def __repr__(self) -> str:
        return f"PLANNERS({list(self)})"


#: Planner name → planner function (named planners, then the registered options' fixed methods).
PLANNERS: Mapping[str, Callable[..., PlanResult]] = _Planners()


def plan(card: ProfileCard, budget_bytes, planner: str = "joint",
         frontier_cap: int | None = None, bound_pruning: bool = True,
         progress: OnSegment | None = None, peak: str = "eq3") -> PlanResult:
    """Choose a checkpoint option per segment under a logical budget (eq. 3).

    Args:
        card: the profile card.
        budget_bytes: ``M`` in bytes (int) or a size string such as ``"32GiB"``.
        planner: a key of :data:`PLANNERS`.
        frontier_cap: optional cap on DP frontier points per segment (then ``truncated`` and
            no optimality claim).
        bound_pruning: let the DP drop prefixes whose exact Lagrangian lower bound exceeds a
            known feasible cost (same optimum; ``False`` keeps the whole budget-feasible
            Pareto frontier, exponential on long heterogeneous cards).
        progress: ``progress(stage, done_segments, total_segments, frontier_size)`` after
            every segment of every DP pass (fixed methods never call it); None: nothing.
        peak: the peak the budget bounds: ``"eq3"`` (default, the paper's ``P + Σ r + max q``)
            or ``"chain"`` (the peak when the segments run as a chain,
            :func:`chain_peak_bytes`: at most eq. 3's on a profiled card, and within a few
            percent of what is measured). ``bound_peak_bytes`` and ``chain_peak_bytes`` of the
            result give both for the chosen policy.

    Returns:
        :class:`PlanResult`; an infeasible budget gives ``feasible=False`` with
        ``min_feasible_peak_bytes``, never an exception.

    Raises:
        ValueError: unknown planner, bad budget or bad cap.
        ProfileCardError: ``card`` is not a ProfileCard.

    Warns:
        FrontierWarning: the exact DP's frontier grew past ``FRONTIER_WARN_POINTS`` (a
            frontier cap or :func:`milp` is then much faster).

    Danger:
        Predictions are the static model of the card's measurements; actual allocator peaks
        differ (fragmentation, allocator caching) and are what runs must be judged on.

    References:
        Paper §4 eq. (3), §9.1, Table 5.
    """
    if planner not in PLANNERS:
        raise ValueError(f"stateremat.planner.plan: unknown planner {planner!r}; expected one of "
                         f"{list(PLANNERS)}. Tip: joint is the paper's planner.")
    return PLANNERS[planner](card, budget_bytes, frontier_cap=frontier_cap,
                             bound_pruning=bound_pruning, progress=progress, peak=peak)


def exhaustive(card: ProfileCard, budget_bytes, options="joint",
               max_policies: int = 50_000_000, peak: str = "eq3") -> PlanResult:
    """Enumerate every policy (the DP's oracle); ``options`` is an option tuple or planner name.

    Args:
        card: the profile card.
        budget_bytes: logical budget ``M`` in bytes (int) or a size string (at most 8 PiB).
        options: option names (a subset of the registered options) or a planner name of
            :data:`SPECS` (default ``"joint"``: every registered option; ``"state_agnostic"``
            enumerates its preservation-omitting model).
        max_policies: refuse to enumerate more policies than this (3^16 ≈ 43 M fits).

    Returns:
        :class:`PlanResult` with ``solver="exhaustive"``, ``frontier_size=None``; ties broken
        as the DP does (cost, then peak, then lexicographic options).

    Raises:
        ValueError: more than ``max_policies`` policies, bad budget or options.

    References:
        Paper §9.1 (2^16 eager/whole and 3^16 joint policies).
    """
    t0 = time.perf_counter()
    spec = _spec(options, "stateremat.planner.exhaustive")
    peak = _peak(peak, "stateremat.planner.exhaustive")
    budget, bnote = _budget(budget_bytes, "stateremat.planner.exhaustive", card, peak)
    model = spec.model(card)
    if peak == "chain":
        out = chain_enumerate(model, _clamp_chain(budget), max_policies=max_policies)
    else:
        out = enumerate_policies(model, budget, max_policies=max_policies)
    return _record(spec, card, budget, out.codes, solver="exhaustive", t0=t0,
                   min_peak_pair=(out.min_peak_bytes, out.min_peak_codes), model=model, peak=peak,
                   extra_notes=bnote)


def milp(card: ProfileCard, budget_bytes, options="joint",
         time_limit_s: float = 60.0, peak: str = "eq3") -> PlanResult:
    """Solve the model as a MILP with ``scipy.optimize.milp`` (HiGHS); same record as the DP.

    Args:
        card: the profile card.
        budget_bytes: logical budget ``M`` in bytes (int) or a size string (at most 8 PiB).
        options: option names or a planner name, as for :func:`exhaustive`.
        time_limit_s: HiGHS wall-clock limit in seconds (per solve; the minimum-peak MILP and
            any tolerance re-solves each get it).

    Returns:
        :class:`PlanResult` with ``solver="milp"``; ``optimal`` is False (with a note) when
        HiGHS stopped on the time limit. The policy is re-scored exactly, so a solver
        tolerance never admits an over-budget policy.

    Raises:
        ValueError: bad budget or options.

    Danger:
        Ties between equal-cost policies may be broken differently from the DP; compare
        costs, not option lists, when costs tie.

    References:
        Paper §4 eq. (3).
    """
    t0 = time.perf_counter()
    spec = _spec(options, "stateremat.planner.milp")
    peak = _peak(peak, "stateremat.planner.milp")
    budget, bnote = _budget(budget_bytes, "stateremat.planner.milp", card, peak)
    model = spec.model(card)
    if peak == "chain":
        out = chain_milp_solve(model, _clamp_chain(budget), time_limit_s)
        pair = chain_milp_min_peak(model, time_limit_s)
    else:
        out = milp_solve(model, budget, time_limit_s)
        pair = milp_min_peak(model, time_limit_s)
    notes = [] if out.proven_optimal else [f"MILP not proven optimal: {out.message}"]
    notes += bnote
    return _record(spec, card, budget, out.codes, solver="milp", t0=t0, optimal=out.proven_optimal,
                   min_peak_pair=pair, extra_notes=notes, model=model, peak=peak)
