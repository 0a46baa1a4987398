"""Per-segment costs and the parts outside the segments, read from one step's :class:`Event` s.

For segment ``i`` (all in context, in one step):

* ``r`` = live bytes at its forward exit − at its forward entry (saved activations, snapshot or
  journal, and the output handed on);
* ``q`` = the larger of its forward peak and its backward peak (replay included), minus the
  live bytes at its forward exit — so ``entry + r + q`` is the highest the step reached while the
  segment ran;
* ``c`` = forward seconds + backward seconds (from the first gradient of its outputs to the last
  gradient of its inputs).

Outside the segments: ``base`` (live at the step's start: parameters, gradients, buffers,
optimizer state, the batch), ``entry`` (live at the first segment's entry: ``base`` plus what the
part before it holds, such as stem activations, minus what the step freed first, such as
gradients set to ``None``), and the peaks of the part before the first segment (``pre_peak``),
of the head and loss between the last forward exit and the first backward (``head`` above the
live bytes at that exit), of the backward of the part before the first segment
(``pre_backward_peak``: from the last segment backward's end to the backward's end — the stem's
backward, with its activations and gradients) and of the rest of the step after the backward
(``post_peak``: the optimizer step).
"""
from __future__ import annotations

from dataclasses import dataclass

from ._probe import Event


@dataclass(frozen=True)
class SegmentCost:
    """In-context cost of one segment in one step: bytes and seconds."""

    retained_bytes: int
    temp_bytes: int
    forward_s: float
    backward_s: float
    preserved_bytes: int = 0  # snapshot/journal bytes its own forward added

    @property
    def time_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class StepCosts:
    """Costs of every segment and of the parts outside them (see the module docstring)."""

    segments: list[SegmentCost]
    base_bytes: int
    entry_bytes: int
    pre_peak_bytes: int
    head_bytes: int
    post_peak_bytes: int
    peak_bytes: int
    pre_backward_peak_bytes: int = 0
    preserved_at_backward_bytes: int = 0  # held for preservation when the backward starts


def _peak(events: list[Event], lo: int, hi: int) -> int:
    """Highest peak in the intervals ending at events ``lo+1 .. hi``."""
    return max((e.peak_bytes for e in events[lo + 1:hi + 1]), default=0)


def read_timeline(events: list[Event], n: int) -> StepCosts:
    """Costs of ``n`` segments from one step's events (``start`` first, ``end`` last)."""
    first = {}
    last = {}
    for k, e in enumerate(events):
        first.setdefault((e.kind, e.index), k)
        last[(e.kind, e.index)] = k
    end = len(events) - 1
    segs, bwd_ends = [], []
    for i in range(n):
        e0, e1 = first[("fwd_enter", i)], first[("fwd_exit", i)]
        entry, exit_ = events[e0], events[e1]
        peak = _peak(events, e0, e1)
        bwd_s = 0.0
        s = first.get(("bwd_start", i))
        if s is not None:
            e = last.get(("bwd_end", i))
            if e is None or e < s:
                # inputs need no gradient (the first segment on the batch): its backward lasts until
                # another segment's backward starts or the backward pass ends — not until the next
                # event, which can be the next segment's bwd_end fired by the same gradient
                e = next((k for k in range(s + 1, end + 1) if events[k].kind in ("bwd_start", "bwd_done")), end)
            peak = max(peak, _peak(events, s, e))
            bwd_s = events[e].time_s - events[s].time_s
            bwd_ends.append(e)
        segs.append(SegmentCost(max(0, exit_.live_bytes - entry.live_bytes), max(0, peak - exit_.live_bytes),
                                exit_.time_s - entry.time_s, bwd_s,
                                max(0, exit_.preserved_bytes - entry.preserved_bytes)))
    enter0 = first[("fwd_enter", 0)]
    last_exit = max(first[("fwd_exit", i)] for i in range(n))
    bwd = [k for k, e in enumerate(events) if e.kind in ("bwd_start", "bwd_end", "bwd_done")]
    first_bwd = bwd[0] if bwd else end
    last_bwd = bwd[-1] if bwd else end  # bwd_done when torch reports the backward's end
    segs_done = max(bwd_ends, default=last_bwd)  # every segment's backward over (first on the batch: at the end)
    base = events[0].live_bytes
    return StepCosts(
        segments=segs, base_bytes=base, entry_bytes=events[enter0].live_bytes,
        pre_peak_bytes=_peak(events, 0, enter0),
        head_bytes=max(0, _peak(events, last_exit, first_bwd) - events[last_exit].live_bytes),
        post_peak_bytes=_peak(events, last_bwd, end),
        pre_backward_peak_bytes=_peak(events, segs_done, last_bwd) if segs_done < last_bwd else 0,
        peak_bytes=max(e.peak_bytes for e in events),
        preserved_at_backward_bytes=events[first_bwd].preserved_bytes)
