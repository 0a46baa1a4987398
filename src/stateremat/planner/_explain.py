"""Human-readable explanation of a plan: what each segment keeps and why (STYLE §12)."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ..contract import OPTIONS, RECOMPUTE_ONLY, format_bytes
from ._planners import SPECS

if TYPE_CHECKING:
    from ._result import PlanResult


def _spec_options(planner: str, chosen: str) -> tuple[str, ...]:
    """Options ``planner`` chooses among (its own option for a fixed method)."""
    return SPECS[planner].option_names() if planner in SPECS else (chosen,)


def _signed_bytes(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_bytes(abs(n))


def _why(res: "PlanResult", i: int, chosen: str, max_q: int) -> str:
    seg = res.card.segments[i]
    allowed = [o for o in _spec_options(res.planner, chosen) if o in seg.options]
    cost = seg.options[chosen]
    fastest = min(allowed, key=lambda o: (seg.options[o].time_s, OPTIONS.index(o)))
    fixed = res.planner in OPTIONS
    parts = []
    if fixed:
        parts.append(f"fixed method {res.planner!r}")
        if res.planner != chosen:
            parts.append(f"no {res.planner} profiled" + (" (no declared state)" if OPTIONS.journals(res.planner) else "")
                         + f": {chosen}")
    elif chosen == fastest:
        parts.append("fastest option" + ("" if OPTIONS.replays(chosen) else " (no replay)"))
    else:
        f = seg.options[fastest]
        parts.append(f"saves {format_bytes(f.retained_bytes - cost.retained_bytes)} retained vs "
                     f"{fastest} for +{cost.time_s - f.time_s:.4g} s: the budget binds")
    for o in allowed:
        if o in (chosen, fastest) or fixed:
            continue
        a = seg.options[o]
        parts.append(f"{o} would be {_signed_bytes(a.retained_bytes - cost.retained_bytes)} "
                     f"retained, {a.time_s - cost.time_s:+.4g} s")
    if res.planner == "joint" and OPTIONS.replays(chosen):
        for o in OPTIONS.names:
            if o not in seg.options:
                parts.append(f"no {o} option" + (" (no declared state)" if OPTIONS.journals(o) else ""))
    if res.planner == "state_agnostic" and chosen == OPTIONS.control:
        seen = seg.options.get(RECOMPUTE_ONLY, seg.options[OPTIONS.control])
        parts.append(f"model saw {OPTIONS.control} without preservation: {format_bytes(seen.retained_bytes)}, "
                     f"{seen.time_s:.4g} s")
    if cost.temp_bytes == max_q and max_q > 0:
        parts.append("sets the temporary maximum")
    return "; ".join(parts)


def explain(res: "PlanResult") -> str:
    """Text report of ``res``: summary lines, then one line per segment (see PlanResult)."""
    lines = [f"planner {res.planner} ({res.solver}), budget {format_bytes(res.budget_bytes)} "
             f"({res.budget_bytes} B)"]
    if not res.feasible or res.options is None:
        lines.append(f"INFEASIBLE: no policy fits. Minimum predicted peak over this planner's "
                     f"options is {format_bytes(res.min_feasible_peak_bytes)} "
                     f"({res.min_feasible_peak_bytes} B), "
                     f"{format_bytes(res.min_feasible_peak_bytes - res.budget_bytes)} over budget.")
        counts = Counter(res.min_peak_options)
        lines.append("min-peak policy: " + ", ".join(f"{v}× {k}" for k, v in sorted(counts.items())))
        lines += [f"note: {n}" for n in res.notes]
        return "\n".join(lines)
    verdict = "fits" if res.fits_budget else "EXCEEDS"
    lines.append(f"predicted peak {format_bytes(res.predicted_peak_bytes)} ({verdict} budget; slack "
                 f"{_signed_bytes(res.budget_bytes - res.predicted_peak_bytes)}), predicted time "
                 f"{res.predicted_time_s:.6g} s/step")
    if res.model_peak_bytes is not None and res.model_peak_bytes != res.predicted_peak_bytes:
        lines.append(f"the planner's own model predicted {format_bytes(res.model_peak_bytes)} and "
                     f"{res.model_time_s:.6g} s (preservation costs omitted)")
    lines.append(f"frontier size {res.frontier_size}, truncated {res.truncated}, optimal "
                 f"{res.optimal}, solve {res.solve_time_s * 1e3:.2f} ms")
    lines += [f"note: {n}" for n in res.notes]
    if res.card is None:
        lines += [f"  {n}: {o}" for n, o in zip(res.segment_names, res.options)]
        return "\n".join(lines)
    costs = [s.options[o] for s, o in zip(res.card.segments, res.options)]
    max_q = max(c.temp_bytes for c in costs)
    bound = ("peak" if getattr(res, "peak", "eq3") == "eq3" else
             f"planned by the chain peak {format_bytes(res.chain_peak_bytes)} (the backward chain's "
             "max of base + Σ_{j≤i} r_j + q_i); eq. (3)'s bound")
    lines.append(f"{bound} = persistent {format_bytes(res.persistent_bytes)} + retained "
                 f"{format_bytes(sum(c.retained_bytes for c in costs))} + max temporary "
                 f"{format_bytes(max_q)}")
    width = max(7, max(len(n) for n in res.segment_names))
    lines.append(f"  {'segment':<{width}}  {'option':<6}  {'retained':>11}  {'seconds':>9}  why")
    for i, (name, opt, c) in enumerate(zip(res.segment_names, res.options, costs)):
        lines.append(f"  {name:<{width}}  {opt:<6}  {format_bytes(c.retained_bytes):>11}  "
                     f"{c.time_s:>9.4g}  {_why(res, i, opt, max_q)}")
    return "\n".join(lines)
