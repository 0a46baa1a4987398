"""Declarative specs of the cost-runtime experiments (paper §8, §9, §10, §11).

Each experiment is a frozen :class:`ExperimentSpec`: cells (workload shapes), the methods run in
every cell, the logical budget, warmups and measured steps. Shapes and budgets are the paper's
H100 values, scaled by the preset (``stateremat.paper.workloads.scale``; ``cpu`` = bytes / 1024,
``cpu-faithful`` = ``cpu`` with state bytes / 64),
except the fair-control budget at ``cpu`` scale, which keeps the paper's budget / eager-peak
ratio on the cell's own measured card (:data:`FAIR_EAGER_FRACTION`, :func:`resolve_budget`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# METHODS: the seven, in the paper's table order (Table 6); named with the bench table's rules
from ..records.tables import BENCH_METHODS as METHODS
from ..workloads import WORKLOADS, WorkloadConfig, preset_budget, preset_config

#: The six methods of the calibration grid and Table 4 (no eager_whole, §8, §9).
SIX_METHODS = ("eager", "whole", "regions", "functional", "state_agnostic", "joint")
EXPERIMENTS = ("calibrate", "pressure", "fair", "fair44", "pressure32", "workloads3")
#: The fair control's budget / eager peak on H100: 44 GiB frozen against the large/sparse cell's
#: measured eager peak of 46.063 GiB (paper §10, Table 6). The ``cpu`` preset keeps this ratio:
#: its fixed overheads (parameters, gradients, the queue's temporaries) shrink less than 1024×,
#: so a byte-scaled 44 MiB leaves the eager/whole planner no policy, unlike the paper's 44 GiB.
FAIR_EAGER_FRACTION = 44 / 46.063


@dataclass(frozen=True)
class Cell:
    """One workload shape of an experiment and how it is run.

    Args:
        name: unique cell name (records key), e.g. ``"large_sparse"``.
        config: the workload shape (float32 for timing; checks also run float64).
        methods: method names run in this cell (subset of :data:`METHODS`).
        budget_bytes: logical budget ``M`` the planners plan under, bytes (the nominal scaled
            budget until :func:`resolve_budget` applies ``budget_eager_fraction``).
        warmups: unmeasured steps per method before timing.
        steps: measured steps per method (raw rows).
        labels: the paper's description of the cell (H100 units), for tables.
        budget_eager_fraction: when set, ``M`` is this fraction of the cell's predicted
            all-eager peak on its profile card (:func:`resolve_budget`); ``None``: ``M`` is
            ``budget_bytes`` as given.
        budget_card_hash: ``source_hash`` of the card ``budget_bytes`` was resolved on (set by
            :func:`resolve_budget`, so resolving again on that card does nothing).
    """

    name: str
    config: WorkloadConfig
    methods: tuple[str, ...]
    budget_bytes: int
    warmups: int
    steps: int
    labels: dict = field(default_factory=dict, compare=False)
    budget_eager_fraction: float | None = None
    budget_card_hash: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ExperimentSpec:
    """An experiment: cells run with a common budget and step counts.

    Attributes:
        name: one of :data:`EXPERIMENTS`.
        preset: ``"cpu"``, ``"cpu-faithful"``, ``"h100"`` or ``"tiny"``.
        cells: the cells, in run order.
        methods: union of the cells' methods in :data:`METHODS` order.
        budget_bytes: the logical budget (every cell uses it; after :func:`resolve_budget`,
            that of the first cell).
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

    An explicit budget replaces any budget / eager-peak rule of the cells.

    Raises:
        ValueError: a non-positive budget.
    """
    if budget_bytes <= 0:
        raise ValueError(f"with_budget: budget must be positive, got {budget_bytes} bytes. "
                         "Tip: sizes accept KiB/MiB/GiB, e.g. 46MiB.")
    cells = tuple(dataclasses.replace(c, budget_bytes=int(budget_bytes), budget_eager_fraction=None)
                  for c in spec.cells)
    return dataclasses.replace(spec, cells=cells, budget_bytes=int(budget_bytes))


def resolve_budget(cell: Cell, card) -> Cell:
    """``cell`` with its budget resolved on ``card`` (a :class:`~stateremat.contract.ProfileCard`).

    A cell with ``budget_eager_fraction`` gets ``M = round(fraction × card's predicted all-eager
    peak)`` bytes (:func:`stateremat.planner.eager_fraction_budget`); any other cell is returned
    unchanged. Resolved once per card: a cell already resolved on ``card`` is returned as it is,
    so the cohort parent and every process resolve the same ``M`` from the same frozen card.
    """
    if cell.budget_eager_fraction is None:
        return cell
    digest = card.source_hash()
    if cell.budget_card_hash == digest:
        return cell
    from ...planner import eager_fraction_budget

    return dataclasses.replace(cell, budget_bytes=eager_fraction_budget(card, cell.budget_eager_fraction),
                               budget_card_hash=digest)


def resolve_spec(spec: ExperimentSpec, cards) -> ExperimentSpec:
    """``spec`` with every cell's budget resolved (:func:`resolve_budget`) on ``cards[cell.name]``.

    Raises:
        KeyError: a cell with a budget rule has no card in ``cards``.
    """
    if all(getattr(c, "budget_eager_fraction", None) is None for c in spec.cells):
        return spec
    cells = []
    for c in spec.cells:
        if c.budget_eager_fraction is not None and c.name not in cards:
            raise KeyError(f"resolve_spec: cell {c.name!r} sets its budget from its profile card, "
                           f"but no card was given (cards for {sorted(cards)}).")
        cells.append(resolve_budget(c, cards[c.name]) if c.budget_eager_fraction is not None else c)
    return dataclasses.replace(spec, cells=tuple(cells), budget_bytes=cells[0].budget_bytes)


def budget_rule(cell: Cell) -> str:
    """How ``cell``'s budget was set, in words (written into records and summaries)."""
    if getattr(cell, "budget_eager_fraction", None) is None:
        return "fixed"
    return f"{cell.budget_eager_fraction:.6g} x predicted all-eager peak"


def _short(workload: str) -> str:
    return {"feature_queue": "queue", "prototype_memory": "prototype",
            "unrolled_recurrence": "recurrence"}[workload]


def _spec(name, preset, cells, gib, warmups, steps, eager_fraction=None) -> ExperimentSpec:
    budget = preset_budget(gib, preset)
    built = tuple(Cell(c["name"], c["config"], tuple(c["methods"]), budget, warmups, steps,
                       c["labels"], eager_fraction) for c in cells)
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
      (§10, Table 6). At ``cpu`` scale the budget is :data:`FAIR_EAGER_FRACTION` (44/46.063) of
      the cell's predicted all-eager peak, resolved on its profile card (:func:`resolve_budget`):
      the paper froze 44 GiB as a budget where both planners admit a policy, and the byte-scaled
      44 MiB is 0.2 % short of the eager/whole minimum at this scale.
    - ``pressure32``: the large/sparse cell, six methods (no eager_whole), 32 GiB, 3 + 20 (§11).
    - ``workloads3``: 3 workloads, 1 GiB, write fraction 0.001, 64 live, small activations,
      six methods, 20 GiB; 50 + 1000 steps on h100, 5 + 50 on cpu (§11, three-workload cohort).

    Args:
        name: one of :data:`EXPERIMENTS`.
        preset: ``"cpu"``, ``"cpu-faithful"`` (``cpu`` with state bytes / 64), ``"h100"`` or
            ``"tiny"`` (tests: bytes / 2^16).

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
        return _spec(name, preset, [_cell("large_sparse", preset, METHODS)], 44, 3, 20,
                     FAIR_EAGER_FRACTION if preset != "h100" else None)
    if name == "pressure32":
        return _spec(name, preset, [_cell("large_sparse", preset, SIX_METHODS)], 32, 3, 20)
    if name == "workloads3":
        cells = [_cell(_short(w), preset, SIX_METHODS, workload=w, live=64, activations="small")
                 for w in WORKLOADS]
        warm, steps = (50, 1000) if preset == "h100" else (5, 50)
        return _spec(name, preset, cells, 20, warm, steps)
    raise ValueError(f"experiment_spec: unknown experiment {name!r}; expected one of "
                     f"{list(EXPERIMENTS)}. Tip: bench commands are calibrate, pressure, fair.")
