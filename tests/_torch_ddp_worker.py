"""2-process gloo DDP run used by tests/test_torch_ddp.py (run as a script: ``python this.py OUT``).

Each rank trains an unchecked model and the same model with StatefulCheckpoint blocks (BatchNorm
buffers declared) for two SGD steps under DistributedDataParallel, then writes the max absolute
difference of parameters and buffers to ``OUT/rank<r>.json``.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from stateremat.torch import StatefulCheckpoint


def _blocks():
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU()),
            nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU()), nn.Linear(16, 4)]


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
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
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"max_abs_diff": diff, "n_tensors": len(ref_t), "recompute_counts": counts,
                       "num_batches_tracked": int(ours[0].block[1].num_batches_tracked)}, f)
        dist.barrier()  # nobody tears down gloo while a peer still reads from it
    finally:
        dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, sys.argv[1]), nprocs=2, join=True)


if __name__ == "__main__":
    main()
