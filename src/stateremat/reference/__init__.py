"""Independent NumPy reference for replay semantics (paper §3, §6, §7; DESIGN.md layer ``reference``).

Programs over declared byte storage with typed aliases (:class:`Program`), executed byte by
byte into a version graph (:func:`execute`); reverse mode by eq. (1), an independent forward
Jacobian and a complex-step derivative, all reading one VJP and one JVP table keyed by op;
byte/RNG replay checks of eq. (2). The five preservation engines are in
:mod:`stateremat.reference.engines`; the seeded suites and studies that exercise all of this
are the paper wing's (:mod:`stateremat.paper.verify`).

This package imports only NumPy (never torch or jax).
"""
from ._exec import Node as Node, OpRecord as OpRecord, Run as Run, execute as execute
from ._grad import (
    check_supported as check_supported,
    complex_step_grad as complex_step_grad,
    forward_jacobian_grad as forward_jacobian_grad,
    graph_output as graph_output,
    reverse_grad as reverse_grad,
    scalar_output as scalar_output,
    unsupported_reason as unsupported_reason,
)
from ._ir import DTYPES as DTYPES, Op as Op, Program as Program, Region as Region, View as View
from ._ops import RANDOM_KINDS as RANDOM_KINDS
from ._replay import (
    forward_with_snapshot as forward_with_snapshot,
    region_undo_replay as region_undo_replay,
    same_state as same_state,
    snapshot_replay as snapshot_replay,
    wrong_rng_state as wrong_rng_state,
)

__all__ = [
    "DTYPES", "Node", "Op", "OpRecord", "Program", "RANDOM_KINDS", "Region", "Run", "View",
    "check_supported", "complex_step_grad", "execute", "forward_jacobian_grad",
    "forward_with_snapshot", "graph_output", "region_undo_replay", "reverse_grad",
    "same_state", "scalar_output", "snapshot_replay", "unsupported_reason", "wrong_rng_state",
]
