"""Benchmark of stateremat.torch.checkpoint (issue 3), printed as ratios measured in one process.

1. Overhead with no declared state: a 16-block MLP (width 1024, batch 256, float32, CPU,
   2 threads); step = forward + backward. ``torch.utils.checkpoint(use_reentrant=False)`` (A)
   and ``stateremat.torch.checkpoint`` (B) alternate A B A B ...; the printed value is the
   median of the paired ratios B/A. Target: <= 1.05. Also printed: the same ratio with a
   declared 4 KiB buffer under ``preserve="region"`` (only calls that touch the declared
   tensor reach Python; see ``benchmarks/bench_journal.py`` for issue 15's targets).
1b. Informational worst case: a segment of 100 tiny ops (64 floats), where any per-segment
   bookkeeping shows; same A/B median ratio. Also the
   median absolute extra time per segment (forward + backward of a tiny block, ours - torch),
   which bounds the systematic part of the ratio in 1 less noisily than the ratio itself.
2. Retained preservation bytes: a declared 64 MiB queue (65,536 x 256 float32) of which
   0.1 % of the rows are written per step (MoCo-style enqueue). Bytes retained after the
   forward under ``preserve="region"`` vs ``"whole"``. Target: region/whole < 0.02.

Usage: ``.venv/bin/python benchmarks/bench_checkpoint.py [--pairs 12] [--queue-steps 4]``.
Timings on a shared machine are noisy; the load average is printed beside them.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch import nn

from stateremat._shared.io import loadavg
from stateremat.torch import checkpoint, preservation_stats, reset_preservation_stats


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def mlp_overhead(pairs: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(16)]).to(device)
    x = torch.randn(256, 1024, device=device)

    def step(ckpt) -> float:
        _sync()
        t0 = time.perf_counter()
        h = x
        for b in blocks:
            h = ckpt(b, h)
        h.square().mean().backward()
        _sync()
        dt = time.perf_counter() - t0
        for p in blocks.parameters():
            p.grad = None
        return dt

    buf = torch.zeros(1024, device=device)  # 4 KiB declared, never written: journaling mode on
    methods = {
        "torch": lambda b, h: tuc.checkpoint(b, h, use_reentrant=False),
        "stateremat": lambda b, h: checkpoint(b, h),
        "stateremat_region": lambda b, h: checkpoint(b, h, state=[buf], preserve="region"),
    }
    for _ in range(2):  # warmups, excluded
        for f in methods.values():
            step(f)
    times: dict[str, list[float]] = {k: [] for k in methods}
    for i in range(pairs):
        order = list(methods) if i % 2 == 0 else list(reversed(methods))  # A B C, then C B A
        for k in order:
            times[k].append(step(methods[k]))
    def ratio(k: str) -> float:
        return statistics.median(b / a for a, b in zip(times["torch"], times[k]))

    return {
        "median_step_torch_s": statistics.median(times["torch"]),
        "median_step_stateremat_s": statistics.median(times["stateremat"]),
        "median_ratio_stateremat_over_torch": ratio("stateremat"),
        "median_ratio_region_state_over_torch": ratio("stateremat_region"),
        "pairs": pairs,
    }


def small_op_overhead(pairs: int, device: torch.device) -> dict:
    x = torch.randn(64, device=device, requires_grad=True)

    def seg(h):
        for _ in range(50):
            h = (h * 1.01).sin()
        return h

    def step(ckpt) -> float:
        _sync()
        t0 = time.perf_counter()
        ckpt(seg, x).sum().backward()
        _sync()
        return time.perf_counter() - t0

    a = lambda f, h: tuc.checkpoint(f, h, use_reentrant=False)  # noqa: E731
    b = lambda f, h: checkpoint(f, h)  # noqa: E731
    for _ in range(5):
        step(a), step(b)
    ratios = []
    for i in range(4 * pairs):
        ta, tb = (step(a), step(b)) if i % 2 == 0 else reversed((step(b), step(a)))
        ratios.append(tb / ta)
    tiny, h0 = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).to(device), torch.randn(4, 8, device=device, requires_grad=True)

    def seg_step(ckpt) -> float:
        t0 = time.perf_counter()
        ckpt(tiny, h0).sum().backward()
        _sync()
        return time.perf_counter() - t0

    diffs = []
    for i in range(20 * pairs):
        ta, tb = (seg_step(a), seg_step(b)) if i % 2 == 0 else reversed((seg_step(b), seg_step(a)))
        diffs.append(tb - ta)
    return {"median_ratio_small_ops": statistics.median(ratios), "pairs": 4 * pairs,
            "median_extra_per_segment_s": statistics.median(diffs)}


def queue_bytes(steps: int, device: torch.device, K: int = 65536, D: int = 256) -> dict:
    torch.manual_seed(0)
    queue = F.normalize(torch.randn(K, D, device=device), dim=1)  # 64 MiB float32
    enc = nn.Linear(D, D).to(device)
    rows = math.ceil(0.001 * K)  # 0.1 % of the queue written per step
    ptr = [0]

    def segment(x, k):
        q = F.normalize(enc(x), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / 0.2
        loss = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long, device=device))
        queue[ptr[0] : ptr[0] + len(k)] = k  # enqueue in place
        return loss

    out: dict[str, float] = {}
    for preserve in ("whole", "region", "whole", "region")[: 2 * max(1, steps // 2)]:
        retained, times = [], []
        for _ in range(max(1, steps // 2)):
            x = torch.randn(rows, D, device=device)
            k = F.normalize(torch.randn(rows, D, device=device), dim=1)
            reset_preservation_stats()
            _sync()
            t0 = time.perf_counter()
            loss = checkpoint(segment, x, k, state=[queue], preserve=preserve)
            retained.append(preservation_stats().retained_state_bytes)
            loss.backward()
            _sync()
            times.append(time.perf_counter() - t0)
            ptr[0] = (ptr[0] + rows) % (K - rows)
            del loss
        out[f"{preserve}_retained_bytes"] = statistics.median(retained)
        out[f"{preserve}_step_s"] = statistics.median(times)
    out["queue_bytes"] = queue.numel() * queue.element_size()
    out["written_bytes_per_step"] = rows * D * queue.element_size()
    out["region_over_whole_retained"] = out["region_retained_bytes"] / out["whole_retained_bytes"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=12, help="A/B step pairs for the overhead ratio")
    ap.add_argument("--queue-steps", type=int, default=4, help="steps per option for the queue bytes")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device={device} threads={args.threads} torch={torch.__version__} loadavg_before='{loadavg()}'")
    o = mlp_overhead(args.pairs, device)
    print(f"mlp16x1024 batch256 no declared state: median step torch={o['median_step_torch_s']:.4f}s "
          f"stateremat={o['median_step_stateremat_s']:.4f}s pairs={o['pairs']}")
    print(f"overhead_ratio_median={o['median_ratio_stateremat_over_torch']:.4f} (target <= 1.05)")
    print(f"region_state_overhead_ratio_median={o['median_ratio_region_state_over_torch']:.4f} "
          "(informational: 4 KiB declared buffer, never written)")
    sm = small_op_overhead(args.pairs, device)
    print(f"small_op_segment_ratio_median={sm['median_ratio_small_ops']:.4f} pairs={sm['pairs']} "
          "(informational worst case: 100 ops on 64 floats)")
    print(f"extra_time_per_segment_median_s={sm['median_extra_per_segment_s']:.2e} "
          f"(x16 segments = {16 * sm['median_extra_per_segment_s'] / o['median_step_torch_s']:.4f} of the "
          "torch MLP step: the systematic part of overhead_ratio - 1)")
    q = queue_bytes(args.queue_steps, device)
    print(f"queue {q['queue_bytes']} bytes, {q['written_bytes_per_step']} bytes written per step: "
          f"retained whole={q['whole_retained_bytes']:.0f} region={q['region_retained_bytes']:.0f} bytes; "
          f"step whole={q['whole_step_s']:.4f}s region={q['region_step_s']:.4f}s")
    print(f"region_over_whole_retained_ratio={q['region_over_whole_retained']:.5f} (target < 0.02)")
    print(f"loadavg_after='{loadavg()}'")


if __name__ == "__main__":
    main()
