"""Lower bound of regions/whole step time in the ``workloads3`` cells at the ``cpu`` scale (issue 15).

A region journal can at best remove what whole snapshots spend copying; everything else in a
step (compute, replay, the transaction) both methods pay. Per cell (feature queue, prototype
memory, unrolled recurrence: 1 MiB state, write fraction 0.001, 64 live segments, width and
batch 8, as the cohort runs them) this prints, measured side by side in one process on one
thread:

* ``whole_ms`` / ``regions_ms``: median step time (forward + backward + SGD update) over
  ``--steps`` steps, the two methods interleaved step by step;
* ``copies_ms``: time per whole step inside ``Tensor.clone`` and ``Tensor.copy_`` (the
  snapshot, visible copy, restore and reinstatement), from cProfile over 10 further steps;
* ``floor``: ``1 - copies_ms / whole_ms``, the regions/whole ratio a journal costing nothing
  would measure.

Usage: ``.venv/bin/python benchmarks/bench_region_floor.py [--steps 20]``.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

from stateremat.contract import loadavg
from stateremat.paper.bench._methods import build_method
from stateremat.paper.workloads import WORKLOADS, WorkloadConfig

_COPIES = ("<method 'clone' of 'torch._C.TensorBase' objects>",
           "<method 'copy_' of 'torch._C.TensorBase' objects>")


def measure(workload: str, steps: int) -> dict:
    cfg = WorkloadConfig(workload=workload, state_bytes=1 << 20, write_fraction=0.001,
                         live_versions=64, segments=64, width=8, batch=8)
    runs = {"whole": build_method("whole", cfg, ["whole"] * 64),
            "regions": build_method("regions", cfg, ["region"] * 64)}
    for s in range(3):
        for r in runs.values():
            r.train_step(s)
    times: dict[str, list[float]] = {m: [] for m in runs}
    for i in range(steps):
        for m, r in runs.items():
            t0 = time.perf_counter()
            r.train_step(10 + i)
            times[m].append(time.perf_counter() - t0)
    prof = cProfile.Profile()
    prof.enable()
    for i in range(10):
        runs["whole"].train_step(10 + steps + i)
    prof.disable()
    copies = sum(v[2] for k, v in pstats.Stats(prof).stats.items() if k[2] in _COPIES) / 10
    whole, regions = statistics.median(times["whole"]), statistics.median(times["regions"])
    return {"workload": workload, "whole_ms": whole * 1e3, "regions_ms": regions * 1e3,
            "ratio": regions / whole, "copies_ms": copies * 1e3, "floor": 1 - copies / whole}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {loadavg()}")
    for wl in WORKLOADS:
        r = measure(wl, args.steps)
        print(f"{r['workload']}: whole {r['whole_ms']:.1f} ms, regions {r['regions_ms']:.1f} ms, "
              f"regions/whole {r['ratio']:.3f}; whole copies {r['copies_ms']:.1f} ms/step -> "
              f"floor {r['floor']:.3f}")
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
