"""Example profile cards: seeded random cards and the paper's activation-pressure shape.

Used by the planner tests and ``benchmarks/bench_planner.py``; also handy for trying the CLI.
"""
from __future__ import annotations

import numpy as np

from ..contract import OptionCost, ProfileCard, SegmentCard

GiB = 1024**3
MiB = 1024**2


def random_card(n: int, rng: np.random.Generator | int, region_p: float = 0.7,
                agnostic_p: float = 0.5, grain: int = 4096, small_ints: bool = False) -> ProfileCard:
    """Seeded random card: eager retains most; replay options retain less, take longer.

    Args:
        n: number of segments.
        rng: numpy Generator or seed.
        region_p: probability that a segment has a ``region`` option.
        agnostic_p: probability that a segment has a ``recompute_only`` entry.
        grain: byte granularity of sizes.
        small_ints: tiny integer sizes and times, so exact ties are common (tie-break tests).

    Returns:
        a valid :class:`ProfileCard` (segments ``seg0``…).
    """
    rng = np.random.default_rng(rng)
    segs = []
    for i in range(n):
        if small_ints:
            def oc(hi_r, hi_q, lo_c, hi_c):
                return OptionCost(int(rng.integers(0, hi_r)), int(rng.integers(0, hi_q)),
                                  float(rng.integers(lo_c, hi_c)))
            opts = {"eager": oc(6, 3, 0, 3), "whole": oc(4, 5, 1, 4)}
            if rng.random() < region_p:
                opts["region"] = oc(4, 5, 1, 4)
            if rng.random() < agnostic_p:
                w = opts["whole"]
                opts["recompute_only"] = OptionCost(w.retained_bytes // 2, w.temp_bytes,
                                                    w.time_s / 2)
        else:
            a = int(rng.integers(1, 1000)) * grain
            opts = {
                "eager": OptionCost(a, int(rng.integers(0, 50)) * grain, float(rng.uniform(0.5, 1))),
                "whole": OptionCost(int(rng.integers(0, a // 2 + 1)),
                                    int(rng.integers(0, 500)) * grain, float(rng.uniform(1, 2))),
            }
            if rng.random() < region_p:
                opts["region"] = OptionCost(int(rng.integers(0, a // 2 + 1)),
                                            int(rng.integers(0, 500)) * grain,
                                            float(rng.uniform(1, 2)))
            if rng.random() < agnostic_p:
                w = opts["whole"]
                opts["recompute_only"] = OptionCost(int(w.retained_bytes * rng.uniform(0, 1)),
                                                    w.temp_bytes, w.time_s * rng.uniform(0.5, 1))
        segs.append(SegmentCard(f"seg{i}", opts))
    p = int(rng.integers(0, 5)) if small_ints else int(rng.integers(0, 1000)) * grain
    return ProfileCard(p, segs, meta={"method": "random", "n": n})


def activation_pressure_card(dense: bool = False, large: bool = True) -> ProfileCard:
    """Hand-built 16-segment card shaped like the paper's activation-pressure cells (§9, Table 5).

    Large activations: eager retains 2.75 GiB per segment. Whole replay snapshots the 1 GiB
    feature queue (2 GiB retained per segment with its input) — expensive preservation. Sparse
    writes make region preservation cheap (a 1 MiB journal); dense writes make it cost as much
    as a whole snapshot. ``recompute_only`` is what a state-agnostic planner believes replay
    costs (no snapshot).
    """
    act = 2.75 * GiB if large else 0.0625 * GiB
    inp = 0.25 * GiB if large else 0.015625 * GiB
    segs = []
    for i in range(16):
        opts = {
            "eager": OptionCost(int(act), int(0.25 * GiB), 0.18),
            "whole": OptionCost(int(inp + 2 * GiB), int(act), 0.245),
            "region": (OptionCost(int(inp + 2 * GiB), int(act), 0.25) if dense
                       else OptionCost(int(inp + MiB), int(act), 0.24)),
            "recompute_only": OptionCost(int(inp), int(act), 0.2),
        }
        segs.append(SegmentCard(f"layer{i}", opts))
    return ProfileCard(2 * GiB, segs, meta={"cell": f"{'large' if large else 'small'}/"
                                                   f"{'dense' if dense else 'sparse'}",
                                            "method": "hand-built (paper Table 5 shape)"})
