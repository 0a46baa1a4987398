"""Lower bound of regions/whole step time in the ``workloads3`` cells at the ``cpu`` scale (issue 15;
``--preset cpu-faithful``, issue 26: the same cells with a 16 MiB state).

A region journal can at best cost nothing; everything else in a step (compute, replay, the
transaction, the write handler on the declared tensor) both methods pay. Per cell (feature
queue, prototype memory, unrolled recurrence: 1 MiB state (16 MiB at ``cpu-faithful``), write
fraction 0.001, 64 live segments, width and batch 8, as the cohort runs them) this prints, measured side by side in one
process on one thread, the three methods interleaved step by step (forward + backward + SGD
update, median over ``--steps`` steps):

* ``whole_ms`` and ``regions_ms``;
* ``free_ms``: regions with a journal that costs nothing — ``Journal.record`` keeps nothing and
  ``RegionPreserver.restore`` restores nothing (its results are wrong; timing only, a separate
  model, patched only during its own steps);
* ``floor``: ``free_ms / whole_ms``, the regions/whole ratio a journal costing nothing would
  measure;
* ``torch_ms``: every segment under ``torch.utils.checkpoint`` (``recompute_only``: keeps and
  restores nothing, so its replays write the state twice — timing only), the cost of a
  checkpoint with no transaction at all; ``copy_ms``: two copies of every segment's 1 MiB
  (16 MiB) state (the least a whole snapshot copies per step: keep ``B0`` at the forward, put it back at
  the replay), timed in the same loop;
* ``floor_any``: ``torch_ms / (torch_ms + copy_ms)``, a bound on regions/whole for *any*
  implementation whose per-segment bookkeeping costs no more than torch's checkpoint and whose
  whole snapshots cost only their copies (regions cannot cost less than torch's checkpoint of
  the same segments; whole cannot cost less than that plus its copies).

(An earlier version estimated the floor as ``1 - copies / whole`` from cProfile's time inside
``clone``/``copy_``; that misses allocation costs, and on the 64 MiB queue of
``bench_journal.py`` it measured above what regions achieved.)

Usage: ``.venv/bin/python benchmarks/bench_region_floor.py [--steps 20] [--preset cpu|cpu-faithful]
[--workloads prototype_memory,...]``.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Iterator

import torch

from stateremat._shared.io import loadavg
from stateremat.paper.bench._methods import build_method
from stateremat.paper.bench import experiment_spec
from stateremat.paper.workloads import WORKLOADS
from stateremat.torch._preserve import region


@contextlib.contextmanager
def free_journal() -> Iterator[None]:
    """Region journals that keep and restore nothing (timing only: replays read wrong bytes)."""
    saved = region.Journal.record, region.RegionPreserver.restore
    region.Journal.record = lambda self, runs: 0
    region.RegionPreserver.restore = lambda self, segment_name: None
    try:
        yield
    finally:
        region.Journal.record, region.RegionPreserver.restore = saved


def measure(workload: str, steps: int, preset: str = "cpu") -> dict:
    """Median step times (ms) of the methods above in ``workload``'s ``workloads3`` cell at
    ``preset`` (the cohort's own config: ``experiment_spec("workloads3", preset)``)."""
    cfg = next(c.config for c in experiment_spec("workloads3", preset).cells if c.config.workload == workload)
    runs = {"whole": build_method("whole", cfg, ["whole"] * 64),
            "regions": build_method("regions", cfg, ["region"] * 64),
            "free": build_method("regions", cfg, ["region"] * 64),
            "torch": build_method("torch", cfg, ["recompute_only"] * 64)}
    state = [torch.zeros(cfg.state_bytes, dtype=torch.uint8) for _ in range(2)]

    def copies() -> None:
        for _ in range(2 * 64):
            state[1].copy_(state[0])

    def step(m: str, s: int) -> None:
        if m == "copy":
            copies()
            return
        with free_journal() if m == "free" else contextlib.nullcontext():
            runs[m].train_step(s)

    methods = [*runs, "copy"]
    for s in range(3):
        for m in methods:
            step(m, s)
    times: dict[str, list[float]] = {m: [] for m in methods}
    for i in range(steps):
        for m in (methods if i % 2 == 0 else list(reversed(methods))):
            t0 = time.perf_counter()
            step(m, 10 + i)
            times[m].append(time.perf_counter() - t0)
    med = {m: statistics.median(v) for m, v in times.items()}
    return {"workload": workload, "whole_ms": med["whole"] * 1e3, "regions_ms": med["regions"] * 1e3,
            "free_ms": med["free"] * 1e3, "ratio": med["regions"] / med["whole"],
            "floor": med["free"] / med["whole"], "torch_ms": med["torch"] * 1e3, "copy_ms": med["copy"] * 1e3,
            "floor_any": med["torch"] / (med["torch"] + med["copy"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--preset", default="cpu", choices=["cpu", "cpu-faithful"])
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"preset {args.preset}; load average before: {loadavg()}")
    for wl in args.workloads.split(","):
        r = measure(wl, args.steps, args.preset)
        print(f"{r['workload']}: whole {r['whole_ms']:.1f} ms, regions {r['regions_ms']:.1f} ms, "
              f"regions/whole {r['ratio']:.3f}; regions with a free journal {r['free_ms']:.1f} ms -> "
              f"floor {r['floor']:.3f}; torch's checkpoint {r['torch_ms']:.1f} ms, whole's least copies "
              f"{r['copy_ms']:.1f} ms -> floor for any implementation {r['floor_any']:.3f}")
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    main()
