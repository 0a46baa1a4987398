"""Derivatives of a finite program's scalar output with respect to its float64 inputs.

Three independently organised computations over the version graph of :func:`execute`:

* :func:`reverse_grad` — reverse mode, eq. (1): ``vbar[p(k)] += vbar[k] * f_k'(v[p(k)])``,
  operands taken from their *historical versions* (R1); ``source="final"`` is the negative
  control that reads the final storage at the operand addresses instead.
* :func:`forward_jacobian_grad` — forward mode, the whole Jacobian ``dv/dx`` propagated node
  by node with the JVP table (the derivative reference).
* :func:`complex_step_grad` — the graph re-evaluated in complex128 with ``x + i h e_j`` for
  every input ``j`` at once; ``Im(out)/h`` (a second reference with no derivative rule).

Integer bit writes are not differentiated: :func:`unsupported_reason` names the first read of
float64 bytes that are not exactly one float64 version, and callers record ``unsupported``
(R8).

References: paper §3 eq. (1), §6.
"""
from __future__ import annotations

import numpy as np

from ..contract import UnsupportedError, rule
from ._exec import Run, read
from ._ops import FORWARD, JVP, VJP


def unsupported_reason(run: Run) -> str | None:
    """Why the scalar output of ``run`` cannot be differentiated, or ``None`` if it can."""
    for node in run.nodes:
        if node.differentiable and any((o < 0).any() for o in node.operands):
            return (f"op {node.k} ({node.kind}) reads float64 bytes that are not one float64 "
                    "version (integer/float32 bits or a misaligned alias were written there)")
    if (run.loss_vids() < 0).any():
        return "the scalar output reads float64 bytes last written as integer/float32 bits"
    return None


def check_supported(run: Run, api: str = "stateremat.reference") -> None:
    """Raise :class:`UnsupportedError` if the output cannot be differentiated (R8)."""
    why = unsupported_reason(run)
    if why is not None:
        raise UnsupportedError(f"{api}: cannot differentiate: {why}. {rule('R8')} Tip: keep "
                               "integer writes out of float storage, or record this as unsupported.")


def scalar_output(run: Run) -> float:
    """The program's scalar output computed from the final storage bytes."""
    v = run.program.view(run.program.loss_view)
    vals, _ = read(run.bytes_, v, np.arange(v.length))
    return float(run.program.loss_weights() @ vals)


def graph_values(run: Run, x0: np.ndarray | None = None) -> np.ndarray:
    """Evaluate every float64 version from the inputs through the graph alone.

    Args:
        run: a tracked run.
        x0: input values ``(n_inputs,)`` or ``(n_inputs, D)`` (float64 or complex128);
            default the float64 elements of ``B0``.

    Returns:
        values ``(n_vids,)`` or ``(n_vids, D)``; non-float64 vids stay 0.
    """
    x0 = run.vval[: run.n_inputs] if x0 is None else x0
    vals = np.zeros((run.next_vid,) + x0.shape[1:], dtype=x0.dtype)
    vals[: run.n_inputs] = x0
    for node in run.nodes:
        if not node.differentiable:
            continue
        xs = [vals[o] for o in node.operands]
        eps = node.eps if (node.eps is None or x0.ndim == 1) else node.eps[:, None]
        vals[node.out] = FORWARD[node.kind](xs, node.coef, eps)
    return vals


def graph_output(run: Run) -> float:
    """Scalar output evaluated through the version graph (must equal :func:`scalar_output`)."""
    return float(run.program.loss_weights() @ graph_values(run)[run.loss_vids()])


def reverse_grad(run: Run, source: str = "versions") -> np.ndarray:
    """Reverse-mode gradient ``(n_inputs,)`` by eq. (1).

    Args:
        run: a tracked, supported run (see :func:`check_supported`).
        source: ``"versions"`` reads each node's operands from their historical versions;
            ``"final"`` is the negative control reading the final storage bytes at the same
            addresses (wrong whenever a read location was overwritten later).

    Raises:
        UnsupportedError: if the run is not differentiable (R8).
    """
    check_supported(run, "stateremat.reference.reverse_grad")
    vbar = np.zeros(run.next_vid)
    np.add.at(vbar, run.loss_vids(), run.program.loss_weights())
    for node, rec in zip(reversed(run.nodes), reversed(run.records)):
        if not node.differentiable:
            continue
        g = vbar[node.out]
        if source == "versions":
            xs = [run.vval[o] for o in node.operands]
        elif source == "final":
            xs = [run.bytes_[o[:, None] + np.arange(8)].view("<f8").reshape(-1)
                  for o in rec.src_offsets]
        else:
            raise ValueError(f"stateremat.reference.reverse_grad: source must be 'versions' or 'final', "
                             f"got {source!r}")
        for o, xb in zip(node.operands, VJP[node.kind](xs, node.coef, node.eps, g)):
            np.add.at(vbar, o, xb)
    return vbar[: run.n_inputs]


def forward_jacobian_grad(run: Run) -> np.ndarray:
    """Gradient ``(n_inputs,)`` from the full forward-mode Jacobian (JVP table only).

    Raises:
        UnsupportedError: if the run is not differentiable (R8).
    """
    check_supported(run, "stateremat.reference.forward_jacobian_grad")
    n = run.n_inputs
    tan = np.zeros((run.next_vid, n))
    tan[:n] = np.eye(n)
    for node in run.nodes:
        if not node.differentiable:
            continue
        xs = [run.vval[o][:, None] for o in node.operands]
        eps = None if node.eps is None else node.eps[:, None]
        tan[node.out] = JVP[node.kind](xs, node.coef, eps, [tan[o] for o in node.operands])
    return run.program.loss_weights() @ tan[run.loss_vids()]


def complex_step_grad(run: Run, h: float = 1e-20) -> np.ndarray:
    """Complex-step gradient ``(n_inputs,)``: ``Im(f(x + i h e_j)) / h`` for all ``j`` at once.

    Danger:
        Exact to rounding only for analytic rules (all float kinds here are).

    Raises:
        UnsupportedError: if the run is not differentiable (R8).
    """
    check_supported(run, "stateremat.reference.complex_step_grad")
    n = run.n_inputs
    x0 = run.vval[:n][:, None] + 1j * h * np.eye(n)
    vals = graph_values(run, x0.astype(np.complex128))
    return (run.program.loss_weights() @ vals[run.loss_vids()]).imag / h
