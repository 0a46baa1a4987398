"""Declarative specs of the cost-runtime experiments (paper §8, §9, §10, §11).

Each experiment is a frozen :class:`ExperimentSpec`: cells (workload shapes), the methods run in
every cell, the logical budget, warmups and measured steps. Shapes and budgets are the paper's
H100 values, scaled by the preset (``stateremat.workloads.scale``; ``cpu`` = bytes / 1024).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..workloads import WORKLOADS, WorkloadConfig, preset_budget, preset_config

#: The seven methods, in the paper's table order (Table 6).
METHODS = ("eager", "whole", "regions", "functional", "state_agnostic", "eager_whole", "joint")
#: The six methods of the calibration grid and Table 4 (no eager_whole, §8, §9).
SIX_METHODS = ("eager", "whole", "regions", "functional", "state_agnostic", "joint")
EXPERIMENTS = ("calibrate", "pressure", "fair", "fair44", "pressure32", "workloads3")


@dataclass(frozen=True)
class Cell:
    """One workload shape of an experiment and how it is run.

    Args:
        name: unique cell name (records key), e.g. ``"large_sparse"``.
        config: the workload shape (float32 for timing; checks also run float64).
        methods: method names run in this cell (subset of :data:`METHODS`).
        budget_bytes: logical budget ``M`` the planners plan under, bytes.
        warmups: unmeasured steps per method before timing.
        steps: measured steps per method (raw rows).
        labels: the paper's description of the cell (H100 units), for tables.
    """

    name: str
    config: WorkloadConfig
    methods: tuple[str, ...]
    budget_bytes: int
    warmups: int
    steps: int
    labels: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ExperimentSpec:
    """An experiment: cells run with a common budget and step counts.

    Attributes:
        name: one of :data:`EXPERIMENTS`.
        preset: ``"cpu"`` or ``"h100"``.
        cells: the cells, in run order.
        methods: union of the cells' methods in :data:`METHODS` order.
        budget_bytes: the logical budget (every cell uses it).
        warmups: unmeasured steps per method.
        steps: measured steps per method.
        h100_budget_gib: the paper's budget this one scales.
    """

    name: str
    preset: str
    cells: tuple[Cell, ...]
    methods: tuple[str, ...]
    budget_bytes: int
    warmups: int
    steps: int
    h100_budget_gib: float

    def cell(self, name: str) -> Cell:
        """The cell called ``name``.

        Raises:
            KeyError: naming the cells that exist.
        """
        for c in self.cells:
            if c.name == name:
                return c
        raise KeyError(f"ExperimentSpec {self.name!r}: no cell {name!r}; cells are "
                       f"{[c.name for c in self.cells]}. Tip: see `stateremat bench --help`.")


def with_budget(spec: ExperimentSpec, budget_bytes: int) -> ExperimentSpec:
    """``spec`` with every cell planned under ``budget_bytes`` instead of the paper's budget.

    Raises:
        ValueError: a non-positive budget.
    """
    if budget_bytes <= 0:
        raise ValueError(f"with_budget: budget must be positive, got {budget_bytes} bytes. "
                         "Tip: sizes accept KiB/MiB/GiB, e.g. 46MiB.")
    cells = tuple(dataclasses.replace(c, budget_bytes=int(budget_bytes)) for c in spec.cells)
    return dataclasses.replace(spec, cells=cells, budget_bytes=int(budget_bytes))


def _short(workload: str) -> str:
    return {"feature_queue": "queue", "prototype_memory": "prototype",
            "unrolled_recurrence": "recurrence"}[workload]


def _spec(name, preset, cells, gib, warmups, steps) -> ExperimentSpec:
    budget = preset_budget(gib, preset)
    built = tuple(Cell(c["name"], c["config"], tuple(c["methods"]), budget, warmups, steps,
                       c["labels"]) for c in cells)
    used = {m for c in built for m in c.methods}
    return ExperimentSpec(name, preset, built, tuple(m for m in METHODS if m in used), budget,
                          warmups, steps, gib)


def _cell(name, preset, methods, *, workload="feature_queue", state_mib=1024, write_fraction=0.001,
          live=16, activations="large"):
    cfg = preset_config(preset, workload=workload, state_mib=state_mib,
                        write_fraction=write_fraction, live_versions=live, activations=activations)
    labels = {"workload": workload, "state_mib": state_mib, "write_pct": write_fraction * 100,
              "live_versions": live, "activations": activations,
              "writes": "sparse" if write_fraction < 1 else "dense"}
    return {"name": name, "config": cfg, "methods": methods, "labels": labels}


def experiment_spec(name: str, preset: str = "cpu") -> ExperimentSpec:
    """The spec of experiment ``name`` at ``preset`` scale.

    Experiments (H100 values; the ``cpu`` preset divides bytes by 1024):

    - ``calibrate``: 24 shapes = 3 workloads × state {64, 1024} MiB × write fraction
      {0.001, 1} × live versions {1, 64}; small activations; six methods; 20 GiB; 3 + 10 steps (§8).
    - ``pressure``: feature queue, 1 GiB, 16 live, {small, large} activations × {sparse, dense}
      writes; six methods; 32 GiB; 3 + 10 steps (§9, Tables 4, 5).
    - ``fair`` / ``fair44``: the large/sparse cell, all seven methods, 44 GiB, 3 + 20 steps
      (§10, Table 6).
    - ``pressure32``: the large/sparse cell, six methods (no eager_whole), 32 GiB, 3 + 20 (§11).
    - ``workloads3``: 3 workloads, 1 GiB, write fraction 0.001, 64 live, small activations,
      six methods, 20 GiB; 50 + 1000 steps on h100, 5 + 50 on cpu (§11, three-workload cohort).

    Args:
        name: one of :data:`EXPERIMENTS`.
        preset: ``"cpu"`` or ``"h100"``.

    Returns:
        The frozen :class:`ExperimentSpec`.

    Raises:
        ValueError: unknown experiment or preset.

    References:
        Paper §8–§11, Tables 4, 5, 6, 10.
    """
    if name == "calibrate":
        cells = [_cell(f"{_short(w)}_{mib}mib_w{'0.1' if wf < 1 else '100'}_live{live}", preset,
                       SIX_METHODS, workload=w, state_mib=mib, write_fraction=wf, live=live,
                       activations="small")
                 for w in WORKLOADS for mib in (64, 1024) for wf in (0.001, 1.0) for live in (1, 64)]
        return _spec(name, preset, cells, 20, 3, 10)
    if name == "pressure":
        cells = [_cell(f"{act}_{'sparse' if wf < 1 else 'dense'}", preset, SIX_METHODS,
                       write_fraction=wf, activations=act)
                 for act in ("small", "large") for wf in (0.001, 1.0)]
        return _spec(name, preset, cells, 32, 3, 10)
    if name in ("fair", "fair44"):
        return _spec(name, preset, [_cell("large_sparse", preset, METHODS)], 44, 3, 20)
    if name == "pressure32":
        return _spec(name, preset, [_cell("large_sparse", preset, SIX_METHODS)], 32, 3, 20)
    if name == "workloads3":
        cells = [_cell(_short(w), preset, SIX_METHODS, workload=w, live=64, activations="small")
                 for w in WORKLOADS]
        warm, steps = (50, 1000) if preset == "h100" else (5, 50)
        return _spec(name, preset, cells, 20, warm, steps)
    raise ValueError(f"experiment_spec: unknown experiment {name!r}; expected one of "
                     f"{list(EXPERIMENTS)}. Tip: bench commands are calibrate, pressure, fair.")
