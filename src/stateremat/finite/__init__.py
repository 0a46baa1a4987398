"""Independent NumPy reference for replay semantics (paper §3, §6, §7; DESIGN.md layer ``finite``).

Programs over declared byte storage with typed aliases (:class:`Program`), executed byte by
byte into a version graph (:func:`execute`); reverse mode by eq. (1), an independent forward
Jacobian and a complex-step derivative; byte/RNG replay checks of eq. (2); the seeded suites.

This package never imports torch or jax.
"""
from ._exec import Node as Node, OpRecord as OpRecord, Run as Run, execute as execute
from ._gen import byte_program as byte_program, derivative_program as derivative_program
from ._grad import (
    check_supported as check_supported,
    complex_step_grad as complex_step_grad,
    forward_jacobian_grad as forward_jacobian_grad,
    graph_output as graph_output,
    reverse_grad as reverse_grad,
    scalar_output as scalar_output,
    unsupported_reason as unsupported_reason,
)
from ._ir import Op as Op, Program as Program, Region as Region, View as View
from ._replay import (
    forward_with_snapshot as forward_with_snapshot,
    region_undo_replay as region_undo_replay,
    same_state as same_state,
    snapshot_replay as snapshot_replay,
    wrong_rng_state as wrong_rng_state,
)
from ._summary import summarise_finite as summarise_finite
from ._families import family_program as family_program, integer_write_variant as integer_write_variant
from ._study import check_recovery as check_recovery
from ._summary import summarise_alias as summarise_alias, summarise_engines as summarise_engines
