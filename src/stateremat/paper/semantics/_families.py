"""The five program families of the replay-semantics cohort and their seeded parameters.

Every family is one small program that draws randomness (a dropout mask) inside the segment
and writes in place. The parameters and input data of a program depend only on the seed key
and the family (never on the backend or dtype), so the Torch and JAX programs and both
precisions stay paired within a seed (paper §5). The families' names, with the cohort's methods
and dtypes, are named with the tables whose rules check them (``records.tables``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..records.tables import (  # the tables' rules name them too
    SEMANTICS_DTYPES as DTYPES,
    SEMANTICS_FAMILIES as FAMILIES,
    JAX_METHODS as JAX_METHODS,
    STATEREMAT_JAX_METHOD as STATEREMAT_JAX_METHOD,
    TORCH_METHOD_NAMES as TORCH_METHOD_NAMES,
)

#: Families whose segment writes a hidden buffer (state that is not a segment input).
HIDDEN_FAMILIES: tuple[str, ...] = ("hidden_strided", "hidden_overlap")

# Shapes are fixed so that JAX's per-primitive compile cache is reused across seeds; only
# values, strides, offsets and overlap shifts vary with the seed.
_ROWS, _COLS, _N = 4, 12, 24


@dataclass(frozen=True)
class ProgramParams:
    """Parameters of one program (family × seed key).

    Args:
        family: one of :data:`FAMILIES`.
        seed: the seed key (e.g. 420000).
        rows, cols: shape of the 2-D strided families, ``(rows, cols)``.
        n: length of the 1-D overlapping-view families.
        stride, offset: the strided region is columns ``offset::stride``.
        shift: overlapping views are ``[0, n - shift)`` and ``[shift, n)``; ``shift < n / 2``
            so they share ``n - 2 * shift`` elements.
        drop: dropout probability of the random mask drawn inside the segment.
        decay: running-average factor of hidden-buffer updates; scale of local writes.
        bias: constant added by local strided writes.
    """

    family: str
    seed: int
    rows: int
    cols: int
    n: int
    stride: int
    offset: int
    shift: int
    drop: float
    decay: float
    bias: float

    @property
    def two_d(self) -> bool:
        """Whether the program works on ``(rows, cols)`` tensors (strided families)."""
        return self.family in ("local_strided", "hidden_strided")

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of ``x``, the random mask and the hidden buffer."""
        return (self.rows, self.cols) if self.two_d else (self.n,)

    @property
    def w_shape(self) -> tuple[int, ...]:
        """Shape of the parameter ``w`` (broadcast over rows in 2-D families)."""
        return (self.cols,) if self.two_d else (self.n,)

    def as_dict(self) -> dict:
        """Plain dict (for hashing and records)."""
        return dataclasses.asdict(self)


def program_params(family: str, seed: int) -> ProgramParams:
    """Draw the parameters of program ``(family, seed)`` deterministically.

    Raises:
        ValueError: if ``family`` is not one of :data:`FAMILIES`.
    """
    if family not in FAMILIES:
        raise ValueError(f"stateremat semantics: family {family!r} is unknown; expected one "
                         f"of {FAMILIES}. Tip: check the spelling.")
    rng = np.random.default_rng([seed, FAMILIES.index(family)])
    stride = int(rng.integers(2, 5))
    return ProgramParams(
        family=family, seed=seed, rows=_ROWS, cols=_COLS, n=_N,
        stride=stride, offset=int(rng.integers(0, stride)),
        shift=int(rng.integers(1, _N // 2)),
        drop=float(np.round(rng.uniform(0.2, 0.5), 3)),
        decay=float(np.round(rng.uniform(0.3, 0.9), 3)),
        bias=float(np.round(rng.uniform(-1.0, 1.0), 3)),
    )


def program_data(params: ProgramParams) -> dict[str, np.ndarray]:
    """Input data of a program as float64 NumPy arrays (cast to the run's dtype by callers).

    Returns:
        ``x`` (input, requires grad), ``w`` (parameter, requires grad), ``buf`` (hidden buffer;
        present for every family, used only by hidden ones), ``g`` (cotangent of the output,
        shaped like the output).
    """
    rng = np.random.default_rng([params.seed, FAMILIES.index(params.family), 1])
    out_shape = (params.n - params.shift,) if params.family in ("local_overlap",
                                                                 "hidden_overlap") \
        else params.shape
    return {
        "x": rng.standard_normal(params.shape),
        "w": rng.standard_normal(params.w_shape),
        "buf": rng.standard_normal(params.shape),
        "g": rng.standard_normal(out_shape),
    }
