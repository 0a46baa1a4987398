"""The three verify tables (``finite``, ``engines``, ``alias``): row schemas, keys, value rules.

Written by ``stateremat verify`` (``paper.verify``), summarised from the rows by its summaries;
declared here so every reader checks them, whatever it imported.
"""
from __future__ import annotations

import pandas as pd
import pyarrow as pa

from ...._shared.checks import MAX_SEED
from ....contract import Outcome
from ...limits import MAX_PROGRAMS, MAX_STUDY_SEEDS
from .._store import declare_table
from .._values import (below_config, config_value, implies, in_config, int_list, integer,
                       number, one_of)

#: The finite suites' program families (``paper.verify`` builds one program of each).
FAMILIES = ("queue", "prototype", "recurrence")
#: The engines of the study (``reference.engines.ENGINES``; named here so readers need not
#: import them) and the joint-alias dims (``paper.verify``'s ``ALIAS_DIMS``).
ENGINE_NAMES = ("eager", "guarded", "readset", "region", "whole")
ALIAS_DIMS = (32, 64)


FINITE_KEY = ("suite", "seed", "program", "check")
ENGINES_KEY = ("seed", "program", "check", "engine")
ALIAS_KEY = ("seed", "pattern", "dim", "check", "engine")

#: Row schemas of the three verify tables (names, types; key columns never null).
FINITE_COLUMNS = [
    ("suite", pa.string()), ("program", pa.int64()), ("check", pa.string()),
    ("seed", pa.int64()), ("program_seed", pa.string()), ("family", pa.string()),
    ("dims", pa.int64()), ("n_ops", pa.int64()), ("outcome", pa.string()),
    ("max_error", pa.float64()), ("coordinates", pa.int64()), ("detected", pa.bool_()),
    ("bytes_differing", pa.int64()), ("message", pa.string()), ("source_hash", pa.string()),
    ("segment_random_ops", pa.int64()),
]
ENGINES_COLUMNS = [
    ("family", pa.string()), ("dims", pa.int64()), ("n_ops", pa.int64()),
    ("n_segments", pa.int64()), ("state_bytes", pa.int64()), ("source_hash", pa.string()),
    ("coordinates", pa.int64()), ("max_error", pa.float64()), ("retained_bytes", pa.int64()),
    ("workspace_bytes", pa.int64()), ("repeat_ok", pa.bool_()),
    ("start_state_checked", pa.bool_()), ("structural_checks", pa.string()),
    ("message", pa.string()), ("seed", pa.int64()), ("program", pa.int64()),
    ("program_seed", pa.string()), ("check", pa.string()), ("engine", pa.string()),
    ("outcome", pa.string()),
]
ALIAS_COLUMNS = [
    ("family", pa.string()), ("n_ops", pa.int64()), ("n_segments", pa.int64()),
    ("state_bytes", pa.int64()), ("source_hash", pa.string()), ("coordinates", pa.int64()),
    ("max_error", pa.float64()), ("retained_bytes", pa.int64()),
    ("workspace_bytes", pa.int64()), ("repeat_ok", pa.bool_()),
    ("start_state_checked", pa.bool_()), ("structural_checks", pa.string()),
    ("message", pa.string()), ("seed", pa.int64()), ("pattern", pa.string()),
    ("dim", pa.int64()), ("program_seed", pa.string()), ("check", pa.string()),
    ("engine", pa.string()), ("outcome", pa.string()),
]
_OUTCOMES = one_of(*(str(o) for o in Outcome))
_SIZES = ("dims", "n_ops", "n_segments", "state_bytes", "coordinates", "retained_bytes",
          "workspace_bytes", "bytes_differing", "dim")


def _sizes(columns) -> dict:
    """Counts and byte sizes among ``columns``: finite and non-negative."""
    return {c: number(0) for c, _ in columns if c in _SIZES}


_CONTROLS = ("final_storage_control", "wrong_rng")


def _says_detected(df: pd.DataFrame):
    """Rows whose ``detected`` is given: a control check that ran (M or D), or any set."""
    ran = df["check"].isin(_CONTROLS) & df["outcome"].isin(("M", "D"))
    return (df["detected"].notna() | ran).to_numpy(dtype=bool)


def _detected_is_divergence(df: pd.DataFrame):
    det = df["detected"].astype("boolean")
    return (det.notna() & (det.fillna(False) == (df["outcome"] == "D"))).to_numpy(dtype=bool)


#: Value rules (checked on every read, against the run's sidecar config); a check that measures
#: no error (or a program outside the supported domain) writes NaN for it. A control's
#: ``detected`` is its outcome in other words (D: detected), so the two agree.
FINITE_VALUES = {
    "detected": implies("true where the outcome is D and false where it is M (a control that "
                        "ran says it)", _says_detected, _detected_is_divergence),
    **_sizes(FINITE_COLUMNS), "suite": one_of("derivative", "byte"), "family": one_of("derivative", "byte"),
    "check": one_of("scalar_output", "gradient", "final_storage_control", "complex_step",
                    "snapshot_replay", "region_undo", "wrong_rng"),
    "outcome": _OUTCOMES, "seed": config_value("seed"), "program": below_config("programs"),
    "max_error": number(0, missing={"check": ("snapshot_replay", "region_undo", "wrong_rng"),
                                    "outcome": ("unsupported",)}),
    "segment_random_ops": number(0, missing=True),
}
_STUDY_VALUES = {
    "family": one_of(*FAMILIES), "outcome": _OUTCOMES,
    "engine": one_of("", *ENGINE_NAMES),
    "max_error": number(0, missing={"check": ("stored_operations", "integer_write_gradient"),
                                    "outcome": ("unsupported",)}),
}
ENGINES_VALUES = {**_sizes(ENGINES_COLUMNS), **_STUDY_VALUES, "check": one_of("recovery", "complex_step"),
                  "seed": config_value("seed"), "program": below_config("programs")}
ALIAS_VALUES = {**_sizes(ALIAS_COLUMNS), **_STUDY_VALUES, "pattern": one_of(*FAMILIES), "dim": one_of(*ALIAS_DIMS),
                "check": one_of("recovery", "stored_operations", "integer_write_gradient"),
                "seed": in_config("seeds")}
#: Sidecar config fields, checked before a reader sizes its work from them.
PROGRAMS_CONFIG = {"programs": integer(1, MAX_PROGRAMS), "seed": integer(0, MAX_SEED)}
ALIAS_CONFIG = {"seeds": int_list(0, MAX_SEED, MAX_STUDY_SEEDS)}
declare_table("finite", FINITE_COLUMNS, FINITE_KEY, required=("outcome",),
              values=FINITE_VALUES, config=PROGRAMS_CONFIG)
declare_table("engines", ENGINES_COLUMNS, ENGINES_KEY, required=("outcome",),
              values=ENGINES_VALUES, config=PROGRAMS_CONFIG)
declare_table("alias", ALIAS_COLUMNS, ALIAS_KEY, required=("outcome",), values=ALIAS_VALUES,
              config=ALIAS_CONFIG)
