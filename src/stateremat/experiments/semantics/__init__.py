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
    run_semantics as run_semantics,
)
from ._summary import summarize_semantics as summarize_semantics
