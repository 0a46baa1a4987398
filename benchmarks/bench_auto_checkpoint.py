"""Benchmark of ``stateremat.torch.auto_checkpoint`` on real clients (issue 14), ratios in one process.

Models (random weights, float32, CPU unless CUDA is present): a tiny Llama (transformers, 4 layers,
hidden 128; segments ``model.layers.*``), timm's ResNet-18 (batch 24 x 160²; segments: its eight
BasicBlocks) and ``resnet18_stem``, the same ResNet-18 at batch 64 with its stem folded into one
module that is a ninth segment.
One training step = forward, loss, backward, SGD step. For each model:

1. Eager's peak is measured (``PeakMemory``: CPU live-storage tracker / CUDA allocator; roots are
   parameters, gradients, buffers, optimizer state and the batch); the budget is 0.5 × that peak.
2. ``auto_checkpoint(model, budget, step_fn=...)`` profiles, plans (joint) and applies; its
   applied plan's peak is measured the same way. Printed: budget, eq. (3)'s predicted peak, the
   expected (chain) peak, the measured peak and whether it fits (target: measured <= budget).
   If no plan fits 0.5 × eager's peak it says so (with the least predicted peak as a fraction of
   eager's) and plans at 1.02 × that least peak instead.
   For models with a BatchNorm it also prints a lower bound on the peak of *any* plan
   (:func:`plan_floor_bytes`): no checkpointing plan can go below it, so a budget under it is
   infeasible by arithmetic, not for want of a planner.
3. Time: steps of the planned model (A), of the same model with torch's own checkpointing
   (``torch.utils.checkpoint``, non-reentrant) on exactly the segments the plan replays (B), on
   every segment (C) and eager (D) are interleaved A B C D, D C B A, ...; printed are medians
   and the medians of the paired ratios A/B (target <= 1.05), A/C and A/D. ``/proc/loadavg`` is
   printed before and after: on a shared machine every absolute time is noisy, the paired
   ratios less so.

Usage: ``.venv/bin/python benchmarks/bench_auto_checkpoint.py [--pairs 8] [--models llama resnet18 resnet18_stem]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.utils.checkpoint as tuc

from stateremat._shared.io import loadavg
from stateremat.contract import format_bytes
from stateremat.planner import plan
from stateremat.torch import PeakMemory, apply_plan, auto_checkpoint, expected_peak_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _clients import import_timm, import_transformers  # noqa: E402  (torchvision stand-in for timm)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def llama(device):
    transformers = import_transformers()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=4, vocab_size=1024, max_position_embeddings=512)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).to(device).train()
    ids = torch.randint(0, 1024, (8, 256), generator=torch.Generator().manual_seed(1)).to(device)
    return model, (lambda m: m(input_ids=ids, labels=ids, use_cache=False).loss), "model.layers.*", [ids]


def resnet18(device):
    timm = import_timm()
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10).to(device).train()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 3, 160, 160, generator=g).to(device), torch.randint(0, 10, (24,), generator=g).to(device)
    return model, (lambda m: torch.nn.functional.cross_entropy(m(x), y)), "layer?.*", [x, y]


def resnet18_stem(device):
    """timm's ResNet-18 at batch 64 with its stem (conv1, bn1, act1, maxpool) folded into one module.

    A segment is one submodule's call, so the stem's activations (the largest in the network) can
    only be replayed when the stem is one module; the fold renames its parameters (``conv1.0.*``,
    ``conv1.1.*``). Batch 64, so that parameters, gradients and momentum weigh less against the
    activations than at 24. Replaying the stem still leaves its own backward (its activations
    recomputed, their gradients, every parameter's gradient live), which bounds every plan.
    """
    timm = import_timm()
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10).to(device).train()
    model.conv1 = torch.nn.Sequential(model.conv1, model.bn1, model.act1, model.maxpool)
    model.bn1, model.act1, model.maxpool = torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 3, 160, 160, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)
    segments = ["conv1", *(f"layer{i}.{j}" for i in range(1, 5) for j in range(2))]
    return model, (lambda m: torch.nn.functional.cross_entropy(m(x), y)), segments, [x, y]


MODELS = {"llama": llama, "resnet18": resnet18, "resnet18_stem": resnet18_stem}


def trainer(model, loss_of):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step(m):
        opt.zero_grad(set_to_none=True)
        loss_of(m).backward()
        opt.step()
    return step, opt


def measured_peak(model, step, opt, inputs, device) -> int:
    step(model)
    state = (t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    grads = (p.grad for p in model.parameters() if p.grad is not None)  # no list holds them: set_to_none frees
    with PeakMemory(device, roots=[*model.parameters(), *grads, *model.buffers(), *inputs, *state]) as pm:
        step(model)
    return pm.peak_bytes


def plan_floor_bytes(model, step, opt, inputs) -> int | None:
    """A lower bound on the peak of *any* checkpointing plan of a model with a BatchNorm, in bytes.

    When autograd runs the backward of the first BatchNorm (the stem's, at the largest
    resolution), its saved input, its output gradient and its input gradient are live at once
    (3 x the input's bytes, whatever is recomputed), together with the parameters, the gradients
    of every later layer, the optimizer state and the batch. None if the model has no BatchNorm.
    """
    bn = next((m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)), None)
    if bn is None:
        return None
    order: list = []  # modules with parameters, in the order the forward ran them
    sizes: list = []

    def note(m, a, out):
        if m is bn and not sizes:
            sizes.append(a[0].numel() * a[0].element_size())
        if any(True for _ in m.parameters(recurse=False)) and m not in order:
            order.append(m)
    handles = [m.register_forward_hook(note) for m in model.modules()]
    try:
        step(model)
    finally:
        for h in handles:
            h.remove()
    early = {id(p) for m in order[:order.index(bn) + 1] for p in m.parameters(recurse=False)}
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in early)
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                if isinstance(t, torch.Tensor))
    batch = sum(t.numel() * t.element_size() for t in inputs)
    return params + grads + state + batch + 3 * sizes[0]


def torch_checkpoint(model, names) -> None:
    for name in names:
        m = model.get_submodule(name)
        fwd = types.MethodType(type(m).forward, m)
        m.forward = lambda *a, _f=fwd, **k: tuc.checkpoint(_f, *a, use_reentrant=False, **k)


def run(name: str, pairs: int, device: torch.device) -> dict:
    build = MODELS[name]
    model, loss_of, segments, inputs = build(device)
    step, opt = trainer(model, loss_of)
    eager_peak = measured_peak(model, step, opt, inputs, device)
    floor = plan_floor_bytes(model, step, opt, inputs)
    budget = eager_peak // 2
    ours, loss_ours, _, _ = build(device)
    step_ours, opt_ours = trainer(ours, loss_ours)
    t0 = time.perf_counter()
    budget_rule = "0.5 x eager measured peak"
    try:
        res = auto_checkpoint(ours, budget, step_fn=step_ours, segments=segments, optimizers=[opt_ours], repeats=3)
    except ValueError as e:  # no plan fits: say so, then plan the same card at the least budget any plan fits
        least = e.plan.min_feasible_peak_bytes
        print(f"{name}: 0.5 x eager's measured peak ({format_bytes(budget)}) is INFEASIBLE: the least predicted "
              f"peak of any plan is {format_bytes(least)} = {least / eager_peak:.3f} x eager's measured peak; "
              "planning at 1.02 x that instead", flush=True)
        budget, budget_rule = int(1.02 * least), "1.02 x the least predicted peak (0.5 x eager infeasible)"
        res = plan(e.plan.card, budget, planner="joint")
        apply_plan(ours, res)
    plan_s = time.perf_counter() - t0
    replayed = [n for n, o in zip(res.segment_names, res.options) if o != "eager"]
    ours_peak = measured_peak(ours, step_ours, opt_ours, inputs, device)
    same, loss_same, _, _ = build(device)
    torch_checkpoint(same, replayed)
    step_same, opt_same = trainer(same, loss_same)
    every, loss_every, _, _ = build(device)
    torch_checkpoint(every, res.segment_names)
    step_every, opt_every = trainer(every, loss_every)
    torch_same_peak = measured_peak(same, step_same, opt_same, inputs, device)
    runs = {"ours": (ours, step_ours), "torch_same": (same, step_same), "torch_every": (every, step_every),
            "eager": (model, step)}

    def timed(key):
        m, s = runs[key]
        _sync(device)
        t = time.perf_counter()
        s(m)
        _sync(device)
        return time.perf_counter() - t

    for key in runs:  # warm-up, excluded
        timed(key)
    times = {k: [] for k in runs}
    load_before = loadavg()
    for i in range(pairs):
        for key in (list(runs) if i % 2 == 0 else list(reversed(runs))):
            times[key].append(timed(key))
    load_after = loadavg()

    def ratio(other):
        return statistics.median(a / b for a, b in zip(times["ours"], times[other]))

    expected = expected_peak_bytes(res.card, res.options)
    return {
        "model": name, "segments": len(res.segment_names), "plan": dict(zip(res.segment_names, res.options)),
        "eager_measured_peak": eager_peak, "any_plan_floor": floor, "budget": budget, "budget_rule": budget_rule, "predicted_peak_eq3": res.predicted_peak_bytes,
        "expected_peak_chain": expected, "measured_peak": ours_peak, "fits": ours_peak <= budget,
        "measured_over_expected": ours_peak / expected, "torch_same_segments_peak": torch_same_peak,
        "profile_plan_apply_s": plan_s,
        "median_step_s": {k: statistics.median(v) for k, v in times.items()},
        "ratio_ours_over_torch_same": ratio("torch_same"), "ratio_ours_over_torch_every": ratio("torch_every"),
        "ratio_ours_over_eager": ratio("eager"), "pairs": pairs, "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


def report(r: dict) -> str:
    mb = format_bytes
    lines = [f"== {r['model']}: {r['segments']} segments, plan {list(r['plan'].values())}",
             f"eager measured peak {mb(r['eager_measured_peak'])}; budget {mb(r['budget'])} "
             f"({r['budget'] / r['eager_measured_peak']:.3f} x eager: {r['budget_rule']})",
             *([f"lower bound of any plan's peak: {mb(r['any_plan_floor'])} = "
                f"{r['any_plan_floor'] / r['eager_measured_peak']:.3f} x eager (the first BatchNorm's backward: "
                "3 x its input's bytes, with parameters, later gradients, optimizer state and batch)"]
               if r['any_plan_floor'] else []),
             f"predicted (eq. 3) {mb(r['predicted_peak_eq3'])}, expected (chain) {mb(r['expected_peak_chain'])}, "
             f"measured {mb(r['measured_peak'])} -> fits budget: {r['fits']} "
             f"(measured/expected {r['measured_over_expected']:.4f}); torch on the same segments "
             f"{mb(r['torch_same_segments_peak'])}",
             "median step s: " + ", ".join(f"{k} {v:.4f}" for k, v in r["median_step_s"].items()),
             f"time ratios (median of paired): ours/torch_same {r['ratio_ours_over_torch_same']:.3f} (target <= 1.05), "
             f"ours/torch_every {r['ratio_ours_over_torch_every']:.3f}, ours/eager {r['ratio_ours_over_eager']:.3f}; "
             f"{r['pairs']} rounds; profile+plan+apply {r['profile_plan_apply_s']:.1f} s",
             f"loadavg before {r['loadavg_before']}, after {r['loadavg_after']}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="interleaved rounds of the four methods")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    for name in args.models:
        print(report(run(name, args.pairs, device)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
