"""Finite-program IR over declared storage: byte regions, typed views, elementwise writes.

A :class:`Program` declares its storage as byte regions (float64 or int64 elements, 8-byte
aligned, concatenated), typed :class:`View` s onto those bytes (float64/float32/int64/int32,
any byte offset and element stride, so views alias, overlap partially and reinterpret bits)
and a list of :class:`Op` s. Each op reads operand elements through views (elementwise,
gathered through an integer index view, or elementwise into scattered destinations) and
writes one elementwise rule of :mod:`._ops` into its destination view.

References: paper §3 (versions, eq. 1 and eq. 2), §6.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ._ops import ARITY, INT_KINDS, N_COEF

#: view dtype code -> little-endian numpy dtype
DTYPES = {"f8": np.dtype("<f8"), "f4": np.dtype("<f4"), "i8": np.dtype("<i8"), "i4": np.dtype("<i4")}
FLOAT_CODES = frozenset({"f8", "f4"})
MODES = ("map", "gather", "scatter")


@dataclass(frozen=True)
class Region:
    """Declared storage: ``length`` elements of ``dtype`` (``"f8"`` or ``"i8"``), 8-byte aligned."""

    name: str
    dtype: str
    length: int


@dataclass(frozen=True)
class View:
    """Typed window onto the program bytes.

    Args:
        name: unique view name.
        dtype: ``"f8"``, ``"f4"``, ``"i8"`` or ``"i4"``.
        offset_bytes: byte offset of element 0 in the whole storage.
        length: number of elements.
        stride: element stride in units of the view's itemsize (``>= 1``, so a view never
            writes one byte twice).
    """

    name: str
    dtype: str
    offset_bytes: int
    length: int
    stride: int = 1

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    def element_offsets(self, pos: np.ndarray) -> np.ndarray:
        """Byte offsets ``(m,)`` int64 of elements ``pos`` ``(m,)``."""
        return self.offset_bytes + np.asarray(pos, dtype=np.int64) * (self.stride * self.itemsize)


@dataclass(frozen=True)
class Op:
    """One write: ``dst[j] = FORWARD[kind](srcs..., coef, eps)[j]``.

    Args:
        kind: key of the rule tables in :mod:`._ops`.
        dst: destination view name.
        srcs: operand view names (``ARITY[kind]`` of them).
        coef: coefficients (``N_COEF[kind]`` numbers).
        mode: ``"map"`` (operand element j -> destination element j, equal lengths),
            ``"gather"`` (operand positions ``index[j] mod len(src)``, destination j) or
            ``"scatter"`` (operand element j -> destination ``index[j] mod len(dst)``; with
            repeated positions the last j wins, as a sequential loop would).
        index: integer view read for gather/scatter (integer reads used as indices).
    """

    kind: str
    dst: str
    srcs: tuple[str, ...]
    coef: tuple[float, ...] = ()
    mode: str = "map"
    index: str | None = None


@dataclass(frozen=True)
class Program:
    """A finite program: declared storage, views, ops, initial bytes and generator seeds.

    ``B0`` and ``R0`` are functions of ``init_seed`` and ``rng_seed`` (:meth:`initial_bytes`,
    :meth:`initial_rng`), so the spec alone identifies the program (:meth:`spec`).
    The scalar output is ``sum(loss_weights * final values of the loss view)``.
    """

    regions: tuple[Region, ...]
    views: tuple[View, ...]
    ops: tuple[Op, ...]
    loss_view: str
    init_seed: int = 0
    rng_seed: int = 1
    family: str = "random"

    # ---- layout -----------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(r.length * 8 for r in self.regions)

    def region_offsets(self) -> dict[str, int]:
        out, off = {}, 0
        for r in self.regions:
            out[r.name] = off
            off += r.length * 8
        return out

    def view(self, name: str) -> View:
        return self._views[name]

    @functools.cached_property
    def _views(self) -> dict[str, View]:  # cached in __dict__ (allowed on frozen dataclasses)
        return {v.name: v for v in self.views}

    # ---- initial state ------------------------------------------------------------------
    def initial_bytes(self) -> np.ndarray:
        """``B0``: uint8 ``(nbytes,)``; float regions uniform in [-1, 1], int regions in [0, 1000)."""
        g = np.random.default_rng([self.init_seed, 7])
        parts = []
        for r in self.regions:
            if r.dtype == "f8":
                parts.append(g.uniform(-1.0, 1.0, r.length).astype("<f8").view(np.uint8))
            else:
                parts.append(g.integers(0, 1000, r.length).astype("<i8").view(np.uint8))
        return np.concatenate(parts) if parts else np.zeros(0, np.uint8)

    def initial_rng(self) -> np.random.Generator:
        """``R0``: a fresh ``Generator(PCG64(rng_seed))`` (its ``bit_generator.state`` is R)."""
        return np.random.Generator(np.random.PCG64(self.rng_seed))

    def loss_weights(self) -> np.ndarray:
        """Weights ``(len(loss_view),)`` float64 of the scalar output, nonzero."""
        g = np.random.default_rng([self.init_seed, 11])
        n = self.view(self.loss_view).length
        return g.uniform(0.5, 1.5, n) * g.choice([-1.0, 1.0], n)

    # ---- identity -----------------------------------------------------------------------
    def spec(self) -> dict:
        """JSON-serialisable description (hashed into every record's ``source_hash``)."""
        return dataclasses.asdict(self)

    def with_ops(self, ops) -> "Program":
        return dataclasses.replace(self, ops=tuple(ops))

    def validate(self) -> "Program":
        """Check the declaration; returns ``self``.

        Raises:
            ValueError: naming the bad view/op, expected vs got.
        """
        names = [v.name for v in self.views]
        if len(set(names)) != len(names):
            raise ValueError(f"stateremat.reference.Program: view names must be unique, got {names}")
        for r in self.regions:
            if r.dtype not in ("f8", "i8") or r.length < 1:
                raise ValueError(f"stateremat.reference.Program: region {r.name!r} needs dtype f8/i8 and "
                                 f"length >= 1, got {r.dtype!r}, {r.length}")
        for v in self.views:
            if v.dtype not in DTYPES or v.length < 1 or v.stride < 1 or v.offset_bytes < 0:
                raise ValueError(f"stateremat.reference.Program: bad view {v}; dtype must be one of "
                                 f"{sorted(DTYPES)}, length and stride >= 1, offset >= 0")
            end = v.offset_bytes + ((v.length - 1) * v.stride + 1) * v.itemsize
            if end > self.nbytes:
                raise ValueError(f"stateremat.reference.Program: view {v.name!r} ends at byte {end}, "
                                 f"storage has {self.nbytes}. Tip: shorten it or add a region.")
        vs = self._views
        if self.loss_view not in vs or vs[self.loss_view].dtype != "f8":
            raise ValueError(f"stateremat.reference.Program: loss_view {self.loss_view!r} must be an f8 view")
        for k, op in enumerate(self.ops):
            where = f"stateremat.reference.Program op {k} ({op.kind})"
            if op.kind not in ARITY:
                raise ValueError(f"{where}: unknown kind; expected one of {sorted(ARITY)}")
            if len(op.srcs) != ARITY[op.kind] or len(op.coef) != N_COEF[op.kind]:
                raise ValueError(f"{where}: expected {ARITY[op.kind]} srcs and {N_COEF[op.kind]} "
                                 f"coefs, got {len(op.srcs)} and {len(op.coef)}")
            for n in (op.dst, *op.srcs) + ((op.index,) if op.index else ()):
                if n not in vs:
                    raise ValueError(f"{where}: unknown view {n!r}")
            is_int = op.kind in INT_KINDS
            if (vs[op.dst].dtype in FLOAT_CODES) == is_int:
                raise ValueError(f"{where}: destination {op.dst!r} has dtype {vs[op.dst].dtype}, "
                                 f"which does not fit an {'integer' if is_int else 'float'} kind")
            if op.mode not in MODES or (op.mode == "map") != (op.index is None):
                raise ValueError(f"{where}: mode must be one of {MODES}, with index only for "
                                 f"gather/scatter; got mode={op.mode!r} index={op.index!r}")
            if op.index and vs[op.index].dtype in FLOAT_CODES:
                raise ValueError(f"{where}: index view {op.index!r} must be an integer view")
            n_el = vs[op.index].length if op.index else vs[op.dst].length
            want = {"map": vs[op.dst].length, "gather": None, "scatter": n_el}[op.mode]
            if want is not None and any(vs[s].length != want for s in op.srcs):
                raise ValueError(f"{where}: operand views need length {want} in mode {op.mode}, "
                                 f"got {[vs[s].length for s in op.srcs]}")
            if op.mode == "gather" and vs[op.index].length != vs[op.dst].length:
                raise ValueError(f"{where}: gather index length {vs[op.index].length} != "
                                 f"destination length {vs[op.dst].length}")
        return self
