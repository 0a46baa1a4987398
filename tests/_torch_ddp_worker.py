"""2-process gloo DDP run used by tests/test_torch_ddp.py (run as a script: ``python this.py OUT``).

Each rank trains an unchecked model and the same model with StatefulCheckpoint blocks (BatchNorm
buffers declared) for two SGD steps under DistributedDataParallel, then writes the max absolute
difference of parameters and buffers to ``OUT/rank<r>.json`` (``tests/_dist.py`` spawns the ranks).
"""
from __future__ import annotations

import copy
import sys

import torch
from torch import nn

from _dist import spawn_ranks
from stateremat.torch import StatefulCheckpoint


def _blocks():
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU()),
            nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU()), nn.Linear(16, 4)]


def body(rank: int, world: int) -> dict:
    b = _blocks()
    ref = nn.Sequential(*copy.deepcopy(b))
    ours = nn.Sequential(StatefulCheckpoint(copy.deepcopy(b[0]), preserve="region"),
                         StatefulCheckpoint(copy.deepcopy(b[1]), preserve="whole"), copy.deepcopy(b[2]))
    models = [nn.parallel.DistributedDataParallel(m) for m in (ref, ours)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(2):
        x = torch.randn(16, 8, generator=g)
        for m, opt in zip(models, opts):
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    ref_t = list(ref.parameters()) + list(ref.buffers())
    our_t = list(ours.parameters()) + list(ours.buffers())
    diff = max((a.double() - b.double()).abs().max().item() for a, b in zip(ref_t, our_t))
    counts = [ours[0].recompute_count, ours[1].recompute_count]
    return {"max_abs_diff": diff, "n_tensors": len(ref_t), "recompute_counts": counts,
            "num_batches_tracked": int(ours[0].block[1].num_batches_tracked)}


if __name__ == "__main__":
    spawn_ranks(body, sys.argv[1])
