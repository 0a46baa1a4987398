"""The multi-process tests' one spawn helper: 2 CPU ranks on gloo over loopback, many cells per spawn.

Test side: :func:`run_ranks` runs a worker script (``python worker.py OUT [ARGS...]``) in a fresh
interpreter, once more if gloo's loopback set-up or tear-down aborts (rarely, outside our code),
and returns each rank's JSON record. Worker side: the script's ``main()`` calls
:func:`spawn_ranks` with a ``body(rank, world) -> dict``; every rank runs ``body`` inside an
initialized ``gloo`` process group (none when ``world == 1``: a single process), writes
``OUT/rank<r>.json`` and waits for its peers before tearing gloo down. :func:`cell` runs one cell
and records its exception (type and traceback) instead of letting it end the spawn.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

TESTS = Path(__file__).parent


def run_ranks(script: str, tmp_path: Path, timeout: float, args: tuple = (), world: int = 2) -> list[dict]:
    """Run ``tests/<script>`` with ``OUT`` (a fresh folder under ``tmp_path``) and ``args``; the ranks' records."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    errors = []
    for attempt in range(2):  # one retry: gloo's loopback set-up/tear-down aborts rarely, outside our code
        out = tmp_path / f"{Path(script).stem}-{'-'.join(map(str, args))}-attempt{attempt}"
        out.mkdir(parents=True)
        proc = subprocess.run([sys.executable, str(TESTS / script), str(out), *map(str, args)], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode == 0:
            break
        errors.append(proc.stderr[-4000:])
    assert proc.returncode == 0, "\n---\n".join(errors)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


def cell(fn: Callable[..., dict], *args: Any) -> dict:
    """``fn(*args)``, or ``{"error": traceback, "error_type": exception class name}`` if it raised."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - recorded for the test's message
        return {"error": traceback.format_exc()[-4000:], "error_type": type(e).__name__,
                "error_message": str(e)[:2000]}


def _rank(rank: int, world: int, port: int, out_dir: str, body: Callable[[int, int], dict]) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    if world == 1:
        rec = body(rank, world)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(rec))
        return
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rec = body(rank, world)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(rec))
        dist.barrier()  # nobody tears down gloo while a peer still reads from it
    finally:
        dist.destroy_process_group()


def spawn_ranks(body: Callable[[int, int], dict], out_dir: str, world: int = 2) -> None:
    """Run ``body`` on ``world`` ranks (a single process, no process group, when ``world == 1``)."""
    if world == 1:
        _rank(0, 1, 0, out_dir, body)
        return
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(world, port, out_dir, body), nprocs=world, join=True)


def bits_equal(a: Any, b: Any) -> bool:
    """Bitwise equality of two tensors (DTensors: their local shards), shapes included."""
    import torch

    if hasattr(a, "to_local"):
        a, b = a.to_local(), b.to_local()
    a, b = a.detach(), b.detach()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.reshape(-1), b.reshape(-1)
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
