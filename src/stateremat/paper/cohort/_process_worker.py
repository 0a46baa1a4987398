"""Child side of an independent-process cohort and the launcher of one process.

``worker_main`` is the body of one cohort process (``stateremat cohort process-worker``);
``run_one_process`` starts it as a fresh interpreter and collects its rows, in a thread of
the parent or inside a Dask task on a worker. Paper §11.
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ...contract import atomic_write_bytes, loadavg

EXPERIMENTS = ("fair44", "pressure32", "workloads3")
STDERR_TAIL_CHARS = 4000


def method_order(methods: Sequence[str], seed: int, process: int) -> list[str]:
    """Methods in the order process ``process`` runs them: a permutation seeded by
    ``(seed, process)``, so it is recorded by the pair and reproducible."""
    rng = np.random.default_rng([int(seed), int(process)])
    return [methods[i] for i in rng.permutation(len(methods))]


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


# --------------------------------------------------------------------------- launcher
def run_one_process(args: Sequence[str], worker_cmd: Sequence[str] | None = None,
                    timeout_s: float | None = None,
                    cards: Mapping[str, str] | None = None,
                    threads: int | None = None) -> dict[str, Any]:
    """Launch one fresh interpreter for one cohort process and collect its rows.

    Runs wherever it is called: in a thread of the parent (local executor) or inside a Dask
    task on a worker, where ``sys.executable`` is the worker's interpreter. Needs no shared
    file system: the rows come back as Parquet bytes.

    Args:
        args: worker arguments without ``--rows-out``.
        worker_cmd: command prefix; default ``[sys.executable, "-m", "stateremat", "cohort",
            "process-worker"]``.
        timeout_s: kill the child after this many seconds (None: no limit).
        cards: frozen profile cards ``{cell: card JSON text}``; written next to the child and
            passed as ``--profile`` (no shared file system needed).
        threads: CPU threads of the child (``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` and
            ``torch.set_num_threads``); None leaves the environment as it is.

    Returns:
        ``{"exit_code", "status" ("ok" | "failed" | "timeout"), "stderr_tail", "wall_s",
        "hostname", "rows_parquet" (bytes or None)}``.
    """
    cmd = list(worker_cmd or [sys.executable, "-m", "stateremat", "cohort", "process-worker"])
    with tempfile.TemporaryDirectory(prefix="stateremat-cohort-") as tmp:
        rows_out = Path(tmp) / "rows.parquet"
        extra = ["--rows-out", str(rows_out)]
        if cards:
            for cell, text in cards.items():
                atomic_write_bytes(Path(tmp) / "profile" / f"{cell}.json", text.encode())
            extra += ["--profile", str(Path(tmp) / "profile")]
        env = dict(os.environ)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            extra += ["--threads", str(threads)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd + list(args) + extra, env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
            code, err, status = proc.returncode, proc.stderr + proc.stdout, None
            if code < 0:  # no traceback from a signal: say which one
                err += f"\nkilled by signal {-code}"
        except subprocess.TimeoutExpired as exc:
            code, status = -9, "timeout"
            err = _text(exc.stderr) + _text(exc.stdout) + f"\nkilled after {timeout_s} s"
        data = rows_out.read_bytes() if code == 0 and rows_out.exists() else None
        if status is None:
            status = "ok" if data is not None else "failed"
        return {"exit_code": int(code), "status": status, "stderr_tail": err[-STDERR_TAIL_CHARS:],
                "wall_s": time.perf_counter() - t0, "hostname": platform.node(),
                "rows_parquet": data}


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def _local_results(tasks: list[tuple[int, list[str]]], jobs: int, worker_cmd, timeout_s, cards,
                   threads) -> Iterator[tuple[int, dict]]:
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        pending = {pool.submit(run_one_process, a, worker_cmd, timeout_s, cards, threads): p
                   for p, a in tasks}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                yield pending.pop(f), f.result()


def _dask_results(tasks: list[tuple[int, list[str]]], address: Any, worker_cmd, timeout_s,
                  cards, threads) -> Iterator[tuple[int, dict]]:
    from distributed import Client, as_completed

    own = not hasattr(address, "submit")
    client = Client(address, set_as_default=False) if own else address
    try:
        futures = {client.submit(run_one_process, a, worker_cmd, timeout_s, cards, threads,
                                 pure=False,
                                 key=f"stateremat-process-{p}-{os.getpid()}-{time.time_ns()}"): p
                   for p, a in tasks}
        for fut in as_completed(list(futures), loop=client.loop):
            p = futures[fut]
            try:
                yield p, fut.result()
            except Exception as exc:  # the task itself died (worker lost): a failed attempt
                yield p, {"exit_code": -1, "status": "failed", "stderr_tail":
                          f"dask task error: {type(exc).__name__}: {exc}"[-STDERR_TAIL_CHARS:],
                          "wall_s": float("nan"), "hostname": "unknown", "rows_parquet": None}
    finally:
        if own:
            client.close()
