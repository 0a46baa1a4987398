"""The finite verification suites and studies of the paper (§6, §7, Tables 1 and 3).

Seeded program generators (derivative and byte suites, queue/prototype/recurrence families),
the engine semantic study and the joint-alias study, run on the NumPy reference
(:mod:`stateremat.reference`); summaries recomputed from raw rows and the contract targets
``stateremat verify`` checks.
"""
from ._families import FAMILIES as FAMILIES, family_program as family_program, integer_write_variant as integer_write_variant
from ._gen import SUITE_CODES as SUITE_CODES, byte_program as byte_program, byte_segment as byte_segment, derivative_program as derivative_program
from ._run import run_alias as run_alias, run_engines as run_engines, run_finite as run_finite, run_units as run_units
from ._study import (
    ALIAS_DIMS as ALIAS_DIMS,
    ALIAS_PATTERNS as ALIAS_PATTERNS,
    ENGINE_NAMES as ENGINE_NAMES,
    alias_rows as alias_rows,
    check_recovery as check_recovery,
    engine_rows as engine_rows,
)
from ._suite import finite_rows as finite_rows
from ._summary import summarise_alias as summarise_alias, summarise_engines as summarise_engines, summarise_finite as summarise_finite
from ._targets import alias_failures as alias_failures, engines_failures as engines_failures, finite_failures as finite_failures

__all__ = [
    "ALIAS_DIMS", "ALIAS_PATTERNS", "ENGINE_NAMES", "FAMILIES", "SUITE_CODES",
    "alias_failures", "alias_rows", "byte_program", "byte_segment", "check_recovery",
    "derivative_program", "engine_rows", "engines_failures", "family_program",
    "finite_failures", "finite_rows", "integer_write_variant", "run_alias", "run_engines",
    "run_finite", "run_units", "summarise_alias", "summarise_engines", "summarise_finite",
]
