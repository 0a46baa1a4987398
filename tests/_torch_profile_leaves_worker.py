"""2-process gloo run used by tests/test_torch_profile_leaves.py (run as a script: ``python this.py OUT``).

One spawn, many cells: ``engine/api/when`` with engine ``ddp`` (``DistributedDataParallel``) or
``fsdp`` (FSDP2: ``fully_shard`` per block, then the root), api ``profile`` or ``auto_checkpoint``,
and when ``fresh`` (before any training step), ``nograd`` (after a forward under ``torch.no_grad``)
``stepped`` (after one SGD step) or ``nosync`` (fresh, profiled with a ``step_fn`` whose backward
runs with gradient sync off, as one micro-batch of accumulation). A cell builds two identical models and brings both to
``when``; it records the profiled model's parameters, buffers, gradients and (FSDP2) each unit's
FSDP state, calls ``api`` on one of them, records them again, then trains both 3 SGD steps in
float64 and records whether losses, every local parameter shard and every buffer are equal bit for
bit (``auto_checkpoint`` leaves its plan applied: the profiled model then trains checkpointed).
"""
from __future__ import annotations

import functools
import sys

import torch
from torch import nn

from _dist import bits_equal, cell, spawn_ranks

STEPS = 3
D = torch.float64


def _blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU()),
                         nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU()),
                         nn.Linear(16, 4)).to(D)


def build(engine: str) -> tuple[nn.Module, list[str]]:
    model = _blocks()
    if engine == "ddp":
        return nn.parallel.DistributedDataParallel(model), ["module.0", "module.1"]
    from torch.distributed.fsdp import fully_shard

    for b in model[:2]:
        fully_shard(b)
    fully_shard(model)
    return model, ["0", "1"]


def _fsdp_state(model: nn.Module) -> list:
    """What FSDP2 holds for each unit: root flag, training state, whether sharded, and per managed
    parameter its sharded state, that the module binds the sharded parameter, and its bytes."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for name, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        st = m._get_fsdp_state()
        rec = [name, (st._is_root, len(st._state_ctx.all_states)), str(st._training_state)]
        for g in st._fsdp_param_groups:
            rec += [g.is_sharded, str(g._training_state)]
            for fp in g.fsdp_params:
                mod, attr = fp._module_info.module, fp._module_info.param_name
                rec += [str(fp.sharded_state), mod._parameters[attr] is fp.sharded_param,
                        fp._sharded_param_data.untyped_storage().size() > 0,
                        fp.sharded_param.to_local().detach().clone()]
        out.append(rec)
    return out


def _snapshot(model: nn.Module) -> list:
    out = [(n, p, p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
           for n, p in model.named_parameters()]
    out += [(n, b, b.detach().clone(), None) for n, b in model.named_buffers()]
    return out


def _same_snapshot(before: list, after: list) -> list[str]:
    """Names whose binding, bytes or gradient changed."""
    bad = [a[0] for a, b in zip(before, after) if a[0] != b[0] or a[1] is not b[1] or not bits_equal(a[2], b[2])
           or (a[3] is None) != (b[3] is None) or (a[3] is not None and not bits_equal(a[3], b[3]))]
    return bad + (["<count>"] if len(before) != len(after) else [])


def _same_fsdp(before: list, after: list) -> bool:
    """Equal FSDP2 state; FSDP2's one-time lazy init (root flag, states), if it had not run
    before, is FSDP2's own set-up of its first forward and stays."""
    if len(before) != len(after):
        return False
    for a, b in zip(before, after):
        if len(a) != len(b):
            return False
        for i, (x, y) in enumerate(zip(a, b)):
            if i == 1 and x[0] is None:
                continue
            if isinstance(x, torch.Tensor):
                if not bits_equal(x, y):
                    return False
            elif x != y:
                return False
    return True


def _step(model: nn.Module, opt, x: torch.Tensor) -> float:
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _nosync_step(engine: str, x: torch.Tensor, opt):
    """A profiled step that is one micro-batch of gradient accumulation, as the user wrote it:
    backward with gradient sync off (DDP's ``no_sync``; FSDP2 then keeps the gradients on its
    unsharded parameters), then the optimizer step."""
    import contextlib

    def step(model: nn.Module) -> None:
        if engine == "ddp":
            ctx = model.no_sync()
        else:
            model.set_requires_gradient_sync(False)
            ctx = contextlib.nullcontext()
        with ctx:
            model(x).square().mean().backward()
        if engine == "fsdp":
            model.set_requires_gradient_sync(True)
        opt.step()
        opt.zero_grad()
    return step


def _run_cell(engine: str, api: str, when: str, rank: int) -> dict:
    from stateremat.torch import auto_checkpoint, profile

    models = [build(engine) for _ in range(2)]
    (ref, _), (ours, names) = models
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, ours)]
    g = torch.Generator().manual_seed(100 + rank)
    xs = [torch.randn(16, 8, generator=g, dtype=D) for _ in range(STEPS + 1)]
    losses = [[], []]
    for i, (m, opt) in enumerate(zip((ref, ours), opts)):
        if when == "nograd":
            with torch.no_grad():
                m(xs[0])
        elif when == "stepped":
            losses[i].append(_step(m, opt, xs[0]))
    sample = torch.randn(16, 8, generator=torch.Generator().manual_seed(7 + rank), dtype=D)
    before, fsdp_before = _snapshot(ours), _fsdp_state(ours) if engine == "fsdp" else []
    rng = torch.get_rng_state()
    plan = None
    step = _nosync_step(engine, sample, opts[1]) if when == "nosync" else None
    if api == "profile":
        profile(ours, names, step or sample, repeats=1, optimizers=[opts[1]] if step else ())
    elif step:
        plan = auto_checkpoint(ours, 0.97, step_fn=step, optimizers=[opts[1]], segments=names, repeats=1,
                               peak="eq3").options
    else:
        plan = auto_checkpoint(ours, 0.97, sample=sample, segments=names, repeats=1, peak="eq3").options
    rec = {"changed": _same_snapshot(before, _snapshot(ours)), "rng_equal": torch.equal(rng, torch.get_rng_state()),
           "fsdp_equal": _same_fsdp(fsdp_before, _fsdp_state(ours) if engine == "fsdp" else []), "plan": plan}
    for i, (m, opt) in enumerate(zip((ref, ours), opts)):
        losses[i] += [_step(m, opt, x) for x in xs[1:]]
    pairs = list(zip(ref.parameters(), ours.parameters())) + list(zip(ref.buffers(), ours.buffers()))
    rec.update(equal=all(bits_equal(a, b) for a, b in pairs), n_tensors=len(pairs),
               losses_equal=losses[0] == losses[1],
               batches=[int(m.num_batches_tracked) for m in ours.modules() if isinstance(m, nn.BatchNorm1d)])
    return rec


CELLS = [(e, a, w) for e in ("ddp", "fsdp") for a in ("profile", "auto_checkpoint")
         for w in ("fresh", "nograd", "stepped", "nosync")]


def body(only: str, rank: int, world: int) -> dict:
    return {"/".join(c): cell(_run_cell, *c, rank) for c in CELLS if only in "/".join(c)}


if __name__ == "__main__":
    spawn_ranks(functools.partial(body, sys.argv[2] if len(sys.argv) > 2 else ""), sys.argv[1])
