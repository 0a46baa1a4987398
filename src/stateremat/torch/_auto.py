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


def _is_fraction(budget: Any) -> bool:
    return (isinstance(budget, float) and 0 < budget <= 1) or (
        isinstance(budget, str) and budget.strip().endswith("%"))


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
    from stateremat.planner import chain_peak_bytes

    try:
        return chain_peak_bytes(card, options)
    except ValueError as exc:  # the same checks, named by this API
        raise ValueError(str(exc).replace("stateremat.planner.chain_peak_bytes", _API)) from None


def _fit_budget(card: ProfileCard, device: Any) -> tuple[int, str]:
    """``budget="fit"``: the bytes a step may use on the card's device — what is free now plus
    what this process already holds there (the card's persistent bytes are resident)."""
    import torch

    dev = torch.device(device) if device is not None else torch.device(card.meta.get("device", "cpu"))
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        held = torch.cuda.memory_allocated(dev)
        where = f"{dev}: {format_bytes(free)} free + {format_bytes(held)} allocated by torch"
    else:
        free = _host_available_bytes()
        held = card.persistent_bytes
        where = (f"host: {format_bytes(free)} available + {format_bytes(held)} persistent "
                 "(parameters and state already resident)")
    return int(free + held), where


def _host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def auto_checkpoint(model: nn.Module, budget: Any = None, sample: Any = None, segments: Any = None,
                    planner: str = "joint", *, step_fn: Any = None, peak: str = "chain",
                    options: Iterable[Any] = OPTIONS,
                    device: Any = None, repeats: int = 5, state: Any = "auto", optimizers: Iterable[Any] = (),
                    **segment_options: Any):
    """Profile ``model``, plan its segments under ``budget`` and checkpoint them in place.

    Args:
        model: any ``nn.Module``.
        budget: the logical budget ``M`` for one training step (the peak of the whole step,
            parameters and optimizer state included): bytes (int), a size such as ``"8GiB"``, a
            fraction of the measured all-eager peak (``0.6`` or ``"60%"``, in the ``peak``
            model), or ``"fit"``: the least-time plan under the device's free memory (plus what
            the process already holds there). Required: there is no default budget.
        sample: a batch for the default step (see :func:`profile`); or give ``step_fn``.
        segments: module paths, a pattern (``"model.layers.*"``), a container, or ``None`` (the
            model's repeated block).
        planner: ``"joint"`` (eager/whole/region), ``"eager_whole"`` or ``"state_agnostic"``.
        step_fn: ``step_fn(model)`` running a whole training step, instead of ``sample``.
        peak: the peak the budget bounds: ``"chain"`` (default; the peak along the backward
            chain, :func:`expected_peak_bytes`, within a few percent of what is measured) or
            ``"eq3"`` (the paper's looser bound ``P + Σ r + max q``). The plan reports both
            (``chain_peak_bytes``, ``bound_peak_bytes``).
        options, device, repeats, state, optimizers: as in :func:`profile`.
        **segment_options: ``granularity_bytes``, ``on_undeclared``, ``verify``,
            ``preserve_rng_state`` (as in :func:`apply_plan`).

    Returns:
        The :class:`~stateremat.planner.PlanResult` applied (``explain()`` lists each segment's
        option and why; its card is ``plan.card``). A note gives the expected peak
        (:func:`expected_peak_bytes`); ``predicted_peak_bytes`` is the peak in the ``peak``
        model, ``chain_peak_bytes`` and ``bound_peak_bytes`` both.

    Raises:
        ValueError: no policy fits ``budget`` (the model is left unwrapped; the message gives the
            least feasible peak and the all-eager peak, and the exception's ``plan`` attribute is the infeasible
            :class:`~stateremat.planner.PlanResult`, ``plan.card`` the measured card); the chosen
            plan's predicted peak (eq. 3 with the measured costs) exceeds ``budget`` although the
            planner's own model admitted it (``state_agnostic``; the message quotes the true
            peak, ``plan`` is that PlanResult); a bad budget, both or neither of
            ``sample``/``step_fn``, no budget at all, and the errors of :func:`profile`.

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

    fit = _check_arguments(model, budget, sample, step_fn, peak)
    options = [getattr(o, "name", o) for o in options]
    if planner == "state_agnostic" and RECOMPUTE_ONLY not in options:
        options.append(RECOMPUTE_ONLY)
    card = profile(model, segments, step_fn if step_fn is not None else sample, options=options, device=device,
                   repeats=repeats, state=state, optimizers=optimizers, **segment_options)
    fit_note = None
    if fit:
        budget, where = _fit_budget(card, device)
        fit_note = f"budget 'fit' = {format_bytes(budget)} ({budget} B): {where}"
    try:
        res = make_plan(card, budget, planner=planner, peak=peak)
    except ValueError as e:  # a percentage out of range
        raise ValueError(f"{_API}: bad budget {budget!r} ({e}).") from None
    if fit_note is not None:
        res = dataclasses.replace(res, notes=[fit_note, *res.notes])
    if not res.feasible or res.options is None:
        raise _nothing_fits(card, res, peak)
    expected = expected_peak_bytes(card, res.options)
    if not res.fits_budget:  # feasible in the planner's own model (state_agnostic omits preservation)
        raise _over_budget(res, planner, peak, expected)
    bound = res.bound_peak_bytes
    note = (f"planned by the {peak} peak: expected peak {format_bytes(expected)} ({expected} B) when the "
            f"segments run as a chain; eq. (3)'s bound P + Σ r + max q is {format_bytes(bound)} ({bound} B)")
    res = dataclasses.replace(res, notes=[*res.notes, note])
    apply_plan(model, res, state=state, **segment_options)
    return res


def _check_arguments(model: Any, budget: Any, sample: Any, step_fn: Any, peak: str) -> bool:
    """Refuse bad arguments before any work; True when ``budget`` is ``"fit"``."""
    require_module(model, _API)
    if budget is None:
        raise ValueError(f"{_API}: a budget is required (there is no default); got none. Tip: "
                         "auto_checkpoint(model, '8GiB', sample=batch), a fraction of the eager peak "
                         "(0.6 or '60%'), or 'fit' for the least-time plan under the device's free memory.")
    if (sample is None) == (step_fn is None):
        raise ValueError(f"{_API}: pass exactly one of sample= (a batch) and step_fn= (a training step); got "
                         f"{'both' if sample is not None else 'neither'}. Tip: auto_checkpoint(model, '8GiB', sample=batch).")
    fit = isinstance(budget, str) and budget.strip().lower() == "fit"
    if peak not in ("chain", "eq3"):
        raise ValueError(f"{_API}: peak must be 'chain' or 'eq3', got {peak!r}. Tip: 'chain' (the "
                         "default) is the peak that happens; 'eq3' the paper's bound.")
    if not fit:
        try:
            if not _is_fraction(budget):
                parse_size(budget)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{_API}: bad budget {budget!r} ({e}). Tip: bytes, a size such as '8GiB', "
                             "a fraction of the eager peak (0.6 or '60%'), or 'fit'.") from None
    return fit


def _nothing_fits(card: ProfileCard, res: Any, peak: str) -> ValueError:
    """The refusal when no policy fits: least feasible and all-eager peaks in both models."""
    budget_bytes = res.budget_bytes
    from stateremat.planner import chain_peak_bytes, plan as _p

    eager_opts = [OPTIONS.baseline] * len(card.segments)
    eager_chain = chain_peak_bytes(card, eager_opts)
    eager_bound = _p(card, 2**53, OPTIONS.baseline).predicted_peak_bytes
    err = ValueError(f"{_API}: no checkpoint plan fits the budget {format_bytes(budget_bytes)} "
                     f"({budget_bytes} B, {peak} peak); the least feasible peak is "
                     f"{format_bytes(res.min_feasible_peak_bytes)} ({res.min_feasible_peak_bytes} B) with "
                     f"{res.min_peak_options}, and all-eager peaks at {format_bytes(eager_chain)} "
                     f"({eager_chain} B) as a chain, {format_bytes(eager_bound)} ({eager_bound} B) by "
                     "eq. (3). The model is unchanged. Tip: raise the budget to at least the least "
                     "feasible peak, use smaller segments or a smaller batch.")
    err.plan = res  # the infeasible PlanResult, its card included (plan.card)
    return err


def _over_budget(res: Any, planner: str, peak: str, expected: int) -> ValueError:
    """The refusal of a plan feasible in its planner's own model but over the budget with real costs."""
    budget_bytes = res.budget_bytes
    err = ValueError(f"{_API}: planner {planner!r} chose {res.options}, whose predicted peak "
                     f"{format_bytes(res.predicted_peak_bytes)} ({res.predicted_peak_bytes} B; the {peak} peak with "
                     f"the measured costs, preservation included; {format_bytes(expected)} ({expected} B) as a "
                     f"chain, {format_bytes(res.bound_peak_bytes)} ({res.bound_peak_bytes} B) by eq. (3)) exceeds the budget {format_bytes(budget_bytes)} ({budget_bytes} B)"
                     + (" — its own cost model omits preservation" if res.model_peak_bytes is not None
                and res.model_peak_bytes != res.predicted_peak_bytes else "")
                     + ". The model is unchanged. Tip: use planner='joint' (or 'eager_whole'), or raise "
                     "the budget.")
    err.plan = res  # the over-budget PlanResult, its card included (plan.card)
    return err
