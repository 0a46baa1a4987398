"""``auto_checkpoint``: profile, plan and apply in one call; the expected peak of a plan (§4)."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from torch import nn

from stateremat.contract import OPTIONS, RECOMPUTE_ONLY, ProfileCard, format_bytes, parse_size

from ._plan import apply_plan
from ._profiler import profile
from ._validate import require_module

_API = "stateremat.torch.auto_checkpoint"


def expected_peak_bytes(card: ProfileCard, options: list[str]) -> int:
    """Peak of a training step under ``options`` when the segments run as a chain (bytes).

    Eq. (3)'s ``P + Σ r + max q`` charges every segment's retained bytes at the moment of the
    largest temporary; in a chain, segment ``i``'s backward runs after the later segments
    released theirs. With the parts a :func:`profile` card records in ``meta["persistent"]``
    (live bytes at the first segment's entry, ``base``; the peaks outside the segments), this is
    ``max(base + max_i (Σ_{j≤i} r_j + q_i), peaks outside the segments)`` (the last segment's
    ``q`` includes the head and loss) — at most eq. (3)'s value. Cards without that record fall
    back to ``P`` as the base.

    Args:
        card: a profile card.
        options: one option name per card segment.

    Returns:
        Bytes.

    Raises:
        ValueError: ``options`` does not match the card's segments or names an unmeasured option.

    References:
        Paper §4, eq. (3) (the bound this refines for a chain of segments).
    """
    if len(options) != len(card.segments):
        raise ValueError(f"{_API}: {len(options)} options for {len(card.segments)} card segments. "
                         "Tip: pass plan.options of a plan made on this card.")
    parts = card.meta.get("persistent", {})
    base = parts.get("first_segment_entry_bytes", card.persistent_bytes)
    running, top = 0, 0
    for seg, o in zip(card.segments, options):
        if o not in seg.options:
            raise ValueError(f"{_API}: segment {seg.name!r} has no measured {o!r} option (it has "
                             f"{list(seg.options)}). Tip: plan on this card.")
        cost = seg.options[o]
        running += cost.retained_bytes
        top = max(top, running + cost.temp_bytes)
    outside = max(parts.get("before_first_segment_peak_bytes", 0), parts.get("after_backward_peak_bytes", 0))
    return max(base + top, outside)


def auto_checkpoint(model: nn.Module, budget: Any = "8GiB", sample: Any = None, segments: Any = None,
                    planner: str = "joint", *, step_fn: Any = None, options: Iterable[Any] = OPTIONS,
                    device: Any = None, repeats: int = 5, state: Any = "buffers", optimizers: Iterable[Any] = (),
                    **segment_options: Any):
    """Profile ``model``, plan its segments under ``budget`` and checkpoint them in place.

    Args:
        model: any ``nn.Module``.
        budget: the logical budget ``M`` for one training step: bytes (int) or a size such as
            ``"8GiB"`` (the peak of the whole step, parameters and optimizer state included).
        sample: a batch for the default step (see :func:`profile`); or give ``step_fn``.
        segments: module paths, a pattern (``"model.layers.*"``), a container, or ``None`` (the
            model's repeated block).
        planner: ``"joint"`` (eager/whole/region), ``"eager_whole"`` or ``"state_agnostic"``.
        step_fn: ``step_fn(model)`` running a whole training step, instead of ``sample``.
        options, device, repeats, state, optimizers: as in :func:`profile`.
        **segment_options: ``granularity_bytes``, ``on_undeclared``, ``verify``,
            ``preserve_rng_state`` (as in :func:`apply_plan`).

    Returns:
        The :class:`~stateremat.planner.PlanResult` applied (``explain()`` lists each segment's
        option and why; its card is ``plan.card``). A note gives the expected peak
        (:func:`expected_peak_bytes`); ``predicted_peak_bytes`` is eq. (3)'s bound.

    Raises:
        ValueError: no policy fits ``budget`` (the model is left unwrapped; the message gives the
            minimum predicted peak and the exception's ``plan`` attribute is the infeasible
            :class:`~stateremat.planner.PlanResult`, ``plan.card`` the measured card); the chosen
            plan's predicted peak (eq. 3 with the measured costs) exceeds ``budget`` although the
            planner's own model admitted it (``state_agnostic``; the message quotes the true
            peak, ``plan`` is that PlanResult); a bad budget, both or neither of
            ``sample``/``step_fn``, and the errors of :func:`profile`.

    Danger:
        The plan is as good as the profiled step: a different batch size or sequence length
        changes every byte. When segments share declared state (the same buffer in several
        segments) a mixed plan needs :func:`stateremat.torch.journal_writes` around the forward
        (R6), or the replay is refused. Python side effects inside a replayed segment repeat
        unless guarded by :func:`stateremat.torch.is_replaying`.

    References:
        Paper §4 (profile, eq. 3, plan).
    """
    from stateremat.planner import plan as make_plan

    require_module(model, _API)
    if (sample is None) == (step_fn is None):
        raise ValueError(f"{_API}: pass exactly one of sample= (a batch) and step_fn= (a training step); got "
                         f"{'both' if sample is not None else 'neither'}. Tip: auto_checkpoint(model, '8GiB', sample=batch).")
    try:
        budget_bytes = parse_size(budget)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{_API}: bad budget {budget!r} ({e}). Tip: bytes or a size such as '8GiB'.") from None
    options = [getattr(o, "name", o) for o in options]
    if planner == "state_agnostic" and RECOMPUTE_ONLY not in options:
        options.append(RECOMPUTE_ONLY)
    card = profile(model, segments, step_fn if step_fn is not None else sample, options=options, device=device,
                   repeats=repeats, state=state, optimizers=optimizers, **segment_options)
    res = make_plan(card, budget_bytes, planner=planner)
    if not res.feasible or res.options is None:
        err = ValueError(f"{_API}: no checkpoint plan fits the budget {format_bytes(budget_bytes)} "
                         f"({budget_bytes} B); the smallest predicted peak is "
                         f"{format_bytes(res.min_feasible_peak_bytes)} ({res.min_feasible_peak_bytes} B) with "
                         f"{res.min_peak_options}. The model is unchanged. Tip: raise the budget, use smaller "
                         "segments or a smaller batch.")
        err.plan = res  # the infeasible PlanResult, its card included (plan.card)
        raise err
    expected = expected_peak_bytes(card, res.options)
    if not res.fits_budget:  # feasible in the planner's own model (state_agnostic omits preservation)
        err = ValueError(f"{_API}: planner {planner!r} chose {res.options}, whose predicted peak "
                         f"{format_bytes(res.predicted_peak_bytes)} ({res.predicted_peak_bytes} B; eq. (3) with the "
                         f"measured costs, preservation included; expected {format_bytes(expected)} ({expected} B) "
                         f"as a chain) exceeds the budget {format_bytes(budget_bytes)} ({budget_bytes} B)"
                         + (" — its own cost model omits preservation" if res.model_peak_bytes is not None
                            and res.model_peak_bytes != res.predicted_peak_bytes else "")
                         + ". The model is unchanged. Tip: use planner='joint' (or 'eager_whole'), or raise "
                         "the budget.")
        err.plan = res  # the over-budget PlanResult, its card included (plan.card)
        raise err
    note = (f"expected peak {format_bytes(expected)} ({expected} B) when the segments run as a chain; "
            f"predicted_peak_bytes is eq. (3)'s bound P + Σ r + max q")
    res = dataclasses.replace(res, notes=[*res.notes, note])
    apply_plan(model, res, state=state, **segment_options)
    return res
