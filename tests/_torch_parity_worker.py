"""The parity matrix's worker (tests/test_torch_parity_matrix.py): ``python this.py OUT ENGINE``.

One spawn per engine (``tests/_dist.py``: 2 gloo ranks on CPU, one process for ``single``), many
cells per spawn. A cell is ``model/compile/preserve``: it trains, for :data:`STEPS` SGD steps in
float64, the engine's model without checkpointing and the same model with stateremat's
checkpoint (both compiled alike), with the same seeds, and records whether losses, every local
parameter shard and every buffer are equal bit for bit, the default generator's state after
every step (RNG equal), the batch and token counters (updated once per step) and the replays.

Engines: ``single`` (one process), ``ddp`` (``DistributedDataParallel``), ``fsdp_inside``
(``fully_shard`` around a module whose forward runs the checkpoint: torchtitan's order, and
transformers' own hook, which checkpoints ``forward`` below FSDP2's hooks), ``fsdp_around``
(``fully_shard(block)`` then the checkpoint around the sharded unit), ``tp`` (tensor parallel:
``ColwiseParallel``/``RowwiseParallel`` linears, ``DTensor`` parameters; the counter block's
buffers are replicated ``DTensor`` state). Models: a tiny transformers Llama with dropout
(random weights from a config), a block with a token counter and a 32 KiB queue it reads and
writes in forward (above the small-storage threshold: ``region`` journals it), a BatchNorm block.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import time

import torch
from torch import nn

from _dist import bits_equal, cell, spawn_ranks

STEPS = 3
D = torch.float64
VOCAB = 96
WIDTH = 16
QUEUE = 256  # rows of the queue: 256 x 16 float64 = 32 KiB per rank

#: (model, compile, preserve) cells per engine. ``inductor``: with
#: ``torch._inductor.config.fallback_random = True`` (inductor draws torch's random numbers), equal to
#: the compiled model without checkpointing to :data:`INDUCTOR_TOLERANCE`; ``inductor_rng``:
#: inductor's default (its own random numbers), refused at the first forward. To keep the file within
#: a few minutes on 2 loaded cores, the Llama is compiled (9-40 s a cell) with aot_eager in ``single``
#: and ``fsdp_around`` only and with inductor nowhere, the BatchNorm block with inductor in ``single``
#: only; ``STATEREMAT_PARITY_FULL=1`` runs every model with every compile mode in every engine (all
#: pass: 66 cells in 2 min 16 s to 4 min 26 s here, inductor's cache warm, by the load).
FULL = os.environ.get("STATEREMAT_PARITY_FULL") == "1"
_EAGER = [(m, "none", p) for m in ("llama", "counter", "bn") for p in ("whole", "region")]
_AOT = [(m, "aot_eager", "region") for m in ("counter", "bn")]
_AOT_LLAMA = [("llama", "aot_eager", "region")]
_INDUCTOR = [("counter", "inductor", "region"), ("bn", "inductor", "whole")]
_REFUSED = [("counter", "inductor_rng", "region")]
if FULL:
    CELLS = {e: _EAGER + _AOT + _AOT_LLAMA + _INDUCTOR + [("llama", "inductor", "region")] + _REFUSED
             for e in ("single", "ddp", "fsdp_inside", "fsdp_around", "tp")}
else:  # every compile mode in every engine; the Llama compiled in two engines, bn under inductor in one
    CELLS = {
        "single": _EAGER + _AOT + _AOT_LLAMA + _INDUCTOR + _REFUSED,
        "ddp": _EAGER + _AOT + [("counter", "inductor", "whole")],
        "fsdp_inside": _EAGER + _AOT + _INDUCTOR[:1],
        "fsdp_around": _EAGER + _AOT + _AOT_LLAMA + _INDUCTOR[:1],
        "tp": _EAGER + _AOT + _INDUCTOR[:1],
    }
#: inductor compiles the blocks the checkpoint runs eagerly (its fused float64 kernels round
#: otherwise): max |difference| of losses, parameters and buffers after 3 steps, measured
#: 5.6e-17 (counter), 2.2e-16 (bn), 2.8e-9 (llama: 3 SGD steps through softmax and cross-entropy);
#: inductor itself is bitwise deterministic run to run here.
INDUCTOR_TOLERANCE = {"counter": 1e-12, "bn": 1e-12, "llama": 1e-7}


# -- models ---------------------------------------------------------------------------------
class CounterBlock(nn.Module):
    """A token counter and a queue (ring buffer) written in forward; the output reads the queue
    before this step's enqueue, so the replay must see the forward's queue bytes."""

    def __init__(self, mesh=None) -> None:
        super().__init__()
        self.up, self.down, self.drop = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH), nn.Dropout(0.2)
        self.mesh = mesh
        tokens, queue, ptr = torch.zeros((), dtype=torch.int64), torch.zeros(QUEUE, WIDTH), torch.zeros((), dtype=torch.int64)
        if mesh is not None:  # tensor parallel: replicated DTensor state
            from torch.distributed.tensor import Replicate, distribute_tensor

            tokens, queue = (distribute_tensor(t, mesh, [Replicate()]) for t in (tokens, queue))
        self.register_buffer("tokens", tokens)
        self.register_buffer("queue", queue)
        self.register_buffer("ptr", ptr)

    def forward(self, x):
        h = self.down(self.drop(torch.tanh(self.up(x))))
        q = self.queue.to_local() if self.mesh is not None else self.queue
        out = h + q.mean(0)
        self.tokens.add_(x.shape[0])
        k = h.detach()[:2]
        if self.mesh is not None:  # writes through the DTensor
            from torch.distributed.tensor import DTensor, Replicate

            self.queue.copy_(torch.cat([self.queue[2:], DTensor.from_local(k, self.mesh, [Replicate()])]))
        else:
            self.queue.index_copy_(0, (self.ptr + torch.arange(2)) % QUEUE, k)
        self.ptr.add_(2).remainder_(QUEUE)
        return out


class BnBlock(nn.Module):
    """Linear, ReLU, Linear, BatchNorm, Dropout."""

    def __init__(self, mesh=None) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)
        self.bn, self.drop = nn.BatchNorm1d(WIDTH), nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.bn(self.down(torch.relu(self.up(x)))))


class Unit(nn.Module):
    """Runs ``block``, through stateremat's checkpoint when ``ck`` (declaring the block's buffers)."""

    def __init__(self, block: nn.Module, ck: bool, preserve: str) -> None:
        super().__init__()
        self.block, self.ck, self.preserve = block, ck, preserve

    def forward(self, x):
        from stateremat.torch import checkpoint

        return checkpoint(self.block, x, state="buffers", preserve=self.preserve) if self.ck else self.block(x)


class Net(nn.Module):
    def __init__(self, kind: str, ck: bool, preserve: str, mesh=None) -> None:
        super().__init__()
        torch.manual_seed(0)
        cls = CounterBlock if kind == "counter" else BnBlock
        self.stem, self.head = nn.Linear(8, WIDTH), nn.Linear(WIDTH, 4)
        self.units = nn.ModuleList(Unit(cls(mesh), ck, preserve) for _ in range(2))
        self.to(D)

    def forward(self, x):
        x = self.stem(x)
        for u in self.units:
            x = u(x)
        return self.head(x)


def _llama():
    from _clients import import_transformers

    transformers = import_transformers()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=32,
                                      attention_dropout=0.2)
    return transformers.LlamaForCausalLM(config).to(D).train()


def _tp_plan(model: nn.Module) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for name, m in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "up"):
            plan[name] = ColwiseParallel()
        elif last in ("o_proj", "down_proj", "down"):
            plan[name] = RowwiseParallel()
    return plan


def build(engine: str, kind: str, ck: bool, preserve: str, compile_: str) -> nn.Module:
    """The engine's model ``kind``, checkpointed when ``ck``, compiled with ``compile_``."""
    from torch.distributed.fsdp import fully_shard

    mesh = None
    if engine == "tp":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2,))
    if kind == "llama":
        model = _llama()
        layers = list(model.model.layers)
        if engine == "tp":
            from torch.distributed.tensor.parallel import parallelize_module

            parallelize_module(model, mesh, _tp_plan(model))
        if engine.startswith("fsdp"):
            for layer in layers:
                fully_shard(layer)
            fully_shard(model)
        if ck and engine == "fsdp_around":  # stateremat's checkpoint around each sharded layer
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                apply_activation_checkpointing, checkpoint_wrapper)

            from stateremat.torch import checkpoint

            wrapper = functools.partial(checkpoint_wrapper, checkpoint_fn=checkpoint, state="buffers", preserve=preserve)
            apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper,
                                           check_fn=lambda m: any(m is layer for layer in layers))
        elif ck:  # transformers' own hook: the checkpoint runs forward, below FSDP2's hooks
            from stateremat.integrations.transformers import enable

            enable(model, preserve=preserve)
    else:
        model = Net(kind, ck, preserve, mesh)
        if engine == "tp":
            from torch.distributed.tensor.parallel import parallelize_module

            for u in model.units:
                parallelize_module(u.block, mesh, _tp_plan(u.block))
        elif engine == "fsdp_inside":
            for u in model.units:
                fully_shard(u)  # FSDP2's hooks around Unit.forward, which runs the checkpoint
            fully_shard(model)
        elif engine == "fsdp_around":
            for u in model.units:
                fully_shard(u.block)  # the checkpoint in Unit.forward runs the sharded unit's hooks
            fully_shard(model)
    if engine == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    if compile_ != "none":
        model = torch.compile(model, backend="inductor" if compile_.startswith("inductor") else compile_)
    return model


# -- one cell ---------------------------------------------------------------------------------
def _batches(engine: str, kind: str, rank: int) -> list:
    g = torch.Generator().manual_seed(100 + (0 if engine in ("single", "tp") else rank))  # TP: one batch
    if kind == "llama":
        return [torch.randint(0, VOCAB, (2, 12), generator=g) for _ in range(STEPS)]
    return [torch.randn(16, 8, generator=g, dtype=D) for _ in range(STEPS)]


def _loss(model: nn.Module, kind: str, batch: torch.Tensor) -> torch.Tensor:
    if kind == "llama":
        return model(input_ids=batch, labels=batch, use_cache=False).loss
    return model(batch).square().mean()


def _rng() -> str:
    return hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]


def _train(model: nn.Module, kind: str, batches: list) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, rngs = [], []
    for step, batch in enumerate(batches):
        torch.manual_seed(1000 + step)
        loss = _loss(model, kind, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        rngs.append(_rng())
    return {"losses": losses, "rngs": rngs}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if hasattr(a, "to_local"):
        a, b = a.to_local(), b.to_local()
    if not a.is_floating_point():
        return float((a != b).any())
    return float((a.detach() - b.detach()).abs().max()) if a.numel() else 0.0


def run_cell(engine: str, kind: str, compile_: str, preserve: str, rank: int) -> dict:
    if compile_ == "inductor":
        import torch._inductor.config as inductor_config

        with inductor_config.patch(fallback_random=True):
            return _run_cell(engine, kind, compile_, preserve, rank)
    if compile_ == "inductor_rng":  # refused at the first forward: no reference needed
        torch._dynamo.reset()
        model = build(engine, kind, True, preserve, compile_)
        torch.manual_seed(1000)
        _loss(model, kind, _batches(engine, kind, rank)[0]).backward()
        return {"refused": False}
    return _run_cell(engine, kind, compile_, preserve, rank)


def _run_cell(engine: str, kind: str, compile_: str, preserve: str, rank: int) -> dict:
    from stateremat.torch import preservation_stats, reset_preservation_stats

    t0 = time.perf_counter()
    if compile_ != "none":
        torch._dynamo.reset()
    batches = _batches(engine, kind, rank)
    ref_model = build(engine, kind, False, preserve, compile_)
    ref = _train(ref_model, kind, batches)
    model = build(engine, kind, True, preserve, compile_)
    reset_preservation_stats()
    ours = _train(model, kind, batches)
    replays = preservation_stats().recompute_count
    pairs = list(zip(ref_model.parameters(), model.parameters())) + list(zip(ref_model.buffers(), model.buffers()))
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    unequal = [n for n, (a, b) in zip(names, pairs) if not bits_equal(a, b)]
    counters = {n: int(b.to_local() if hasattr(b, "to_local") else b) for n, b in model.named_buffers()
                if n.rsplit(".", 1)[-1] in ("num_batches_tracked", "tokens")}
    return {"equal": not unequal, "unequal": unequal[:6], "n_tensors": len(pairs),
            "losses_equal": ref["losses"] == ours["losses"], "rng_equal": ref["rngs"] == ours["rngs"],
            "max_diff": max([_max_diff(a, b) for a, b in pairs] + [abs(x - y) for x, y in zip(ref["losses"], ours["losses"])]),
            "counters": counters, "batch": int(batches[0].shape[0]), "replays": replays,
            "seconds": round(time.perf_counter() - t0, 2)}


def body(engine: str, rank: int, world: int) -> dict:
    return {f"{m}/{c}/{p}": cell(run_cell, engine, m, c, p, rank) for m, c, p in CELLS[engine]}


if __name__ == "__main__":
    engine = sys.argv[2]
    spawn_ranks(functools.partial(body, engine), sys.argv[1], world=1 if engine == "single" else 2)
