"""Elementwise operation rules: one FORWARD, one VJP and one JVP table keyed by op kind.

Every write of a finite program applies one elementwise kind to the operand values it read
(addressing — strides, gather, scatter — is the executor's business, not the rule's). Reverse
mode, the forward Jacobian and the complex step all read these tables, so they stay small
enough to audit (STYLE.md §10, after tinygrad's ``gradient.py``).

Conventions for every rule (``xs`` is a tuple of operand arrays, ``c`` the coefficient tuple,
``eps`` the recorded noise or ``None``):

* ``FORWARD[kind](xs, c, eps) -> y``; works for float64, float32 and complex128 arrays, and for
  operands of shape ``(k,)`` or ``(k, D)`` (``eps`` then has shape ``(k, 1)``).
* ``VJP[kind](xs, c, eps, ybar) -> tuple of xbar``, one per operand, each shaped like ``ybar``.
* ``JVP[kind](xs, c, eps, xdots) -> ydot``; ``xs[j]`` has shape ``(k, 1)``, ``xdots[j]``
  ``(k, D)`` (``D`` input directions at once).

Integer kinds (``INT_KINDS``) move integer bits; they have no derivative rule on purpose:
differentiating through them is unsupported (R8).

References: paper §3, eq. (1).
"""
from __future__ import annotations

import numpy as np

#: kind -> number of operands read per element
ARITY: dict[str, int] = {
    "copy": 1, "affine": 1, "tanh": 1, "sin": 1, "square": 1, "noise": 1,
    "mul": 2, "add": 2,
    "iaffine": 1,
}
#: kind -> number of coefficients
N_COEF: dict[str, int] = {
    "copy": 0, "affine": 2, "tanh": 3, "sin": 3, "square": 3, "noise": 1,
    "mul": 1, "add": 2, "iaffine": 2,
}
#: kinds that draw one standard normal per written element from the program generator
RANDOM_KINDS = frozenset({"noise"})
#: kinds that write integer bits (no derivative: R8)
INT_KINDS = frozenset({"iaffine"})


def _u(c, x):  # inner affine argument a*x + b of the coefficient nonlinearities
    return c[0] * x + c[1]


FORWARD = {
    "copy": lambda xs, c, eps: xs[0] + 0,
    "affine": lambda xs, c, eps: c[0] * xs[0] + c[1],
    "tanh": lambda xs, c, eps: c[2] * np.tanh(_u(c, xs[0])),
    "sin": lambda xs, c, eps: c[2] * np.sin(_u(c, xs[0])),
    "square": lambda xs, c, eps: c[2] * _u(c, xs[0]) * _u(c, xs[0]),
    "noise": lambda xs, c, eps: xs[0] + c[0] * eps,
    "mul": lambda xs, c, eps: c[0] * xs[0] * xs[1],
    "add": lambda xs, c, eps: c[0] * xs[0] + c[1] * xs[1],
    # integer bits: int64 arithmetic wraps modulo 2**64, deterministic on every platform
    "iaffine": lambda xs, c, eps: xs[0] * np.int64(c[0]) + np.int64(c[1]),
}


def _dtanh(c, x):
    t = np.tanh(_u(c, x))
    return c[2] * c[0] * (1.0 - t * t)


def _dsin(c, x):
    return c[2] * c[0] * np.cos(_u(c, x))


def _dsquare(c, x):
    return 2.0 * c[2] * c[0] * _u(c, x)


# Reverse rules: eq. (1), xbar_j += ybar * df/dx_j evaluated at the *historical* operands.
VJP = {
    "copy": lambda xs, c, eps, g: (g,),
    "affine": lambda xs, c, eps, g: (c[0] * g,),
    "tanh": lambda xs, c, eps, g: (g * _dtanh(c, xs[0]),),
    "sin": lambda xs, c, eps, g: (g * _dsin(c, xs[0]),),
    "square": lambda xs, c, eps, g: (g * _dsquare(c, xs[0]),),
    "noise": lambda xs, c, eps, g: (g,),  # recorded noise is a constant, not an input
    "mul": lambda xs, c, eps, g: (g * (c[0] * xs[1]), g * (c[0] * xs[0])),
    "add": lambda xs, c, eps, g: (c[0] * g, c[1] * g),
}

# Forward rules, written separately from VJP (the derivative reference must not share code).
JVP = {
    "copy": lambda xs, c, eps, d: d[0],
    "affine": lambda xs, c, eps, d: c[0] * d[0],
    "tanh": lambda xs, c, eps, d: (c[2] * c[0]) * (1.0 - np.tanh(c[0] * xs[0] + c[1]) ** 2) * d[0],
    "sin": lambda xs, c, eps, d: (c[2] * c[0]) * np.cos(c[0] * xs[0] + c[1]) * d[0],
    "square": lambda xs, c, eps, d: (2.0 * c[2] * c[0]) * (c[0] * xs[0] + c[1]) * d[0],
    "noise": lambda xs, c, eps, d: d[0],
    "mul": lambda xs, c, eps, d: c[0] * (xs[1] * d[0] + xs[0] * d[1]),
    "add": lambda xs, c, eps, d: c[0] * d[0] + c[1] * d[1],
}

#: kinds with a derivative (must be exactly the keys of VJP and JVP; tested)
FLOAT_KINDS = frozenset(k for k in FORWARD if k not in INT_KINDS)
