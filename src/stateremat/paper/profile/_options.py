"""Wrap one segment module with a checkpoint option (eager, whole, region, recompute_only).

The executable options of a plan are those of :data:`stateremat.contract.OPTIONS` (run by
``stateremat.torch``); ``recompute_only`` exists only to *measure* what replay costs without any state preservation
(the cost the ``state_agnostic`` control believes ``whole`` has). It wraps the segment in plain
``torch.utils.checkpoint`` — which replays the state writes a second time, so it is never used
to train, only to profile (card docstring: "never executed").
"""
from __future__ import annotations

import torch
from torch import nn

from ...contract import OPTIONS, RECOMPUTE_ONLY, card_options


class RecomputeOnly(nn.Module):
    """Profiling-only wrapper: ``torch.utils.checkpoint`` with nothing preserved.

    Danger:
        A stateful segment replays against mutated state and writes it twice; gradients are
        wrong for stateful segments. Used only to measure the cost of replay without
        preservation (profile card option ``recompute_only``).
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        from torch.utils.checkpoint import checkpoint as tcheckpoint

        return tcheckpoint(self.module, *args, use_reentrant=False, **kwargs)


def wrap_segment(module: nn.Module, option: str, *, granularity_bytes: int | None = None,
                 name: str = "segment") -> nn.Module:
    """``module`` under checkpoint ``option``, its declared state its buffers.

    A registered option is applied in place by :func:`stateremat.torch.apply_plan` (which alone
    decides what each option wraps: ``eager`` leaves the module's own forward), so the module
    itself comes back; ``recompute_only`` comes back inside a :class:`RecomputeOnly`.

    Args:
        module: a segment whose declared state is its buffers.
        option: a registered option (``eager``, ``whole``, ``region``, ...) or ``recompute_only``.
        granularity_bytes: region journal granularity, bytes (``region`` only).
        name: the segment's name in errors (a module attribute name, no dots).

    Returns:
        The module to call in place of ``module``.

    Raises:
        ValueError: on an unknown option.
    """
    if option == RECOMPUTE_ONLY:
        return RecomputeOnly(module)
    if option not in OPTIONS:
        raise ValueError(f"wrap_segment: option {option!r} is not one of {list(card_options())}. "
                         "Tip: plans use the options registered in stateremat.contract.OPTIONS.")
    from stateremat.torch import apply_plan

    holder = nn.Module()  # apply_plan names segments by module path: this one's is ``name``
    holder.add_module(name, module)
    apply_plan(holder, {"options": [option], "segment_names": [name]}, state="buffers",
               granularity_bytes=granularity_bytes)
    return module


def preserved_now() -> int | None:
    """Bytes held for state preservation right now (snapshots + journals), if reported.

    Reads ``stateremat.torch.preservation_stats()``; ``None`` when that is unavailable.
    """
    try:
        from stateremat.torch import preservation_stats
    except ImportError:
        return None
    return int(preservation_stats().retained_state_bytes)


def journal_scope(enabled: bool = True):
    """Context in which every write to a journaled declared tensor is journaled (R6).

    A region journal must also hold the old bytes of *later* writes that destroy state its
    segment needs — including writes by eager (unwrapped) or whole-snapshot segments, which push
    no journaling mode of their own. This enters :func:`stateremat.torch.journal_writes` around a
    whole forward pass; without it mixed plans (region followed by eager/whole writers) are
    refused by the checkpoint with a ``ReplayError`` (version gap, R8), never silently wrong.
    """
    import contextlib

    from stateremat.torch import journal_writes

    return journal_writes() if enabled else contextlib.nullcontext()


def sync(device: torch.device) -> None:
    """Wait for queued device work (wall time is synchronized on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
