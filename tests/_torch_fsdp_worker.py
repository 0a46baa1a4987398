"""2-process gloo FSDP2 run used by tests/test_torch_fsdp.py (run as a script: ``python this.py OUT``).

One spawn, many cells. Each cell trains, for 3 SGD steps in float64, an FSDP2 model without
checkpointing and the same model with stateremat's checkpoint *around* sharded units (the replay
runs with the parameters FSDP gathers at backward, see ``stateremat/torch/_framework.py``), and
records whether every local parameter shard and every buffer is equal bit for bit, and the
BatchNorm batch counters (updated once per step). Results go to ``OUT/rank<r>.json`` (``tests/_dist.py`` spawns the ranks).
"""
from __future__ import annotations

import functools
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import fully_shard

from _dist import bits_equal, cell, spawn_ranks
from stateremat.torch import (
    apply_plan,
    checkpoint,
    checkpoint_sequential,
    preservation_stats,
    profile,
    reset_preservation_stats,
)

STEPS = 3


def _blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU()),
                         nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU()),
                         nn.Linear(16, 4)).double()


class Around(nn.Module):
    """``fully_shard(block)`` for each block, then ``checkpoint(block, x, state=[block])``."""

    def __init__(self, ck: bool, preserve: str) -> None:
        super().__init__()
        self.seq, self.ck, self.preserve = _blocks(), ck, preserve
        for b in self.seq[:2]:
            fully_shard(b)
        fully_shard(self)

    def forward(self, x):
        for b in self.seq[:2]:
            x = checkpoint(b, x, state=[b], preserve=self.preserve) if self.ck else b(x)
        return self.seq[2](x)


class Sequential(nn.Module):
    """``checkpoint_sequential`` over sharded units (state: each chunk's buffers)."""

    def __init__(self, ck: bool, preserve: str) -> None:
        super().__init__()
        self.seq, self.ck, self.preserve = _blocks(), ck, preserve
        for b in self.seq:
            fully_shard(b)
        fully_shard(self)

    def forward(self, x):
        return checkpoint_sequential(self.seq, 2, x, preserve=self.preserve) if self.ck else self.seq(x)


class Wrapped(nn.Module):
    """``apply_activation_checkpointing`` after ``fully_shard``, stateremat's checkpoint as ``checkpoint_fn``."""

    def __init__(self, ck: bool, preserve: str) -> None:
        super().__init__()
        self.seq = _blocks()
        units = list(self.seq[:2])
        for b in units:
            fully_shard(b)
        fully_shard(self)
        if ck:
            wrapper = functools.partial(checkpoint_wrapper, checkpoint_fn=checkpoint, state="buffers", preserve=preserve)
            apply_activation_checkpointing(self.seq, checkpoint_wrapper_fn=wrapper,
                                           check_fn=lambda m: any(m is u for u in units))

    def forward(self, x):
        return self.seq(x)


class Spanning(Sequential):
    """One default (``state="auto"``) segment spanning two sharded units (each unit sharded as in
    :class:`Sequential`): FSDP2 re-gathers their parameters inside the replay (its all-gather
    copies into its own buffers are not state)."""

    def forward(self, x):
        two = lambda t: self.seq[1](self.seq[0](t))  # noqa: E731
        return self.seq[2](checkpoint(two, x, preserve=self.preserve) if self.ck else two(x))


def _cell(cls: type, preserve: str, rank: int) -> dict:
    models = [cls(False, preserve), cls(True, preserve)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    reset_preservation_stats()
    for _ in range(STEPS):
        x = torch.randn(16, 8, generator=g, dtype=torch.float64)
        for m, opt in zip(models, opts):
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    ref, ours = models
    pairs = list(zip(ref.parameters(), ours.parameters())) + list(zip(ref.buffers(), ours.buffers()))
    return {"equal": all(bits_equal(a, b) for a, b in pairs), "n_tensors": len(pairs),
            "losses_equal": losses[0::2] == losses[1::2], "replays": preservation_stats().recompute_count,
            "batches": [int(m.num_batches_tracked) for m in ours.modules() if isinstance(m, nn.BatchNorm1d)]}


def _plans(rank: int) -> dict:
    """apply_plan refuses plans that differ across ranks (on every rank) and takes equal ones."""
    model = _blocks()
    names = ["0", "1"]
    rec = {}
    try:
        apply_plan(model, {"options": ["whole", "region" if rank else "whole"], "segment_names": names})
        rec["refused"] = None
    except ValueError as e:
        rec["refused"] = str(e)
    rec["unwrapped"] = all("forward" not in vars(model[i]) for i in range(2))  # refused before wrapping
    apply_plan(model, {"options": ["whole", "region"], "segment_names": names})
    rec["applied"] = all("forward" in vars(model[i]) for i in range(2))
    return rec


def _profile(rank: int) -> dict:
    """profile's card is the same on every rank (every figure the max over the ranks)."""
    model = _blocks()
    torch.manual_seed(rank)
    x = torch.randn(32 * (1 + rank), 8, dtype=torch.float64)  # ranks measure different costs
    card = profile(model, ["0", "1"], x, repeats=1)
    figures = [card.persistent_bytes] + [(s.name, o, c.retained_bytes, c.temp_bytes, c.time_s)
                                         for s in card.segments for o, c in sorted(s.options.items())]
    gathered = [None, None]
    dist.all_gather_object(gathered, figures)
    return {"same": gathered[0] == gathered[1], "figures": figures}


CELLS = {f"{cls.__name__.lower()}/{p}": (cls, p) for cls in (Around, Sequential, Wrapped, Spanning) for p in ("whole", "region")}


def body(rank: int, world: int) -> dict:
    rec = {name: cell(_cell, cls, preserve, rank) for name, (cls, preserve) in CELLS.items()}  # FSDP2 cells
    rec.update((name, cell(fn, rank)) for name, fn in (("plans", _plans), ("profile", _profile)))
    return rec


if __name__ == "__main__":
    spawn_ranks(body, sys.argv[1])
