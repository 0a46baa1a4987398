"""Torch/JAX replay-semantics cohort (paper §5, Table 2): programs, methods, runner, summary.

Importing this package needs neither torch nor jax; running the cohort imports them.
"""
from ._compare import FLOAT32_RTOL as FLOAT32_RTOL, compare as compare
from ._families import (
    DTYPES as DTYPES,
    FAMILIES as FAMILIES,
    HIDDEN_FAMILIES as HIDDEN_FAMILIES,
    ProgramParams as ProgramParams,
    program_data as program_data,
    program_params as program_params,
)
from ._runner import (
    EXTENSION_TABLE as EXTENSION_TABLE,
    KEY as KEY,
    SEMANTICS_TABLE as SEMANTICS_TABLE,
    RunReport as RunReport,
    cohort_units as cohort_units,
    resolve_device as resolve_device,
    run_semantics as run_semantics,
)
from ._summary import TABLE_ORDER as TABLE_ORDER, summarize_frame as summarize_frame, summarize_semantics as summarize_semantics

__all__ = [
    "DTYPES", "EXTENSION_TABLE", "FAMILIES", "FLOAT32_RTOL", "HIDDEN_FAMILIES", "KEY",
    "ProgramParams", "RunReport", "SEMANTICS_TABLE", "TABLE_ORDER", "cohort_units", "compare",
    "program_data", "program_params", "resolve_device", "run_semantics", "summarize_frame",
    "summarize_semantics",
]
