"""Child side of an independent-process cohort: the body of one process.

``worker_main`` is the body of one cohort process (``stateremat cohort process-worker``);
``._launch`` starts it as a fresh interpreter and collects its rows. Paper §11.
"""
from __future__ import annotations

import argparse
import ctypes
import io
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..._shared.io import atomic_write_bytes, loadavg

EXPERIMENTS = ("fair44", "pressure32", "workloads3")
#: Environment variable carrying the launching process's pid to a child (set by ``._launch``).
PARENT_ENV = "STATEREMAT_COHORT_PARENT_PID"


def method_order(methods: Sequence[str], seed: int, process: int) -> list[str]:
    """Methods in the order process ``process`` runs them: a permutation seeded by
    ``(seed, process)``, so it is recorded by the pair and reproducible."""
    rng = np.random.default_rng([int(seed), int(process)])
    return [methods[i] for i in rng.permutation(len(methods))]


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its launching parent dies (Linux).

    The parent's pid comes in ``$STATEREMAT_COHORT_PARENT_PID``; if the parent is already gone
    (``getppid()`` differs), exit at once. Done in the child rather than a ``preexec_fn``,
    which would run fork handlers of threaded libraries in the parent (JAX warns on them).
    """
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(1)


# --------------------------------------------------------------------------- child side
def worker_main(argv: Sequence[str] | None = None, *,
                cell_runner: Callable[..., list[dict]] | None = None,
                spec_fn: Callable[[str, str], Any] | None = None) -> int:
    """Body of one cohort process (``stateremat cohort process-worker ...``).

    Runs every method of every cell (W warmups, K steps; method order from
    :func:`method_order`) and writes all rows to ``--rows-out`` atomically, once, at the end,
    so a killed process leaves no partial rows.

    Args:
        argv: command-line arguments (see ``_worker_parser``).
        cell_runner: replaces :func:`stateremat.paper.bench.run_cell_methods` (tests).
        spec_fn: replaces :func:`stateremat.paper.bench.experiment_spec` (tests).

    Returns:
        0 on success (the process exits with it).
    """
    die_with_parent()
    a = _worker_parser().parse_args(argv)
    t0 = time.perf_counter()
    if cell_runner is None or spec_fn is None:
        from ..bench import experiment_spec, run_cell_methods  # lazy: torch is heavy
        cell_runner = cell_runner or run_cell_methods
        spec_fn = spec_fn or experiment_spec
    spec = spec_fn(a.experiment, a.preset)
    if a.budget is not None:
        from ..bench import with_budget

        spec = with_budget(spec, a.budget)
    threads = None
    if a.threads and "torch" in sys.modules:  # env set by the launcher; make sure of it
        sys.modules["torch"].set_num_threads(a.threads)
        threads = sys.modules["torch"].get_num_threads()
    rows: list[dict] = []
    for cell in spec.cells:
        order = method_order(list(cell.methods), a.seed, a.process)
        warm = cell.warmups if a.warmups is None else a.warmups
        steps = cell.steps if a.steps is None else a.steps
        kw = {}
        if a.profile:  # the cohort's frozen card: no process profiles on its own (§11)
            from ...contract import load_card

            kw["card"] = load_card(Path(a.profile) / f"{cell.name}.json")
        got = cell_runner(spec, cell, order, warmups=warm, steps=steps, device=a.device,
                          order=order, **kw)
        for r in got:
            r = dict(r)
            r.update({"process": a.process, "seed": a.seed, "order_index": order.index(r["method"]),
                      "warmups": int(warm), "steps": int(steps)})
            rows.append(r)
    host, pid, load = platform.node(), os.getpid(), loadavg()
    wall = time.perf_counter() - t0
    for r in rows:
        r.update({"hostname": host, "pid": pid, "loadavg": load, "process_wall_s": wall,
                  "torch_threads": threads})
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    atomic_write_bytes(a.rows_out, buf.getvalue())
    return 0


def _worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stateremat cohort process-worker",
                                description="One process of an independent-process cohort.")
    p.add_argument("--experiment", required=True, choices=EXPERIMENTS)
    p.add_argument("--preset", default="cpu")
    p.add_argument("--process", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmups", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--budget", type=int, default=None, help="logical budget override, bytes")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--profile", default=None, help="folder of frozen <cell>.json cards")
    p.add_argument("--rows-out", required=True)
    return p
