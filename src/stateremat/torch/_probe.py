"""A timeline of one training step at segment boundaries: forward entry/exit and backward
start/end of every segment, with wall time, live bytes and the peak since the previous event."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ._compat import queue_backward_callback, tree_flatten
from ._memory import PeakMemory
from ._step import sync

_API = "stateremat.torch.profile"


@dataclass(frozen=True)
class Event:
    """One boundary: ``kind`` in start/fwd_enter/fwd_exit/bwd_start/bwd_end/bwd_done (the
    backward pass finished)/end, segment index
    (-1 for start/end), wall time (s), live bytes, peak bytes since the previous event and bytes
    held for state preservation (snapshots and journals, :func:`preservation_stats`)."""

    kind: str
    index: int
    time_s: float
    live_bytes: int
    peak_bytes: int
    preserved_bytes: int = 0


def _grad_leaves(obj: Any) -> list[torch.Tensor]:
    if hasattr(obj, "to_tuple"):  # transformers ModelOutput
        obj = obj.to_tuple()
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor) and t.requires_grad]


class Probe:
    """Records :class:`Event` s; installed as ``SegmentForward.probe`` on every segment.

    Args:
        names: segment names in forward order.
        device: where the step runs (CUDA is synchronized at every event).
        memory: a :class:`PeakMemory` that is active during the step, or ``None`` (timing only).
        ordered: refuse a step whose segments start in another order than ``names`` (the card's
            chain order, learned from the first probed step); ``False`` only records it.

    Attributes:
        order: indices of the segments in the order their forwards started.
    """

    def __init__(self, names: list[str], device: torch.device, memory: PeakMemory | None,
                 ordered: bool = True) -> None:
        self.index = {n: i for i, n in enumerate(names)}
        self.device = device
        self.memory = memory
        self.ordered = ordered
        self.events: list[Event] = []
        self.order: list[int] = []
        self._entered: set[int] = set()
        self._started: set[int] = set()
        self._handles: list[Any] = []

    def event(self, kind: str, index: int = -1) -> None:
        sync(self.device)
        now = time.perf_counter()
        live = peak = preserved = 0
        if self.memory is not None:
            live = self.memory.current_bytes
            peak = self.memory.baseline_bytes + self.memory.tracked_peak_bytes
            self.memory.reset_peak()
            from ._stats import preservation_stats

            preserved = preservation_stats().retained_state_bytes
        self.events.append(Event(kind, index, now, int(live), int(peak), int(preserved)))

    def enter(self, name: str, args: tuple, kwargs: dict) -> None:
        i = self.index[name]
        if i in self._entered:
            raise ValueError(f"{_API}: segment {name!r} ran twice in one step; expected each segment once "
                             "per step (shared or looped modules cannot be profiled as one segment). "
                             "Tip: choose segments that run once, e.g. the blocks of the loop; with gradient "
                             "accumulation (a step_fn running several micro-batches, each running every segment), "
                             "profile a step_fn of one micro-batch (forward, backward and, if you like, the "
                             "optimizer step; gradient sync on or off), since costs are per forward and backward, "
                             "then train with accumulation on the planned model.")
        if self.ordered and i != len(self.order):
            expected = next(n for n, j in self.index.items() if j == len(self.order))
            raise ValueError(f"{_API}: segment {name!r} started before segment {expected!r} in this step, but after "
                             "it in the first profiled step; expected the forward to run the segments in one "
                             "order every step (the card's chain order, eq. 3, cannot be known otherwise). Tip: "
                             "choose segments the forward always runs in the same order, or a step_fn that does.")
        self._entered.add(i)
        self.order.append(i)
        self.event("fwd_enter", i)
        for t in _grad_leaves((args, kwargs)):
            self._handles.append(t.register_hook(lambda g, i=i: self._end(i)))

    def exit(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        i = self.index[name]
        self.event("fwd_exit", i)
        for t in _grad_leaves(out):
            self._handles.append(t.register_hook(lambda g, i=i: self._start(i)))

    def _start(self, i: int) -> None:
        if not self._started:  # the first gradient of the step: mark where its backward ends
            queue_backward_callback(lambda: self.event("bwd_done"))
        if i not in self._started:
            self._started.add(i)
            self.event("bwd_start", i)

    def _end(self, i: int) -> None:
        self.event("bwd_end", i)

    def close(self) -> None:
        """Remove the gradient hooks (inputs may outlive the step); never raises, so an error the
        step raised propagates as it was."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def check_every_segment_ran(self) -> None:
        """After a step that completed: raise ``ValueError`` naming the segments that did not run."""
        missing = sorted(set(self.index.values()) - self._entered)
        if missing:
            names = [n for n, i in self.index.items() if i in missing]
            raise ValueError(f"{_API}: segment(s) {names} did not run during the step; expected every segment "
                             "to run once. Tip: check the segment paths against the modules the forward calls.")
