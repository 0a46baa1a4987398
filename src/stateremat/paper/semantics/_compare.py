"""Compare one execution's observations with its reference: outcome M or D, and max differences.

Observations are NumPy arrays grouped by prefix: ``out*`` (outputs), ``grad*`` (gradients of
both backward passes), ``state*`` (final visible state, including unchanged inputs) and
``rng*`` (final generator state, compared as bytes). Framework-neutral: imports neither
torch nor jax.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ...contract import Outcome

#: Relative tolerance for float32 (max |got - ref| / max |ref| per array); float64 is exact.
FLOAT32_RTOL = 1e-6
_GROUPS = ("out", "grad", "state", "rng")


def _diff(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(max absolute difference, normwise relative difference); inf if shapes differ."""
    if ref.shape != got.shape:
        return math.inf, math.inf
    if ref.size == 0:
        return 0.0, 0.0
    if ref.dtype.kind not in "fc":  # integer/byte state (RNG): any difference counts fully
        d = float(np.max(np.abs(ref.astype(np.int64) - got.astype(np.int64))))
        return d, (math.inf if d else 0.0)
    both_nan = np.isnan(ref) & np.isnan(got)
    err = np.where(both_nan, 0.0, np.abs(ref.astype(np.float64) - got.astype(np.float64)))
    err = np.where(np.isnan(err), math.inf, err)
    d = float(np.max(err))
    scale = float(np.max(np.abs(np.nan_to_num(ref.astype(np.float64)))))
    return d, (0.0 if d == 0.0 else (d / scale if scale > 0 else math.inf))


def compare(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
            dtype: str) -> tuple[Outcome, dict[str, float]]:
    """Compare observations of one execution with the reference execution.

    Args:
        ref, got: name -> array; names start with one of ``out``, ``grad``, ``state``, ``rng``.
            A name present in only one side counts as a difference (``inf``).
        dtype: ``"float64"`` (bitwise equality required) or ``"float32"`` (each array within
            :data:`FLOAT32_RTOL` of the reference, normwise relative).

    Returns:
        ``(Outcome.M or Outcome.D, diffs)`` with ``max_abs_diff_<group>`` for each group and
        ``max_rel_diff`` over all arrays (0.0 when equal).
    """
    diffs = {f"max_abs_diff_{g}": 0.0 for g in _GROUPS}
    worst_rel = 0.0
    ok = True
    for name in sorted(set(ref) | set(got)):
        group = next((g for g in _GROUPS if name.startswith(g)), None)
        if group is None:
            raise ValueError(f"stateremat semantics.compare: observation {name!r} has no group "
                             f"prefix; expected one of {_GROUPS}. Tip: rename it.")
        if name not in ref or name not in got:
            d = r = math.inf
        else:
            d, r = _diff(np.asarray(ref[name]), np.asarray(got[name]))
        key = f"max_abs_diff_{group}"
        diffs[key] = max(diffs[key], d)
        worst_rel = max(worst_rel, r)
        exact = dtype == "float64" or group == "rng" or r == math.inf
        ok &= (d == 0.0) if exact else (r <= FLOAT32_RTOL)
    diffs["max_rel_diff"] = worst_rel
    return (Outcome.M if ok else Outcome.D), diffs


class StageError(Exception):
    """Wraps a framework exception with the stage it was raised in."""

    def __init__(self, stage: str, exc: BaseException, invocation_count: int):
        super().__init__(stage)
        self.stage, self.exc, self.invocation_count = stage, exc, invocation_count
