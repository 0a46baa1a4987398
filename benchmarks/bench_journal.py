"""Benchmark of the region journal's cost (issue 15), printed as ratios measured in one process.

Every comparison interleaves its methods step by step (A B C, C B A, ...) after warm-ups and
prints medians of per-pair ratios, with ``/proc/loadavg`` before and after (the machine is
shared). Targets are the issue's; the script reports what it measures, met or not.

1. ``tiny_ops``: a segment of 100 tiny ops (16 floats) with a declared, never-written 4 KiB
   buffer: ours (region, whole) / ``torch.utils.checkpoint(use_reentrant=False)``. Target:
   region <= 1.10.
2. ``no_state``: 16-block MLP (width 1024, batch 256): ours with the default ``state="auto"``
   (nothing to preserve) / torch. Target <= 1.05.
3. ``queue``: a 64 MiB float32 queue, 0.1 % of rows enqueued in place per step inside the
   segment: step time region / whole. Target <= 0.45. Also printed: ``floor``, torch's own
   non-reentrant checkpoint of the same segment (it keeps no state at all; its replay enqueues a
   second time, which costs the same) over whole, interleaved with both: a journal costing
   nothing would measure about this, since the segment's own compute (a 66 x 65,536 matmul, run
   in forward and again in replay) is paid by every method; and region / torch.
4. ``journal_bytes``: bytes the journal keeps for contiguous, strided (every 7th element) and
   scattered (random 1 %) float32 element writes, against the bytes written: kept /
   (1.1 x written + 16 x runs). Target <= 1 for every pattern.
5. ``resnet``: the project's CIFAR ResNet-18 (width 16, batch 32, BatchNorm in every block),
   every BasicBlock checkpointed: ``StatefulCheckpoint(block, state="buffers",
   preserve="region")`` / torch's checkpoint of the same blocks. Target <= 1.05. Also printed:
   the same with ``preserve="whole"``, and the default (``checkpoint(block, h)``, nothing declared:
   ``state="auto"`` finds the BatchNorm buffers) over ``state="buffers"``. Target <= 1.00.
6. ``whole_copies``: bytes/s of four copies per segment of a 64 MiB storage (snapshot,
   set-aside, restore, reinstatement) into reused buffers — a prototype ``whole`` does not use
   (its spares raised measured peaks) — beside fresh clones (what ``whole`` does) and
   one ``copy_``; the journal's own copies are printed as ``journal copies``.

7. ``block`` (issue 26): the project's ResNet-18 (width 16) layer2.0 block at batch 2, one segment
   per step, in CPU time: region, whole (``state="buffers"``) and the default over torch, with
   the extra microseconds per segment. Target <= 1.25. ``small_mlp``: plain MLP blocks (width 32
   batch 16 x 32 blocks, width 256 batch 64 x 16) under the default; ``long_list``: a segment
   whose module holds a list of 268 tensors (a log grown each step), under the default.

Usage: ``.venv/bin/python benchmarks/bench_journal.py [--pairs 20] [--threads 2] [--cases block,resnet]``.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch import nn

from stateremat._shared.io import loadavg
from stateremat.torch import StatefulCheckpoint, checkpoint, preservation_stats, reset_preservation_stats


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _interleaved(steps: dict[str, Callable[[], None]], pairs: int, warmups: int = 3) -> dict[str, list[float]]:
    for _ in range(warmups):
        for f in steps.values():
            f()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(pairs):
        for k in (list(steps) if i % 2 == 0 else list(reversed(steps))):
            _sync()
            t0 = time.perf_counter()
            steps[k]()
            _sync()
            times[k].append(time.perf_counter() - t0)
    return times


def _ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def tiny_ops(pairs: int, device: torch.device) -> dict:
    x = torch.randn(16, device=device, requires_grad=True)
    buf = torch.zeros(1024, device=device)

    def body(h):
        for _ in range(100):
            h = h * 1.0001
        return h

    steps = {
        "torch": lambda: tuc.checkpoint(body, x, use_reentrant=False).sum().backward(),
        "region": lambda: checkpoint(body, x, state=[buf], preserve="region").sum().backward(),
        "whole": lambda: checkpoint(body, x, state=[buf], preserve="whole").sum().backward(),
    }
    t = _interleaved(steps, 10 * pairs, warmups=20)
    return {"region_over_torch": _ratio(t, "region", "torch"), "whole_over_torch": _ratio(t, "whole", "torch"),
            "torch_step_s": statistics.median(t["torch"])}


def no_state(pairs: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(16)]).to(device)
    x = torch.randn(256, 1024, device=device)

    def run(ckpt) -> Callable[[], None]:
        def step() -> None:
            h = x
            for b in blocks:
                h = ckpt(b, h)
            h.square().mean().backward()
            for p in blocks.parameters():
                p.grad = None
        return step

    t = _interleaved({"torch": run(lambda b, h: tuc.checkpoint(b, h, use_reentrant=False)),
                      "ours": run(lambda b, h: checkpoint(b, h))}, pairs)
    return {"ours_over_torch": _ratio(t, "ours", "torch"), "torch_step_s": statistics.median(t["torch"]),
            "extra_us_per_segment": statistics.median(a - b for a, b in zip(t["ours"], t["torch"])) * 1e6 / len(blocks)}


def queue(pairs: int, device: torch.device, K: int = 65536, D: int = 256) -> dict:
    torch.manual_seed(0)
    q_buf = F.normalize(torch.randn(K, D, device=device), dim=1)  # 64 MiB float32
    enc = nn.Linear(D, D).to(device)
    rows = math.ceil(0.001 * K)
    ptr = [0]

    def segment(x, k):
        q = F.normalize(enc(x), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ q_buf.T], dim=1) / 0.2
        loss = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long, device=device))
        q_buf[ptr[0]: ptr[0] + len(k)] = k
        return loss

    x = torch.randn(rows, D, device=device)
    k = F.normalize(torch.randn(rows, D, device=device), dim=1)
    kept: dict[str, int] = {}

    def run(preserve: str) -> Callable[[], None]:
        def step() -> None:
            reset_preservation_stats()
            loss = checkpoint(segment, x, k, state=[q_buf], preserve=preserve)
            kept[preserve] = preservation_stats().retained_state_bytes
            loss.backward()
            ptr[0] = (ptr[0] + rows) % (K - rows)
        return step

    def torch_step() -> None:  # keeps no state: its replay enqueues again (timing only)
        tuc.checkpoint(segment, x, k, use_reentrant=False).backward()
        ptr[0] = (ptr[0] + rows) % (K - rows)

    t = _interleaved({"whole": run("whole"), "region": run("region"), "torch": torch_step}, pairs)
    whole_s = statistics.median(t["whole"])
    return {"region_over_whole_time": _ratio(t, "region", "whole"), "whole_step_s": whole_s,
            "floor": _ratio(t, "torch", "whole"), "region_over_torch": _ratio(t, "region", "torch"),
            "region_kept_bytes": kept["region"], "whole_kept_bytes": kept["whole"],
            "written_bytes": rows * D * 4}


def journal_bytes(device: torch.device) -> dict:
    out = {}
    n = 1 << 20  # 4 MiB of float32
    g = torch.Generator().manual_seed(0)
    patterns = {
        "contiguous": torch.arange(1000, 1000 + n // 1000),
        "strided": torch.arange(0, n, 7),
        "scattered": torch.sort(torch.randperm(n, generator=g)[: n // 100]).values,
    }
    for name, idx in patterns.items():
        buf = torch.zeros(n, device=device)
        idx = idx.to(device)
        w = torch.ones((), device=device, requires_grad=True)
        reset_preservation_stats()

        def seg(w):
            y = (w * buf).sum()
            buf.index_fill_(0, idx, 1.0)
            return y

        y = checkpoint(seg, w, state=[buf], preserve="region")
        kept = preservation_stats().journal_bytes
        written = 4 * len(idx)
        d = idx.diff()
        runs = 1 + int((d != 1).sum())
        out[name] = {"kept_bytes": kept, "written_bytes": written, "runs": runs,
                     "kept_over_bound": kept / (1.1 * written + 16 * runs), "kept_over_written": kept / written}
        y.backward()
    return out


def resnet(pairs: int, device: torch.device) -> dict:
    from stateremat.paper.workloads import ResNet18

    torch.manual_seed(0)
    base = ResNet18(width=16).to(device)
    x = torch.randn(32, 3, 32, 32, device=device)

    def model_step(blocks_fn) -> Callable[[], None]:
        def step() -> None:
            h = base.stem(x)
            for layer in (base.layer1, base.layer2, base.layer3, base.layer4):
                for b in layer:
                    h = blocks_fn(b, h)
            h.mean().backward()
            for p in base.parameters():
                p.grad = None
        return step

    blocks = [b for layer in (base.layer1, base.layer2, base.layer3, base.layer4) for b in layer]
    wrapped = {p: {id(b): StatefulCheckpoint(b, state="buffers", preserve=p) for b in blocks}
               for p in ("region", "whole")}
    t = _interleaved({"torch": model_step(lambda b, h: tuc.checkpoint(b, h, use_reentrant=False)),
                      "region": model_step(lambda b, h: wrapped["region"][id(b)](h)),
                      "whole": model_step(lambda b, h: wrapped["whole"][id(b)](h)),
                      # the default: nothing declared, the written buffers found (state="auto")
                      "auto": model_step(lambda b, h: checkpoint(b, h))}, pairs)
    return {"region_over_torch": _ratio(t, "region", "torch"), "whole_over_torch": _ratio(t, "whole", "torch"),
            "auto_over_buffers": _ratio(t, "auto", "region"), "torch_step_s": statistics.median(t["torch"])}


def copy_rates(device: torch.device, run_bytes: int = 4096, runs: int = 256, offset: int = 4) -> dict:
    """Bytes/s of the journal's gather (keep pre-write bytes) and scatter (restore/reinstate) over
    ``runs`` disjoint runs of ``run_bytes`` every ``2 * run_bytes`` from byte ``offset`` (target
    >= 5 GB/s from 4 KiB runs; 32-byte rows at offset 0 are the ``cpu-faithful`` prototype's and
    recurrence's rows), beside one ``copy_`` of the same bytes (the memcpy reference)."""
    import numpy as np

    from stateremat.torch._storage import gather, scatter

    flat = torch.zeros(2 * runs * run_bytes + 4, dtype=torch.uint8, device=device)
    starts = np.arange(runs, dtype=np.int64) * 2 * run_bytes + offset  # 4: unaligned, as element writes are
    spans = np.stack([starts, starts + run_bytes], axis=1)
    dst = torch.empty(runs * run_bytes, dtype=torch.uint8, device=device)
    data = gather(flat, spans)
    t = _interleaved({"gather": lambda: gather(flat, spans), "scatter": lambda: scatter(flat, spans, data),
                      "copy": lambda: dst.copy_(flat[: runs * run_bytes])}, 30)
    n = runs * run_bytes
    return {k: n / statistics.median(v) for k, v in t.items()}


def whole_copies(device: torch.device, nbytes: int = 64 << 20) -> dict:
    """Bytes/s of ``whole``'s four copies of a storage per segment (snapshot, set-aside, restore,
    reinstatement) into reused buffers, beside the same four into fresh clones (the former way)
    and one ``copy_`` (the memcpy reference); the time of one cycle too."""
    spares: list[torch.Tensor] = []  # the backed-out prototype's reused buffers (23be5d0), kept here

    def copy_of(t: torch.Tensor) -> torch.Tensor:
        buf = spares.pop() if spares else torch.empty_like(t)
        return buf.copy_(t)

    def give_back(buf: torch.Tensor) -> None:
        spares.append(buf)

    flat = torch.randn(nbytes // 4, device=device).view(torch.uint8)

    def reused() -> None:
        snap = copy_of(flat)
        visible = copy_of(flat)
        flat.copy_(snap)
        flat.copy_(visible)
        give_back(visible)
        give_back(snap)

    def fresh() -> None:
        snap = flat.clone()
        visible = flat.clone()
        flat.copy_(snap)
        flat.copy_(visible)

    dst = torch.empty_like(flat)
    t = _interleaved({"reused": reused, "fresh": fresh, "copy": lambda: dst.copy_(flat)}, 10)
    med = {k: statistics.median(v) for k, v in t.items()}
    return {"reused_Bps": 4 * nbytes / med["reused"], "fresh_Bps": 4 * nbytes / med["fresh"],
            "copy_Bps": nbytes / med["copy"], "reused_s": med["reused"], "fresh_s": med["fresh"], "nbytes": nbytes}


def _cpu_interleaved(steps: dict[str, Callable[[], None]], pairs: int, warmups: int = 20) -> dict[str, list[float]]:
    """As :func:`_interleaved`, in CPU seconds of this process (``time.process_time``)."""
    for _ in range(warmups):
        for f in steps.values():
            f()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(pairs):
        for k in (list(steps) if i % 2 == 0 else list(reversed(steps))):
            _sync()
            t0 = time.process_time()
            steps[k]()
            _sync()
            times[k].append(time.process_time() - t0)
    return times


def _per_segment(t: dict[str, list[float]], segments: int) -> dict:
    """Ratios over torch and the median extra CPU microseconds per segment, per method."""
    return {k: {"over_torch": _ratio(t, k, "torch"),
                "extra_us": statistics.median(a - b for a, b in zip(v, t["torch"])) * 1e6 / segments,
                "step_us": statistics.median(v) * 1e6}
            for k, v in t.items() if k != "torch"} | {"torch_step_us": statistics.median(t["torch"]) * 1e6}


def block(pairs: int, device: torch.device) -> dict:
    """Issue 26's per-segment host cost: the project's ResNet-18 (width 16) layer2.0 block (3
    BatchNorms, 9 buffers, a strided conv and its shortcut) at batch 2, one segment per step:
    ``StatefulCheckpoint(block, state="buffers")`` under region and whole, and the default
    (``checkpoint(block, h)``), over torch's checkpoint, in CPU time. Targets: <= 1.25."""
    from stateremat.paper.workloads import ResNet18

    torch.manual_seed(0)
    blk = ResNet18(width=16).to(device).layer2[0]
    x = torch.randn(2, 16, 32, 32, device=device, requires_grad=True)
    wrapped = {p: StatefulCheckpoint(blk, state="buffers", preserve=p) for p in ("region", "whole")}

    def step(f) -> Callable[[], None]:
        def run() -> None:
            f(x).sum().backward()
            for p in blk.parameters():
                p.grad = None
            x.grad = None
        return run

    t = _cpu_interleaved({"torch": step(lambda h: tuc.checkpoint(blk, h, use_reentrant=False)),
                          "region": step(wrapped["region"]), "whole": step(wrapped["whole"]),
                          "auto": step(lambda h: checkpoint(blk, h))}, 10 * pairs)
    return _per_segment(t, 1)


def small_mlp(pairs: int, device: torch.device, width: int = 32, batch: int = 16, depth: int = 32) -> dict:
    """Plain MLP blocks (nothing to preserve) under the default ``checkpoint(b, h)`` over torch's
    checkpoint, in CPU time: the per-segment cost small blocks cannot hide."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]).to(device)
    x = torch.randn(batch, width, device=device)

    def run(ckpt) -> Callable[[], None]:
        def step() -> None:
            h = x
            for b in blocks:
                h = ckpt(b, h)
            h.square().mean().backward()
            for p in blocks.parameters():
                p.grad = None
        return step

    t = _cpu_interleaved({"torch": run(lambda b, h: tuc.checkpoint(b, h, use_reentrant=False)),
                          "auto": run(lambda b, h: checkpoint(b, h))}, pairs)
    return _per_segment(t, depth)


def long_list(pairs: int, device: torch.device, entries: int = 268) -> dict:
    """A segment whose module holds a log (a list of ``entries`` tensors, as one appended each
    step would after ``entries`` steps): the default's reach scans it every step."""
    torch.manual_seed(0)
    m = nn.Linear(16, 16).to(device)
    m.log = [torch.zeros(4, device=device) for _ in range(entries)]
    x = torch.randn(4, 16, device=device)

    def run(ckpt) -> Callable[[], None]:
        def step() -> None:
            ckpt(m, x).sum().backward()
            m.weight.grad = m.bias.grad = None
        return step

    t = _cpu_interleaved({"torch": run(lambda b, h: tuc.checkpoint(b, h, use_reentrant=False)),
                          "auto": run(lambda b, h: checkpoint(b, h))}, 5 * pairs)
    return _per_segment(t, 1)


def _print_per_segment(name: str, r: dict) -> None:
    parts = [f"{k}/torch={v['over_torch']:.3f} (+{v['extra_us']:.0f} us per segment)"
             for k, v in r.items() if k != "torch_step_us"]
    print(f"{name}: " + ", ".join(parts) + f"; torch step {r['torch_step_us']:.0f} us CPU")


CASES = ("tiny_ops", "no_state", "queue", "copies", "journal_bytes", "resnet", "block", "small_mlp", "long_list")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20, help="interleaved rounds per comparison")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device={device} threads={args.threads} torch={torch.__version__} loadavg_before='{loadavg()}'")
    if "tiny_ops" in cases:
        t = tiny_ops(args.pairs, device)
        print(f"tiny_ops: region/torch={t['region_over_torch']:.3f} (target <= 1.10) whole/torch="
              f"{t['whole_over_torch']:.3f}; torch step {t['torch_step_s'] * 1e3:.3f} ms")
    if "no_state" in cases:
        n = no_state(args.pairs, device)
        print(f"no_state: ours (default state='auto')/torch={n['ours_over_torch']:.3f} (target <= 1.05); "
              f"torch step {n['torch_step_s']:.4f} s; ours - torch {n['extra_us_per_segment']:.0f} us per segment "
              "(target <= 150)")
    if "queue" in cases:
        q = queue(args.pairs, device)
        print(f"queue: region/whole time={q['region_over_whole_time']:.3f} (target <= 0.45; floor "
              f"{q['floor']:.3f} = torch/whole; region/torch {q['region_over_torch']:.3f}); whole step "
              f"{q['whole_step_s']:.4f} s ({4 * q['whole_kept_bytes'] / q['whole_step_s'] / 1e9:.2f} GB/s of its 4 "
              "state copies over the step); "
              f"kept region={q['region_kept_bytes']} whole={q['whole_kept_bytes']} "
              f"written={q['written_bytes']} bytes")
    if "copies" in cases:
        rates = copy_rates(device)
        print(f"journal copies (256 runs of 4 KiB): gather {rates['gather'] / 1e9:.2f} GB/s, scatter "
              f"{rates['scatter'] / 1e9:.2f} GB/s (target >= 5); one copy_ of the same bytes {rates['copy'] / 1e9:.2f} GB/s")
        rows = copy_rates(device, run_bytes=32, runs=16384, offset=0)
        print(f"journal copies (16384 rows of 32 B): gather {rows['gather'] / 1e9:.2f} GB/s, scatter "
              f"{rows['scatter'] / 1e9:.2f} GB/s; one copy_ of the same bytes {rows['copy'] / 1e9:.2f} GB/s")
        w = whole_copies(device)
        print(f"whole copies ({w['nbytes'] >> 20} MiB storage, 4 per segment): reused buffers {w['reused_s'] * 1e3:.2f} ms "
              f"= {w['reused_Bps'] / 1e9:.2f} GB/s, fresh clones {w['fresh_s'] * 1e3:.2f} ms = {w['fresh_Bps'] / 1e9:.2f} GB/s; "
              f"one copy_ {w['copy_Bps'] / 1e9:.2f} GB/s")
    if "journal_bytes" in cases:
        for name, j in journal_bytes(device).items():
            print(f"journal_bytes[{name}]: kept={j['kept_bytes']} written={j['written_bytes']} runs={j['runs']} "
                  f"kept/written={j['kept_over_written']:.3f} kept/(1.1 written + 16 runs)={j['kept_over_bound']:.3f} "
                  "(target <= 1)")
    if "resnet" in cases:
        r = resnet(max(4, args.pairs // 2), device)
        print(f"resnet18 w16 b32: region/torch={r['region_over_torch']:.3f} (target <= 1.05), whole/torch="
              f"{r['whole_over_torch']:.3f}; default state='auto' over state='buffers' (region) "
              f"{r['auto_over_buffers']:.3f} (target <= 1.00); torch step "
              f"{r['torch_step_s']:.3f} s")
    if "block" in cases:
        _print_per_segment("layer2.0 block b2 (target <= 1.25)", block(args.pairs, device))
    if "small_mlp" in cases:
        _print_per_segment("small MLP w32 b16 x32", small_mlp(args.pairs, device))
        _print_per_segment("small MLP w256 b64 x16", small_mlp(args.pairs, device, 256, 64, 16))
    if "long_list" in cases:
        _print_per_segment("a reached list of 268 tensors", long_list(args.pairs, device))
    print(f"loadavg_after='{loadavg()}'")


if __name__ == "__main__":
    main()
