"""Generator state capture and replay: default CPU/CUDA generators and user generators (R3, R5).

A segment may draw from the default generators or from a ``torch.Generator`` it reaches
(a captured ``g``, a module attribute, an argument) or declares in ``state=``. All of them are
captured when the forward begins, set back for the replay, and reinstated afterwards, so the
replay draws the forward's numbers and the visible generator state advances once per step.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch


@dataclass(frozen=True)
class RngState:
    """Generator states: CPU ``uint8`` state, one per CUDA device (``None`` if CUDA is unused),
    and ``(generator, state)`` for every user generator."""

    cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...] | None
    user: tuple[tuple[torch.Generator, torch.Tensor], ...] = ()


def cuda_ready() -> bool:
    """True if CUDA is initialized (never initializes it by accident).

    ``is_initialized`` implies a usable device; ``is_available`` (a driver query, microseconds per
    call on every segment) would add nothing."""
    return torch.cuda.is_initialized()


def capture(generators: Iterable[torch.Generator] = ()) -> RngState:
    """Return the current generator states (default generators plus ``generators``)."""
    cuda = tuple(torch.cuda.get_rng_state_all()) if cuda_ready() else None
    return RngState(torch.get_rng_state(), cuda, tuple((g, g.get_state()) for g in generators))


def restore(state: RngState) -> None:
    """Set the generators to ``state``."""
    torch.set_rng_state(state.cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state_all(list(state.cuda))
    for g, s in state.user:
        g.set_state(s)


@contextlib.contextmanager
def replayed(state: RngState | None) -> Iterator[None]:
    """Run with generators at ``state`` (the forward's R0), then reinstate the visible state.

    ``state=None`` (``preserve_rng_state=False``) leaves the generators alone: the replay draws
    fresh numbers, as ``torch.utils.checkpoint`` does; a negative control.
    """
    if state is None:
        yield
        return
    visible = capture(g for g, _ in state.user)
    restore(state)
    try:
        yield
    finally:
        restore(visible)
