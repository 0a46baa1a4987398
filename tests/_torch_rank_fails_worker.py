"""2-process gloo run used by tests/test_torch_rank_fails.py (run as a script: ``python this.py OUT``).

One spawn, many cells, each a call of ``profile`` or ``apply_plan`` that fails on rank 1 only, before
the call's collectives: rank 1 records its own error, rank 0 the error it raises instead of waiting
for rank 1 in the collective forever. The last cell checks that the group is still in step: a
``profile`` and ``apply_plan`` on both ranks then succeed with one card.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn

from _dist import cell, spawn_ranks
from stateremat.torch import apply_plan, profile


def _blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU()),
                         nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU()),
                         nn.Linear(16, 4)).double()


def _x() -> torch.Tensor:
    return torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _plan_check(rank: int) -> dict:
    """apply_plan: rank 1's plan names a submodule the model lacks."""
    model = _blocks()
    apply_plan(model, {"options": ["whole", "region"], "segment_names": ["0", "9" if rank else "1"]})
    return {"applied": True}


def _profile_check(rank: int) -> dict:
    """profile: rank 1 names a segment the model lacks (refused before any step)."""
    profile(_blocks(), ["0", "9" if rank else "1"], _x(), repeats=1)
    return {"profiled": True}


def _profile_step(rank: int) -> dict:
    """profile: rank 1's step raises in its third step (the model has no collectives of its own)."""
    model, calls = _blocks(), [0]

    def step(m):
        calls[0] += 1
        if rank and calls[0] == 3:
            raise KeyError("rank 1's data loader ran dry")
        m(_x()).square().mean().backward()

    profile(model, ["0", "1"], step, repeats=1)
    return {"profiled": True}


def _in_step(rank: int) -> dict:
    """After the failures: both ranks profile and apply a plan; one card, the model wrapped."""
    model = _blocks()
    card = profile(model, ["0", "1"], _x(), repeats=1)
    figures = [card.persistent_bytes] + [(s.name, o, c.retained_bytes) for s in card.segments
                                         for o, c in sorted(s.options.items())]
    gathered = [None, None]
    dist.all_gather_object(gathered, figures)
    apply_plan(model, {"options": ["whole", "region"], "segment_names": ["0", "1"]})
    return {"same": gathered[0] == gathered[1], "wrapped": all("forward" in vars(model[i]) for i in range(2))}


CELLS = {"plan_check": _plan_check, "profile_check": _profile_check, "profile_step": _profile_step,
         "in_step": _in_step}


def body(rank: int, world: int) -> dict:
    return {name: cell(fn, rank) for name, fn in CELLS.items()}


if __name__ == "__main__":
    spawn_ranks(body, sys.argv[1])
