"""Generator state capture and replay: CPU and every initialized CUDA device (R3, R5)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch


@dataclass(frozen=True)
class RngState:
    """Default-generator states: CPU ``uint8`` state and one per CUDA device (``None`` if CUDA is unused)."""

    cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...] | None


def cuda_ready() -> bool:
    """True if CUDA is initialized (never initializes it by accident)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def capture() -> RngState:
    """Return the current generator states."""
    cuda = tuple(torch.cuda.get_rng_state_all()) if cuda_ready() else None
    return RngState(torch.get_rng_state(), cuda)


def restore(state: RngState) -> None:
    """Set the generators to ``state``."""
    torch.set_rng_state(state.cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state_all(list(state.cuda))


@contextlib.contextmanager
def replayed(state: RngState | None) -> Iterator[None]:
    """Run with generators at ``state`` (the forward's R0), then reinstate the visible state.

    ``state=None`` (``preserve_rng_state=False``) leaves the generators alone: the replay draws
    fresh numbers, as ``torch.utils.checkpoint`` does; a negative control.
    """
    if state is None:
        yield
        return
    visible = capture()
    restore(state)
    try:
        yield
    finally:
        restore(visible)
