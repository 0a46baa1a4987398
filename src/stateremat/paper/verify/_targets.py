"""Contract targets of the verification summaries: what must hold for ``verify`` to exit 0.

Each function compares a summary recomputed from raw rows (:mod:`._summary`) with the targets
of its issue and returns the failed checks as readable lines (empty when all hold). NaN errors
(no rows) fail, never pass.

References: paper §6 (finite suites: 8.88e-16, 1.00e-15), §7 and Table 3 (engines 1.56e-15,
joint alias 4.44e-16).
"""
from __future__ import annotations

ERROR_TARGET = 1e-14  # max gradient / complex-step error allowed by the contract


def _equal(fails: list, name: str, got, want) -> None:
    if got != want:
        fails.append(f"{name} = {got}, expected {want}")


def _small(fails: list, name: str, got) -> None:
    if not (got is not None and got <= ERROR_TARGET):  # NaN/None fail
        fails.append(f"{name} = {got}, expected <= {ERROR_TARGET:g}")


def finite_failures(summary: dict, programs: int) -> list[str]:
    """Failed targets of ``stateremat verify finite --programs programs``.

    Targets: every count of both suites equals ``programs``; max gradient and complex-step
    errors <= 1e-14; every complex-step program matched.
    """
    fails: list[str] = []
    d, b, cs = summary["derivative_suite"], summary["byte_suite"], summary["complex_step"]
    for k in ("programs", "scalar_outputs_exact", "gradients_matched", "final_storage_control_detected"):
        _equal(fails, f"derivative_suite.{k}", d[k], programs)
    _equal(fails, "derivative_suite.unsupported", d["unsupported"], 0)
    _small(fails, "derivative_suite.max_grad_error", d["max_grad_error"])
    for k in ("programs", "snapshot_replay_match", "region_undo_match", "wrong_rng_detected"):
        _equal(fails, f"byte_suite.{k}", b[k], programs)
    if cs["programs"] < 1:
        fails.append("complex_step.programs = 0, expected >= 1")
    _equal(fails, "complex_step.matched", cs["matched"], cs["programs"])
    _small(fails, "complex_step.max_error", cs["max_error"])
    return fails


def engines_failures(summary: dict, programs: int, engines: list[str]) -> list[str]:
    """Failed targets of ``stateremat verify engines --programs programs``.

    Targets: ``programs`` programs, every engine on every program, every recovery matched,
    max gradient and complex-step errors <= 1e-14.
    """
    fails: list[str] = []
    s, cs = summary, summary["complex_step"]
    _equal(fails, "programs", s["programs"], programs)
    _equal(fails, "engines", s["engines"], list(engines))
    _equal(fails, "recoveries_checked", s["recoveries_checked"], programs * len(engines))
    _equal(fails, "recoveries_matched", s["recoveries_matched"], s["recoveries_checked"])
    _small(fails, "max_grad_error", s["max_grad_error"])
    if cs["programs"] < 1:
        fails.append("complex_step.programs = 0, expected >= 1")
    _equal(fails, "complex_step.matched", cs["matched"], cs["programs"])
    _small(fails, "complex_step.max_error", cs["max_error"])
    return fails


def alias_failures(summary: dict, n_seeds: int, n_engines: int, inputs_per_seed: int) -> list[str]:
    """Failed targets of ``stateremat verify alias`` over ``n_seeds`` seeds.

    Targets: ``n_seeds * inputs_per_seed`` inputs; every supported recovery (``n_engines`` per
    input) matched; one refused integer-write case per input, none assigned a gradient; stored
    operations consistent on every input; max gradient error <= 1e-14.
    """
    fails: list[str] = []
    s = summary
    inputs = n_seeds * inputs_per_seed
    _equal(fails, "inputs", s["inputs"], inputs)
    _equal(fails, "supported_recoveries", s["supported_recoveries"], inputs * n_engines)
    _equal(fails, "matched", s["matched"], s["supported_recoveries"])
    _equal(fails, "unsupported", s["unsupported"], inputs)
    _equal(fails, "integer_writes_not_refused", s["integer_writes_not_refused"], 0)
    _equal(fails, "stored_operations_consistent", s["stored_operations_consistent"], inputs)
    _small(fails, "max_grad_error", s["max_grad_error"])
    return fails
