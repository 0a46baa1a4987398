"""``stateremat bench calibrate|pressure|fair``: run an experiment into ``--out``, resumably.

One way through: the spec is built once; each cell's profile card is measured (or loaded) once
and its budget resolved once on it; each planner runs once per cell (:func:`run_cell_methods`);
rows go to the ``bench`` records table (one Parquet part per finished cell), and an interrupted
run resumes by skipping cells whose rows exist. The rows are then summarised once
(:mod:`._summary`) into ``summary.json`` and that summary is rendered once into ``tables.md``.
"""
from __future__ import annotations

from pathlib import Path

from ..._shared.io import atomic_write_json
from .. import Progress, as_progress
from ..records import RecordStore, check_resumable, lock_run, read_records
from ._spec import ExperimentSpec, budget_rule, experiment_spec, resolve_spec, with_budget
from ._summary import TABLE, summarize
from ._tables import write_tables as write_bench_tables


def run_experiment(name: str, out: str | Path, *, preset: str = "cpu", device: str = "cpu",
                   warmups: int | None = None, steps: int | None = None,
                   budget_bytes: int | None = None, progress: Progress | None = None) -> dict:
    """Run experiment ``name`` into ``out`` and write ``summary.json`` and ``tables.md``.

    Args:
        name: ``calibrate``, ``pressure``, ``fair`` (or any of ``experiment_spec``'s names).
        out: run folder; rerunning with the same folder and options resumes.
        preset: ``cpu``, ``cpu-faithful``, ``h100`` or ``tiny``.
        device: ``cpu`` or ``cuda``.
        warmups: override the spec's warmup steps per method.
        steps: override the spec's measured steps per method.
        budget_bytes: override the paper's (scaled) logical budget of every cell, bytes (else a
            cell with a budget / eager-peak rule is resolved on its profile card, measured first).
        progress: where to report steps done (``stateremat._shared.progress.progress_bar``); None: nowhere.

    Returns:
        The summary (as written to ``summary.json``; ``tables.md`` is its rendering).

    Raises:
        RecordsError: ``out`` holds a run with other options.
        ValueError: unknown experiment or preset.
    """
    import torch

    from ._runner import cell_card, run_cell_methods

    spec: ExperimentSpec = experiment_spec(name, preset)
    if budget_bytes is not None:
        spec = with_budget(spec, budget_bytes)
    out = lock_run(out)  # before any card is written: a refused launch changes nothing
    w = spec.warmups if warmups is None else int(warmups)
    k = spec.steps if steps is None else int(steps)
    known = {"experiment": name, "preset": preset, "device": device, "warmups": w, "steps": k,
             "cells": [c.name for c in spec.cells], "methods": list(spec.methods)}
    check_resumable(out, TABLE, known)  # a cached card of another run is never replaced
    cards = {}
    ruled = [c for c in spec.cells if c.budget_eager_fraction is not None]
    if ruled:  # the budget depends on the card: measure (or load) it before the store's meta
        cards = {c.name: cell_card(spec, c, device, cache_dir=out / "cards") for c in ruled}
        spec = resolve_spec(spec, cards)
    store = RecordStore(out, TABLE, key=["cell", "method", "step"], meta={
        **known, "budget_bytes": spec.budget_bytes, "h100_budget_gib": spec.h100_budget_gib,
        "budget_rule": {c.name: budget_rule(c) for c in spec.cells}})
    done = {key[0] for key in store.done_keys()}
    todo = [c for c in spec.cells if c.name not in done]
    task = as_progress(progress, "run_experiment").task(
        f"bench {name}", total=sum(len(c.methods) * (w + k + 1) for c in todo))
    for i, cell in enumerate(todo):
        task.update(description=f"bench {name} [{i + 1}/{len(todo)}] {cell.name}")
        card = cards.get(cell.name) or cell_card(spec, cell, device, cache_dir=out / "cards")
        rows = run_cell_methods(spec, cell, list(cell.methods), warmups=w, steps=k,
                                device=device, card=card, on_step=task.advance)
        for r in rows:
            r["torch_threads"] = torch.get_num_threads()
        store.append(rows)
    summary = bench_summary(out)
    atomic_write_json(out / "summary.json", summary)
    write_bench_tables(out, summary)
    return summary


def _card_threads(cards: Path) -> list[int]:
    """The distinct ``torch_threads`` of the profile cards cached in ``cards`` (meta), each card
    validated (:func:`~stateremat.contract.load_card`).

    Raises:
        RecordsError: a card cannot be read or is not a profile card (naming the file).
    """
    from ...contract import ProfileCardError, load_card
    from ..records import RecordsError

    found = set()
    for p in sorted(cards.glob("*.json")) if cards.is_dir() else []:
        try:
            t = load_card(p).meta.get("torch_threads")
        except ProfileCardError as exc:
            raise RecordsError(
                f"stateremat report: the bench run's profile card {p} is unreadable ({exc}); its "
                "rows do not record their torch threads, so the card must. Tip: restore the card "
                "from a copy of the run folder (a card measured again would not say which threads "
                "these rows ran with).") from None
        if isinstance(t, int):
            found.add(t)
    return sorted(found)


def bench_summary(out: str | Path) -> dict:
    """The summary of bench run folder ``out``, recomputed from its rows and its sidecar's config
    (warmups, steps) — what ``summary.json`` holds, after a run and after ``stateremat report``.

    Raises:
        RecordsError: no rows, or an unreadable sidecar.
    """
    from ..records import RecordsError
    from ..records import read_sidecar

    rows = read_records(out, TABLE)
    if rows.empty:
        raise RecordsError(f"stateremat report: {out} has no '{TABLE}' rows. Tip: run "
                           "`stateremat bench ... --out DIR` first (a cell's rows appear when it "
                           "finishes).")
    config = read_sidecar(Path(out) / f"{TABLE}.json").get("config") or {}
    summary = summarize(rows)
    threads = sorted({int(t) for t in rows["torch_threads"].dropna()}) \
        if "torch_threads" in rows else []
    if not threads:  # rows of older runs lack the column: the run's profile cards record it
        threads = _card_threads(Path(out) / "cards")
    summary.update({"warmups": config.get("warmups"), "steps": config.get("steps"),
                    "torch_threads": threads[0] if len(threads) == 1 else (threads or None)})
    return summary
