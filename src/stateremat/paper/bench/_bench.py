"""``stateremat bench calibrate|pressure|fair``: run an experiment into ``--out``, resumably.

Rows go to the ``bench`` records table (one Parquet part per finished cell); an interrupted run
resumes by skipping cells whose rows exist. ``summary.json`` and ``tables.md`` are then
recomputed from all rows by separate code (:mod:`._summary`, :mod:`stateremat.paper.report`).
"""
from __future__ import annotations

from pathlib import Path

from ...contract import atomic_write_json
from ..records import RecordStore, read_records
from ._spec import ExperimentSpec, budget_rule, experiment_spec, resolve_spec, with_budget
from ._summary import TABLE, summarize


def run_experiment(name: str, out: str | Path, *, preset: str = "cpu", device: str = "cpu",
                   warmups: int | None = None, steps: int | None = None,
                   budget_bytes: int | None = None, progress: bool = True) -> dict:
    """Run experiment ``name`` into ``out`` and write ``summary.json`` and ``tables.md``.

    Args:
        name: ``calibrate``, ``pressure``, ``fair`` (or any of ``experiment_spec``'s names).
        out: run folder; rerunning with the same folder and options resumes.
        preset: ``cpu`` or ``h100``.
        device: ``cpu`` or ``cuda``.
        warmups: override the spec's warmup steps per method.
        steps: override the spec's measured steps per method.
        budget_bytes: override the paper's (scaled) logical budget of every cell (else a cell
            with a budget / eager-peak rule is resolved on its profile card, measured first).
        progress: show a rich progress bar.

    Returns:
        The summary (as written to ``summary.json``).

    Raises:
        RecordsError: ``out`` holds a run with other options.
        ValueError: unknown experiment or preset.
    """
    import torch

    from ..report import report_bench
    from ._runner import cell_card, run_cell_methods

    spec: ExperimentSpec = experiment_spec(name, preset)
    if budget_bytes is not None:
        spec = with_budget(spec, budget_bytes)
    out = Path(out)
    ruled = [c for c in spec.cells if c.budget_eager_fraction is not None]
    if ruled:  # the budget depends on the card: measure (or reuse) it before the store's meta
        spec = resolve_spec(spec, {c.name: cell_card(spec, c, device, cache_dir=out / "cards")
                                   for c in ruled})
    w = spec.warmups if warmups is None else int(warmups)
    k = spec.steps if steps is None else int(steps)
    store = RecordStore(out, TABLE, key=["cell", "method", "step"], meta={
        "experiment": name, "preset": preset, "device": device, "warmups": w, "steps": k,
        "budget_bytes": spec.budget_bytes, "h100_budget_gib": spec.h100_budget_gib,
        "budget_rule": {c.name: budget_rule(c) for c in spec.cells},
        "cells": [c.name for c in spec.cells], "methods": list(spec.methods)})
    done = {key[0] for key in store.done_keys()}
    todo = [c for c in spec.cells if c.name not in done]
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn())
        bar.start()
        task = bar.add_task(f"bench {name}", total=sum(len(c.methods) * (w + k + 1) for c in todo))
    try:
        for i, cell in enumerate(todo):
            if bar:
                bar.update(task, description=f"bench {name} [{i + 1}/{len(todo)}] {cell.name}")
            rows = run_cell_methods(
                spec, cell, list(cell.methods), warmups=w, steps=k, device=device,
                card_dir=out / "cards",
                on_step=(lambda: bar.advance(task, 1)) if bar else None)
            store.append(rows)
    finally:
        if bar:
            bar.stop()
    summary = summarize(read_records(out, TABLE))
    summary.update({"warmups": w, "steps": k, "torch_threads": torch.get_num_threads()})
    atomic_write_json(out / "summary.json", summary)
    report_bench(out)
    return summary


def run_fair(out: str | Path, preset: str = "cpu", device: str = "cpu") -> dict:
    """Run ``bench fair`` (all seven methods, 44 GiB budget or its cpu-scale ratio) and print its table.

    This is the README's main-job command.

    Returns:
        The summary written to ``out/summary.json``.
    """
    from ..report import render_bench as render

    summary = run_experiment("fair", out, preset=preset, device=device)
    print(render(summary))
    return summary
