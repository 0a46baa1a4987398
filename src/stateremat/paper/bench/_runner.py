"""Run the methods of one cell: profile, plan, semantic checks, then interleaved timed steps.

Per method: plan on the cell's profile card; run the semantic checks (float32 and float64)
*before* timing; W warmup steps; then K measured steps as raw rows. On CPU the methods are
interleaved (round k runs every method once, in ``order``) and each method's peak comes from one
extra untimed step under the live-storage tracker; on CUDA each measured step is also a memory
measurement (``max_memory_allocated``) and methods run one after another to free the device.
"""
from __future__ import annotations

import gc
import math
import os
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from ...contract import ProfileCard, load_card, save_card
from ..._shared.io import loadavg
from ...torch import PeakMemory, memory_method
from ..profile import profile_workload, sync, workload_source_hash
from ._methods import build_method, method_plan, policy_json
from ._semantic import check_method
from ._spec import Cell, ExperimentSpec, budget_rule, resolve_budget

#: Environment variable naming a frozen profile card (file) or a folder of ``<cell>.json`` cards.
FROZEN_PROFILE_ENV = "STATEREMAT_FROZEN_PROFILE"


def cell_card(spec: ExperimentSpec, cell: Cell, device: str | torch.device = "cpu", *,
              cache_dir: str | os.PathLike | None = None, repeats: int = 3,
              on_segment: Callable[[int, int], None] | None = None) -> ProfileCard:
    """The profile card of ``cell``: frozen, cached, or measured now (and cached).

    Looks in order at ``$STATEREMAT_FROZEN_PROFILE`` (a card file whose workload equals the
    cell's, or a folder holding ``<cell>.json``), then ``cache_dir/<cell>.json``; otherwise it
    profiles the cell on ``device`` and writes the card to ``cache_dir``.

    Raises:
        ProfileCardError: a frozen or cached card is invalid.
    """
    candidates = []
    frozen = os.environ.get(FROZEN_PROFILE_ENV)
    if frozen:
        fp = Path(frozen)
        candidates.append(fp / f"{cell.name}.json" if fp.is_dir() else fp)
    if cache_dir is not None:
        candidates.append(Path(cache_dir) / f"{cell.name}.json")
    for path in candidates:
        if path.is_file():
            card = load_card(path)
            if card.meta.get("workload") == cell.config.to_dict():
                return card
    card = profile_workload(cell.config, device, repeats=repeats, on_segment=on_segment)
    if cache_dir is not None:
        save_card(card, Path(cache_dir) / f"{cell.name}.json")
    return card


def _plan_fields(method: str, card: ProfileCard, budget: int, plans: dict):
    res = method_plan(method, card, budget, plans)
    if res is None:  # functional: no checkpoint policy, no static prediction
        return None, {"feasible": True, "policy": None, "predicted_peak_bytes": None,
                      "predicted_time_s": None}
    return res, {"feasible": bool(res.feasible and res.options is not None),
                 "policy": policy_json(res),
                 "predicted_peak_bytes": res.predicted_peak_bytes,
                 "predicted_time_s": res.predicted_time_s}


def run_cell_methods(spec: ExperimentSpec, cell: Cell, methods: Sequence[str], *, warmups: int,
                     steps: int, device: str = "cpu", order: Sequence[str] | None = None,
                     card: ProfileCard | None = None,
                     card_dir: str | os.PathLike | None = None,
                     on_step: Callable[[], None] | None = None) -> list[dict]:
    """Execute ``methods`` on ``cell`` and return raw timing rows (one per method and step).

    The card is taken as given (or measured once), the cell's budget resolved once on it, and
    each planner runs once (the min-peak columns reuse the methods' own plans).

    Args:
        spec: the experiment (name and preset are written into rows).
        cell: the cell; its budget, resolved on the card (:func:`resolve_budget`; a no-op when
            already resolved on this card), is the planners' ``M``.
        methods: method names (subset of ``spec.methods``).
        warmups: unmeasured steps per method.
        steps: measured steps per method.
        device: ``"cpu"`` or ``"cuda[:i]"``.
        order: run order of the methods within each round (default: ``methods``).
        card: a profile card to plan on (else :func:`cell_card`).
        card_dir: cache folder for cards.
        on_step: called after every warmup, memory and measured step (a caller's progress).

    Returns:
        Rows with keys ``experiment, preset, cell, method, step, step_time_s, peak_bytes,
        fits_budget, feasible, policy, semantic_checks, semantic_max_error, semantic_detail,
        predicted_peak_bytes, predicted_time_s, budget_bytes, min_eager_whole_peak_bytes,
        min_joint_peak_bytes, budget_rule, profile_hash, source_hash, memory_method, device, dtype,
        error, loadavg`` plus the workload parameters. An infeasible plan gives one row with
        ``step = -1`` and no time or peak; a method that raises gives rows with ``error`` set.

    References:
        Paper §8 (3 warmups, 10 steps), §10 (20 steps, 140 rows), DESIGN.md "Measurement rules".
    """
    dev = torch.device(device)
    order = list(order) if order is not None else list(methods)
    if sorted(order) != sorted(methods):
        raise ValueError(f"run_cell_methods: order {order} is not a permutation of {list(methods)}.")
    if card is None:
        card = cell_card(spec, cell, dev, cache_dir=card_dir)
    cell = resolve_budget(cell, card)
    plans: dict = {}  # planner name -> PlanResult: each planner runs once for this cell
    base = {"experiment": spec.name, "preset": spec.preset, "cell": cell.name,
            "budget_bytes": int(cell.budget_bytes), "budget_rule": budget_rule(cell),
            "profile_hash": card.source_hash(),
            "source_hash": workload_source_hash(cell.config), "memory_method": memory_method(dev),
            "device": str(dev), "dtype": cell.config.dtype,
            "min_eager_whole_peak_bytes": method_plan("eager_whole", card, cell.budget_bytes,
                                                      plans).min_feasible_peak_bytes,
            "min_joint_peak_bytes": method_plan("joint", card, cell.budget_bytes,
                                                plans).min_feasible_peak_bytes,
            **{k: v for k, v in cell.config.to_dict().items() if k not in ("dtype",)}}
    rows: list[dict] = []
    runs: dict[str, object] = {}
    info: dict[str, dict] = {}
    step_done = on_step or (lambda: None)
    for m in order:
        res, fields = _plan_fields(m, card, cell.budget_bytes, plans)
        info[m] = {**base, "method": m, **fields, "semantic_checks": "not_run",
                   "semantic_max_error": None, "semantic_detail": "", "error": ""}
        if not fields["feasible"]:
            rows.append({**info[m], "step": -1, "step_time_s": math.nan, "peak_bytes": None,
                         "fits_budget": False, "loadavg": loadavg()})
            for _ in range(warmups + steps + 1):
                step_done()
            continue
        options = None if res is None else list(res.options)
        info[m].update(check_method(m, cell.config, options, dev))
        runs[m] = options
    interleave = dev.type != "cuda"
    active = [m for m in order if m in runs]
    built = {}
    if interleave:
        for m in active:
            built[m] = _prepare(m, cell, runs[m], dev, warmups, info, step_done)
        for k in range(steps):
            for m in active:
                rows.append(_timed_row(built.get(m), m, k, warmups, dev, info, step_done))
    else:
        for m in active:
            built[m] = _prepare(m, cell, runs[m], dev, warmups, info, step_done)
            for k in range(steps):
                rows.append(_timed_row(built.get(m), m, k, warmups, dev, info, step_done))
            built.pop(m, None)
            gc.collect()
            torch.cuda.empty_cache()
    for r in rows:
        pk = r.get("peak_bytes")
        r["fits_budget"] = bool(pk is not None and not _isnan(pk) and pk <= cell.budget_bytes)
    return rows


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _prepare(m, cell, options, dev, warmups, info, step_done):
    """Build the method, run its warmups and (CPU) its tracked memory step; None if it raised."""
    try:
        run = build_method(m, cell.config, options, dev)
        for t in range(warmups):
            run.train_step(t)
            step_done()
        if dev.type != "cuda":
            with PeakMemory(dev, roots=run.roots) as pm:
                run.train_step(warmups)
            info[m]["_cpu_peak"] = pm.peak_bytes
        step_done()
        return run
    except Exception as exc:  # recorded, never hidden: rows carry the error
        info[m]["error"] = f"{type(exc).__name__}: {exc}"
        return None


def _timed_row(run, m, k, warmups, dev, info, step_done) -> dict:
    row = {k2: v for k2, v in info[m].items() if not k2.startswith("_")}
    row.update({"step": k, "loadavg": loadavg()})
    if run is None:
        row.update({"step_time_s": math.nan, "peak_bytes": None})
    else:
        try:
            t_index = warmups + 1 + k
            if dev.type == "cuda":
                with PeakMemory(dev, roots=run.roots) as pm:
                    t0 = time.perf_counter()
                    run.train_step(t_index)
                    sync(dev)
                    dt = time.perf_counter() - t0
                peak = pm.peak_bytes
            else:
                t0 = time.perf_counter()
                run.train_step(t_index)
                dt = time.perf_counter() - t0
                peak = info[m].get("_cpu_peak")
            row.update({"step_time_s": dt, "peak_bytes": peak})
        except Exception as exc:
            row.update({"step_time_s": math.nan, "peak_bytes": None,
                        "error": f"{type(exc).__name__}: {exc}"})
    step_done()
    return row

