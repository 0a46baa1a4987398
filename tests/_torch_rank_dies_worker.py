"""2-process gloo run used by tests/test_torch_rank_fails.py: a rank whose ``step_fn`` raises inside
``profile`` of a model that runs its own collectives (``python this.py OUT ENGINE``; ENGINE ``ddp``
or ``fsdp``), or of a plain model whose ``step_fn`` runs one (ENGINE ``allreduce``: it all-reduces
its loss; ENGINE ``subgroup``: on a ``new_group``).

Rank 1's step raises ``KeyError`` at its first call, before the model's forward (``allreduce``: at its
second call); rank 0 is then in the framework's first collective (DDP's buffer broadcast, FSDP2's
all-gather) or in the step's all-reduce. Rank 1 records its
error and the seconds it took, then ends as an uncaught error ends a process; rank 0 records what
it raised and when. Not :func:`_dist.spawn_ranks`: a rank here ends without the closing barrier.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from stateremat.torch import profile


def _model(engine: str) -> nn.Module:
    torch.manual_seed(0)
    blocks = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU()),
                           nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU()),
                           nn.Linear(16, 4)).double()
    if engine == "ddp":
        return nn.parallel.DistributedDataParallel(blocks)
    if engine in ("allreduce", "subgroup"):
        return blocks
    from torch.distributed.fsdp import fully_shard

    for b in blocks[:2]:
        fully_shard(b)
    return fully_shard(blocks)


def _rank(rank: int, port: int, out: str, engine: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    model = _model(engine)
    group = dist.new_group([0, 1]) if engine == "subgroup" else None
    x = torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    calls = []

    def step(m):
        calls.append(1)
        if rank == 1 and (engine not in ("allreduce", "subgroup") or len(calls) == 2):
            raise KeyError("rank 1's data loader ran dry")
        loss = m(x).square().mean()
        loss.backward()
        if engine == "allreduce":
            dist.all_reduce(loss.detach())  # the user's own collective: the mean loss for logging
        elif engine == "subgroup":
            dist.all_reduce(loss.detach(), group=group)  # on a subgroup: the default group's count stays

    t = time.perf_counter()
    try:
        profile(model, ["module.0" if engine == "ddp" else "0"], step, repeats=1)
        rec = {"error_type": None}
    except Exception as e:  # noqa: BLE001 - recorded for the test
        rec = {"error_type": type(e).__name__, "error_message": str(e)[:2000]}
    rec["seconds"] = time.perf_counter() - t
    Path(out, f"rank{rank}.json").write_text(json.dumps(rec))
    os._exit(1 if rec["error_type"] else 0)  # as an uncaught error ends the process (no barrier, no teardown)


if __name__ == "__main__":
    out, engine = sys.argv[1], sys.argv[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, out, engine)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    for p in procs:
        if p.is_alive():
            p.kill()
