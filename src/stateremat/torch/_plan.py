"""``apply_plan``: checkpoint the segments a plan names with the option it chose, in place (§4)."""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from stateremat.contract import OPTIONS

from ._distributed import check_same_plan, every_rank_or_none
from ._module import StatefulCheckpoint
from ._segments import check_submodules, refuse_shared_segments
from ._validate import check_plan_fields, require_module
from ._wrap import apply_option, check_segment_options


def _plan_fields(plan: Any) -> tuple[list[str], list[str]]:
    if isinstance(plan, Mapping):
        missing = [k for k in ("options", "segment_names") if k not in plan]
        if missing:
            raise ValueError(f"apply_plan: plan dict lacks {missing} (expected keys 'options' and "
                             f"'segment_names', got {sorted(plan)}). Tip: pass the PLAN.json the planner wrote.")
        options, names = plan["options"], plan["segment_names"]
    elif not (hasattr(plan, "options") and hasattr(plan, "segment_names")):
        raise TypeError(f"apply_plan: plan must have .options and .segment_names, got {type(plan).__name__}. "
                        "Tip: pass a PlanResult or its PLAN.json dict.")
    else:
        options, names = plan.options, plan.segment_names
    if options is None:
        raise ValueError("apply_plan: the plan is infeasible (options is None: no policy fits its budget). "
                         "Tip: print plan.explain() for the minimum peak, then raise the budget.")
    return list(options), list(names)


def _checked_plan(model: nn.Module, plan: Any, state: Any, segment_options: dict) -> tuple[list[str], list[str]]:
    """The plan's options and segment names, every local check of :func:`apply_plan` passed."""
    require_module(model, "apply_plan")
    options, names = _plan_fields(plan)
    check_plan_fields(options, names)
    if len(options) != len(names):
        raise ValueError(f"apply_plan: plan has {len(options)} options but {len(names)} segment names "
                         "(expected one option per segment). Tip: regenerate the plan for this model.")
    bad = [o for o in options if o not in OPTIONS]
    if bad:
        raise ValueError(f"apply_plan: options must be in {list(OPTIONS.names)}, got {bad}. "
                         "Tip: 'functional' is a fixed method, not a per-segment option.")
    if "" in names:
        raise ValueError("apply_plan: segment '' is the whole model; expected submodule paths. "
                         "Tip: checkpoint a whole model with stateremat.torch.checkpoint(model, x).")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"apply_plan: segment names must be unique, got {dup} more than once (one option "
                         "would silently replace the other). Tip: regenerate the plan for this model.")
    check_submodules(model, names, "apply_plan")
    refuse_shared_segments(model, names, "apply_plan")
    check_segment_options(state, segment_options, "apply_plan")  # not only at the first forward
    return options, names


def apply_plan(model: nn.Module, plan: Any, *, state: Any = "auto", **segment_options: Any) -> nn.Module:
    """Checkpoint each named segment of ``model`` in place with the option the plan chose.

    A segment is wrapped by giving the module an instance ``forward`` that runs its class
    forward under the option (see ``stateremat/torch/_wrap.py``): no wrapper module is inserted,
    so ``named_parameters()`` names, ``state_dict`` keys, attribute access and module hooks stay
    those of the unwrapped model, and hooks run outside the checkpoint (once per step).
    Applying another plan re-wraps; ``"eager"`` unwraps.

    Args:
        model: the model; segment names are module paths (``model.get_submodule(name)``).
        plan: an object with ``.options`` (option names from
            :data:`stateremat.contract.OPTIONS`, one per segment) and ``.segment_names``, or a
            dict with those keys (``PLAN.json``).
        state: ``"auto"`` (default: the state each segment writes, found without a declaration),
            or declared state of every checkpointed segment: ``"buffers"`` (each segment's own
            buffers) or tensors/modules.
        **segment_options: ``granularity_bytes`` (region journal chunk, bytes),
            ``on_undeclared``, ``verify``, ``preserve_rng_state``.

    Returns:
        ``model`` itself (segments changed in place). A segment that is a
        :class:`StatefulCheckpoint` (the older wrapper module) is replaced by the block it wraps,
        which keeps its names.

    Raises:
        ValueError: lengths differ, an option is unknown, the plan is infeasible, a name is not a
            submodule or appears twice, two names are the same module object (``m[0] is m[2]``),
            or the segment is the whole model (name ``""``).
        TypeError: ``plan`` has no options/segment names; an unknown segment option; a bad
            ``state`` entry.
        ValueError: also, before anything is wrapped, an unknown ``state`` string (only
            ``"buffers"``) or a bad ``granularity_bytes``/``on_undeclared``.
        UnsupportedError: at the first forward, a checkpointed segment received a transformers
            KV cache (train with ``use_cache=False``).

    Danger:
        Python side effects in a segment's forward (appending to a list, counters in plain
        attributes) repeat when it replays; see ``stateremat.torch.checkpoint``.

    References:
        Paper §4 (options eager / whole / region per segment).
    """
    with every_rank_or_none("apply_plan"):  # a rank failing its checks: the others raise, not hang
        options, names = _checked_plan(model, plan, state, segment_options)
    check_same_plan(options, names)  # with a process group: the same plan on every rank
    for option, name in zip(options, names):
        sub = model.get_submodule(name)
        if isinstance(sub, StatefulCheckpoint):  # the older wrapper module: put the block back
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, sub.block)
            sub = sub.block
        apply_option(sub, option, name, state, **segment_options)
    return model
