"""``apply_plan``: wrap the segments a plan names with the preservation option it chose (§4)."""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from ._module import StatefulCheckpoint

PLAN_OPTIONS = ("eager", "whole", "region")


def _plan_fields(plan: Any) -> tuple[list[str], list[str]]:
    if isinstance(plan, Mapping):
        missing = [k for k in ("options", "segment_names") if k not in plan]
        if missing:
            raise ValueError(f"apply_plan: plan dict lacks {missing} (expected keys 'options' and "
                             f"'segment_names', got {sorted(plan)}). Tip: pass the PLAN.json the planner wrote.")
        return list(plan["options"]), list(plan["segment_names"])
    if not (hasattr(plan, "options") and hasattr(plan, "segment_names")):
        raise TypeError(f"apply_plan: plan must have .options and .segment_names, got {type(plan).__name__}. "
                        "Tip: pass a PlanResult or its PLAN.json dict.")
    return list(plan.options), list(plan.segment_names)


def apply_plan(model: nn.Module, plan: Any, *, state: Any = "buffers", **wrapper_kwargs: Any) -> nn.Module:
    """Wrap each named segment of ``model`` with :class:`StatefulCheckpoint` using the plan's option.

    Args:
        model: the model; segment names are module paths (``model.get_submodule(name)``).
        plan: an object with ``.options`` (one of ``"eager" | "whole" | "region"`` per segment) and
            ``.segment_names``, or a dict with those keys (``PLAN.json``).
        state: declared state of every wrapped segment (default: all its buffers).
        **wrapper_kwargs: passed to :class:`StatefulCheckpoint` (``granularity_bytes``, ``verify``...).

    Returns:
        ``model`` with segments replaced in place (``"eager"`` segments are left unwrapped; a
        segment already wrapped is re-wrapped with the new option). If a segment name is
        ``""`` (the whole model) the wrapper is returned instead.

    Raises:
        ValueError: lengths differ, an option is unknown, or a name is missing from ``model``.

    References:
        Paper §4 (options eager / whole / region per segment).
    """
    options, names = _plan_fields(plan)
    if len(options) != len(names):
        raise ValueError(f"apply_plan: plan has {len(options)} options but {len(names)} segment names "
                         "(expected one option per segment). Tip: regenerate the plan for this model.")
    bad = [o for o in options if o not in PLAN_OPTIONS]
    if bad:
        raise ValueError(f"apply_plan: options must be in {PLAN_OPTIONS}, got {bad}. "
                         "Tip: 'functional' is a fixed method, not a per-segment option.")
    for name in names:
        try:
            model.get_submodule(name)
        except AttributeError as e:
            raise ValueError(f"apply_plan: segment {name!r} is not a submodule of {type(model).__name__} "
                             f"({e}). Tip: segment names are module paths as in model.named_modules().") from e
    for option, name in zip(options, names):
        sub = model.get_submodule(name)
        block = sub.block if isinstance(sub, StatefulCheckpoint) else sub
        new = block if option == "eager" else StatefulCheckpoint(
            block, state=state, preserve=option, name=name, **wrapper_kwargs)
        if name == "":
            model = new
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    return model
