"""Which rebindings belong to a parallelism framework, not to the user (issue 24).

The replay reads a module's bindings as of the forward (``_bindings.end_bindings_as_of``,
``Bindings``): a user's own rebinding between forward and backward (``m.q = m.q * 0.3``) must not
change what the replay differentiates, and one inside a segment's forward is refused or replayed
as of the forward's start. Parameters that a framework swaps between forward and backward are
the framework's, not user state: FSDP2's ``fully_shard`` binds each managed parameter to its
sharded ``DTensor`` between forward and backward (reshard) and to the gathered tensor while the
unit runs (unshard, again in its pre-backward hook); tensor parallelism binds ``DTensor``
parameters whose placement it redistributes. Binding the forward's sharded ``DTensor`` back would
mix it with the gathered inputs (``aten.addmm.default got mixed torch.Tensor and DTensor``).

The rule: a change of a module's **parameter** slot where the tensor bound before or after is a
``DTensor`` is the framework's. The replay then uses what the framework binds at backward, the
change is not reported as an undeclared rebinding, and it is not undone or replayed. Every other
change of a binding — buffers, tensor attributes, submodules, and parameters that are plain
tensors on both sides — is the user's and replays as of the forward, as before. The test is on
the values only: it needs no FSDP internals, holds whichever modules a segment reaches (the unit
itself or a layer inside it), and loads nothing (``torch.distributed.tensor`` is looked up only
once something imported it; without it no tensor can be a ``DTensor``).

Writes, too: an op of FSDP2's own namespace (``torch.ops.fsdp.*``, its all-gather copies into
its parameter buffers, run again when it re-gathers at a replay) writes the framework's storage,
not the segment's state (:func:`framework_op`, asked by ``_mode.StrictMode``). And a model whose
framework runs collectives of its own (:func:`runs_collectives`) changes how a failing rank
leaves ``profile`` (``_distributed.every_rank_or_none``).
"""
from __future__ import annotations

import sys
from typing import Any, Iterable

from ._compat import is_dtensor as _is_dtensor


def framework_swap(table: str, before: Any, after: Any) -> bool:
    """True if rebinding slot ``table`` (``"_parameters"``, ``"_buffers"``, ``"__dict__"``, ...)
    from ``before`` to ``after`` (either may be ``None``: unbound) is a framework's parameter swap."""
    return table == "_parameters" and (_is_dtensor(before) or _is_dtensor(after))


# -- what profiling leaves to the framework (``ModelSnapshot``) -------------------------------
#
# ``profile`` runs whole training steps and then puts the model back (``_snapshot.ModelSnapshot``).
# A parallelism framework's own bookkeeping is not the model's state: FSDP2's ``FSDPState`` (root
# flag, contexts, param groups, prefetch lists), set up once at the first forward (lazy init) and
# kept in the module's composable-API state. Putting it back as it was before the first forward
# makes FSDP2 initialise a second time ("Parameter ... is shared with a parameter already managed
# by another FSDP group"); it is left as the framework has it. FSDP2's unsharded parameters (bound
# while a unit is unsharded, such as the root after a forward under ``no_grad``) are storage the
# framework frees and refills: the snapshot saves and restores the sharded parameters instead
# (every unit resharded first, with the public ``FSDPModule.reshard``) and unshards those units
# again afterwards (``FSDPModule.unshard``, a collective every rank runs, as profiling's steps are).

_STATE_KEY = "__composable_api_state_key"


def _framework_roots(modules: Iterable[Any]) -> list[Any]:
    """Each module's composable-API state (``fully_shard``'s, ``replicate``'s) and registry."""
    cs = sys.modules.get("torch.distributed._composable_state")
    roots = []
    for m in modules:
        roots += [v for k, v in vars(m).items() if k.startswith(_STATE_KEY)]
        state = cs._get_module_state(m) if cs is not None else None
        if state is not None and state is not m:
            roots.append(state)
    return roots


def framework_objects(modules: Iterable[Any]) -> set[int]:
    """``id`` of every container and plain object the framework keeps about ``modules`` (walked
    from their composable-API state through containers and attributes; modules, tensors and
    plain values end the walk)."""
    import torch
    from torch import nn

    seen: set[int] = set()
    stack = _framework_roots(modules)
    while stack:
        v = stack.pop()
        if id(v) in seen or isinstance(v, (nn.Module, torch.Tensor, str, bytes, int, float, type)) or v is None:
            continue
        if isinstance(v, dict):
            stack += list(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack += list(v)
        elif isinstance(getattr(v, "__dict__", None), dict) and type(v).__module__.startswith("torch."):
            stack += list(vars(v).values())
        else:
            continue
        seen.add(id(v))
    return seen


def framework_op(func: Any) -> bool:
    """An op of FSDP2's own (``torch.ops.fsdp.*``: its all-gather copies into its parameter buffers,
    run again when it re-gathers at a replay): the framework's storage, not the segment's state."""
    return getattr(func, "namespace", None) == "fsdp"


def fsdp_units(model: Any) -> list[Any]:
    """The model's FSDP2 units (``FSDPModule`` instances), outermost first; none unless
    ``torch.distributed.fsdp`` was imported."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None)
    return [m for m in model.modules() if isinstance(m, kind)] if kind is not None else []


def fsdp_unsharded_grads(model: Any) -> list[tuple[Any, Any, Any]]:
    """``(fsdp_param, unsharded grad, accumulated grad)`` for every parameter of the model's FSDP2
    units: the gradients FSDP2 keeps on its unsharded parameters, not on the sharded ones, while
    gradient sync is off (``set_requires_gradient_sync(False)``); copies, for
    :func:`restore_unsharded_grads`."""
    out = []
    for u in fsdp_units(model):
        for group in getattr(u._get_fsdp_state(), "_fsdp_param_groups", []):
            for fp in group.fsdp_params:
                unsharded = getattr(fp, "_unsharded_param", None)
                grad = None if unsharded is None else unsharded.grad
                acc = getattr(fp, "unsharded_accumulated_grad", None)
                out.append((fp, None if grad is None else grad.detach().clone(),
                            None if acc is None else acc.detach().clone()))
    return out


def restore_unsharded_grads(saved: Iterable[tuple[Any, Any, Any]]) -> None:
    """Put back what :func:`fsdp_unsharded_grads` saved: a gradient a no-sync backward left on an
    unsharded parameter would otherwise be reduced into the next real step."""
    for fp, grad, acc in saved:
        unsharded = getattr(fp, "_unsharded_param", None)
        if unsharded is not None:
            unsharded.grad = grad
        if hasattr(fp, "unsharded_accumulated_grad"):
            fp.unsharded_accumulated_grad = acc


def runs_collectives(model: Any) -> bool:
    """Whether ``model``'s own forward and backward run collectives of a parallelism framework:
    it is (or holds) a ``DistributedDataParallel``, an FSDP2 unit, or ``DTensor`` parameters
    (tensor parallelism). A rank failing inside a step of such a model must not wait in a
    collective of ours: the others wait in the framework's (issue 24)."""
    ddp = getattr(sys.modules.get("torch.nn.parallel"), "DistributedDataParallel", None)
    mods = list(model.modules())
    if ddp is not None and any(isinstance(m, ddp) for m in mods):
        return True
    return bool(fsdp_units(model)) or any(_is_dtensor(p) for p in model.parameters())


def reshard_units(model: Any) -> list[Any]:
    """Reshard every FSDP2 unit of ``model`` whose own parameters are bound unsharded (plain
    tensors where FSDP2 binds its sharded ``DTensor`` between steps); returns those units, for
    :func:`unshard_units` to bring back."""
    units = fsdp_units(model)
    ids = {id(u) for u in units}
    out = []
    for u in units:
        mods, own = [u], []
        while mods:
            m = mods.pop()
            own += [p for p in m._parameters.values() if p is not None]
            mods += [c for c in m.children() if id(c) not in ids]
        if any(not _is_dtensor(p) for p in own):
            u.reshard()
            out.append(u)
    return out


def unshard_units(units: Iterable[Any]) -> None:
    """Unshard ``units`` again (their parameters all-gathered from the restored shards)."""
    for u in units:
        u.unshard()
