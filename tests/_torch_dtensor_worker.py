"""DTensor state on 2 gloo ranks, used by tests/test_torch_dtensor_state.py (``python this.py OUT``).

Each cell trains, for :data:`STEPS` SGD steps in float64, a block whose ``DTensor`` buffer is read
and written in forward (strided partial writes through the DTensor, one through its local shard),
without checkpointing and with stateremat's checkpoint, and records whether losses, parameters
and the buffer's local shards are bitwise equal. Sizes straddle the
16 KiB small-storage threshold per rank (``region`` keeps small storages whole and journals the
others). ``undeclared`` cells write a DTensor the segment does not declare (refused, naming it);
``outside`` cells write the declared DTensor between the forward and the backward, outside any
segment.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from _dist import bits_equal, cell, spawn_ranks

STEPS = 3
D = torch.float64
#: rows of 8 float64 per rank: 64 B, 16 KiB (the threshold: kept whole), just above it, 256 KiB
SIZES = (1, 256, 257, 4096)


class Block(nn.Module):
    def __init__(self, mesh, n: int, placement: str, extra_int: bool = False) -> None:
        super().__init__()
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8).to(D)
        place = [Shard(0)] if placement == "shard" else [Replicate()]
        total = 2 * n if placement == "shard" else n
        self.register_buffer("state", distribute_tensor(torch.arange(total * 8, dtype=D).view(total, 8) / total,
                                                        mesh, place))
        self.extra_int = extra_int
        if extra_int:  # a 2-D integer DTensor counter (not a 1-D float a byte probe would compare)
            self.register_buffer("hits", distribute_tensor(torch.zeros(2 * n, 4, dtype=torch.int64), mesh, [Shard(0)]))

    def forward(self, x):
        fresh = self.state[:, 2:4] * 2.0  # a DTensor made in the segment, written in place: not state
        fresh.add_(1.0)
        x = x * (1 + fresh.to_local()[:1].sum() * 1e-3)
        s = self.state.to_local()
        out = self.lin(x) * (1 + s[:1].sum() * 1e-2)  # reads B0: the replay must see the forward's bytes
        if self.extra_int:
            self.hits.add_(1)
            return out
        self.state[:, :2].mul_(0.5).add_(1.0)  # strided partial writes through the DTensor (16 B of every 64)
        self.state.to_local()[-1:, -1:].copy_(out.detach().mean().reshape(1, 1))  # one through the local shard
        return out


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2,))


def _train(model: nn.Module, ck: dict | None, rank: int, outside: str | None = None) -> list[float]:
    from stateremat.torch import checkpoint, journal_writes

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(4, 8, generator=g, dtype=D)
        y = checkpoint(model, x, **ck) if ck is not None else model(x)
        if outside == "write":  # between the forward and the backward, outside any segment
            model.state.add_(3.0)
        elif outside == "journal_writes":
            with journal_writes():
                model.state.add_(3.0)
        loss = y.square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _state_arg(model: nn.Module, declare: str):
    return "buffers" if declare == "buffers" else [model.state]


def promoted(n: int, rank: int, default: bool = False) -> dict:
    """``on_undeclared="declare"`` (or the default ``state="auto"``): the undeclared DTensor is
    preserved before its first write."""
    mesh = _mesh()
    ref, ours = Block(mesh, n, "shard"), Block(mesh, n, "shard")
    ref_losses = _train(ref, None, rank)
    losses = _train(ours, {} if default else {"on_undeclared": "declare"}, rank)
    pairs = list(zip(ref.parameters(), ours.parameters())) + list(zip(ref.buffers(), ours.buffers()))
    return {"equal": all(bits_equal(a, b) for a, b in pairs), "losses_equal": losses == ref_losses}


def declared(n: int, placement: str, preserve: str, declare: str, outside: str | None, rank: int) -> dict:
    from stateremat.torch import preservation_stats, reset_preservation_stats

    mesh = _mesh()
    ref, ours = Block(mesh, n, placement), Block(mesh, n, placement)
    ref_losses = _train(ref, None, rank, outside)
    reset_preservation_stats()
    losses = _train(ours, {"state": _state_arg(ours, declare), "preserve": preserve}, rank, outside)
    stats = preservation_stats()
    pairs = list(zip(ref.parameters(), ours.parameters())) + list(zip(ref.buffers(), ours.buffers()))
    return {"equal": all(bits_equal(a, b) for a, b in pairs), "losses_equal": losses == ref_losses,
            "replays": stats.recompute_count, "peak_retained": stats.peak_retained_state_bytes,
            "shard_bytes": ours.state.to_local().untyped_storage().nbytes(), "is_dtensor": type(ours.state).__name__}


def undeclared(n: int, extra_int: bool, rank: int) -> dict:
    from stateremat.torch import checkpoint

    model = Block(_mesh(), n, "shard", extra_int)
    x = torch.randn(4, 8, dtype=D)
    checkpoint(model, x, state=None).sum().backward()  # strict mode
    return {"refused": False}


def body(rank: int, world: int) -> dict:
    rec = {}
    for placement in ("shard", "replicate"):
        for n in SIZES:
            for preserve in ("whole", "region"):
                for declare in ("buffers", "list"):
                    rec[f"declared/{placement}/{n}/{preserve}/{declare}"] = cell(
                        declared, n, placement, preserve, declare, None, rank)
    for preserve in ("whole", "region"):
        for outside in ("write", "journal_writes"):
            rec[f"outside/{outside}/{preserve}"] = cell(declared, SIZES[-1], "shard", preserve, "buffers", outside, rank)
    for n in (SIZES[0], SIZES[-1]):
        for extra_int in (False, True):
            rec[f"undeclared/{n}/{'int2d' if extra_int else 'float1d'}"] = cell(undeclared, n, extra_int, rank)
    for n in (SIZES[0], SIZES[-1]):
        rec[f"promoted/{n}"] = cell(promoted, n, rank)
        rec[f"auto/{n}"] = cell(promoted, n, rank, True)
    return rec


if __name__ == "__main__":
    spawn_ranks(body, sys.argv[1])
