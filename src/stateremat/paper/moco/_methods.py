"""The seven dense-queue methods as ways of wrapping the MoCo model's seven segments.

eager (strict, no recomputation) · whole (every segment replayed from a whole snapshot of its
buffers) · regions (replayed from a journal of written regions) · functional (every segment
checkpointed with its buffers threaded out-of-place) · deferred (eager, enqueue after backward and
update) · state_agnostic / joint (a plan over the measured profile card, applied with
``apply_plan``). Paper §12.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _torch_checkpoint

from stateremat.contract import OPTIONS

from .. import METHOD_OPTION
from ..workloads import MOCO_SEGMENTS as SEGMENTS, MoCo
from ._summary import METHODS

__all__ = ["METHODS", "FIXED_POLICY", "FunctionalSegment", "apply_method", "unwrap"]

#: method -> the option every segment runs (the fixed methods' from :data:`METHOD_OPTION`).
FIXED_POLICY = {**METHOD_OPTION, "functional": "functional", "deferred": OPTIONS.baseline}


class FunctionalSegment(nn.Module):
    """Checkpoint ``module`` with its buffers threaded out-of-place (the functional method).

    Forward passes the current buffers as checkpoint inputs, runs ``module`` on fresh copies
    (``torch.func.functional_call``), returns the copies as the new state and rebinds the
    module's buffers to them. The old buffer tensors are never written, so the replay in backward
    reads exactly the bytes the forward read (rule R1) at the price of keeping them alive until
    backward — the functional reference of paper §5.

    Args:
        module: the segment; its buffers are its state.

    Danger:
        State must live in registered buffers; a tensor attribute that is not a buffer is not
        threaded and would be replayed from its mutated value.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.names = [n for n, _ in module.named_buffers()]

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.module(*args)
        n_args, names = len(args), self.names

        def run(*inputs: Any) -> tuple[Any, ...]:
            fresh = {n: s.clone() for n, s in zip(names, inputs[n_args:])}
            out = torch.func.functional_call(self.module, fresh, inputs[:n_args])
            return (out, *(fresh[n] for n in names))

        state = [self.module.get_buffer(n) for n in names]
        out, *new_state = _torch_checkpoint(run, *args, *state, use_reentrant=False)
        for n, t in zip(names, new_state):
            owner, _, leaf = n.rpartition(".")
            self.module.get_submodule(owner)._buffers[leaf] = t  # rebind, never write in place
        return out


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
    owner, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, leaf, module)


def apply_method(model: MoCo, method: str, plan: Any = None) -> tuple[dict[str, nn.Module], list[str]]:
    """Wrap ``model``'s segments in place for ``method``.

    Args:
        model: a fresh :class:`MoCo` (``queue.mode`` must be ``"deferred"`` iff ``method`` is).
        method: one of :data:`METHODS`.
        plan: for ``state_agnostic``/``joint``, a planner result with ``options`` and
            ``segment_names`` (applied by ``stateremat.torch.apply_plan``).

    Returns:
        ``(originals, policy)``: the unwrapped segment modules by path (for :func:`unwrap`) and
        the option used per segment, in :data:`SEGMENTS` order.

    Raises:
        ValueError: unknown method, or a planner method without a plan.
    """
    if method not in METHODS:
        raise ValueError(f"apply_method: unknown method {method!r}; expected one of {METHODS}. "
                         "Tip: see paper §12 for the seven methods.")
    originals = {p: model.get_submodule(p) for p in SEGMENTS}
    if method in ("eager", "deferred"):
        return originals, [OPTIONS.baseline] * len(SEGMENTS)
    if method == "functional":
        for p, m in originals.items():
            _set(model, p, FunctionalSegment(m))
        return originals, ["functional"] * len(SEGMENTS)
    from ...torch import StatefulCheckpoint, apply_plan  # optional layer, imported lazily

    if method in METHOD_OPTION:  # eager was handled above: the replaying fixed methods
        for p, m in originals.items():
            # BatchNorm running statistics, queue rows and the ring pointer are all buffers.
            _set(model, p, StatefulCheckpoint(m, state="buffers", preserve=FIXED_POLICY[method]))
        return originals, [FIXED_POLICY[method]] * len(SEGMENTS)
    if plan is None:
        raise ValueError(f"apply_method: method {method!r} needs a plan. Tip: plan the measured "
                         "profile card first (stateremat.planner.plan).")
    apply_plan(model, plan, state="buffers")  # as profiled
    by_name = dict(zip(plan.segment_names, plan.options))
    return originals, [str(by_name.get(p, OPTIONS.baseline)) for p in SEGMENTS]


def unwrap(model: nn.Module, originals: dict[str, nn.Module]) -> None:
    """Put the original segment modules back (after training, before the probe)."""
    for p, m in originals.items():
        _set(model, p, m)
    from stateremat.torch import apply_plan  # planner methods checkpoint segments in place: undo that too

    apply_plan(model, {"options": [OPTIONS.baseline] * len(originals), "segment_names": list(originals)})


def segment_paths() -> Sequence[str]:
    """Module paths of the seven segments, in forward order."""
    return SEGMENTS
