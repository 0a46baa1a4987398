"""Storage identity, raw byte views and written-byte runs of in-place writes (R1, R2, R6).

A declared tensor is tracked at the level of its *storage*: every view of it shares the
bytes, so restoring bytes restores every alias (R2). Writes are described as sorted,
disjoint byte runs ``[lo, hi)`` inside the storage: exactly the elements an op writes where
its arguments say which (index, scatter and mask writes), the written view's elements
otherwise. This module is the run algebra of the region journal (merge, subtract, gather,
scatter).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

StorageKey = tuple[str, int, int]

#: Index-style writes whose destination is a subset of ``self`` given by index tensors.
_INDEX_DIM_OPS = {"index_copy_", "index_add_", "index_fill_", "index_copy", "index_add", "index_fill"}
#: Past this many touched elements we fall back to the conservative full extent.
_MAX_ENUMERATED_ELEMENTS = 1 << 22


#: CPU tensors may have their values read on the host (exact index runs, byte fingerprints, NumPy
#: slice copies): a CPU tensor has no stream to wait for. Every other tensor takes the device path,
#: which reads no value on the host, so a training step on an accelerator never synchronizes its
#: stream for the library (issue 26; ``tests/test_torch_no_sync.py`` sets this False to prove the
#: device path on CPU).
HOST_READS_ON_CPU = True


def host_readable(t: torch.Tensor) -> bool:
    """May the library read ``t``'s values on the host without synchronizing a device stream?"""
    return HOST_READS_ON_CPU and t.device.type == "cpu"


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (a host tensor the library made) on ``device`` without waiting for the device's stream."""
    if t.device == device:
        return t
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def gather(flat: torch.Tensor, runs: np.ndarray) -> torch.Tensor:
    """Copy the bytes of ``runs`` (shape ``(n, 2)``) out of ``flat`` into one ``uint8`` tensor."""
    n = runs.shape[0]
    if n == 0:
        return flat.new_empty(0)
    if n == 1:
        return flat[int(runs[0, 0]) : int(runs[0, 1])].clone()
    if n <= _FEW_RUNS:
        return torch.cat([flat[int(a) : int(b)] for a, b in runs])
    if _by_slices(flat, runs):
        a = flat.numpy()
        return torch.from_numpy(np.concatenate([a[lo:hi] for lo, hi in runs.tolist()]))
    ids, c = _chunks(runs)
    return gather_chunks(flat, ids, c)


def scatter(flat: torch.Tensor, runs: np.ndarray, data: torch.Tensor) -> None:
    """Write ``data`` (as produced by :func:`gather`) back into ``flat`` at ``runs``."""
    n = runs.shape[0]
    if n == 0:
        return
    if n <= _FEW_RUNS:
        off = 0
        for a, b in runs:
            k = int(b - a)
            flat[int(a) : int(b)].copy_(data[off : off + k])
            off += k
        return
    if _by_slices(flat, runs):
        a, d, off = flat.numpy(), data.numpy(), 0
        for lo, hi in runs.tolist():
            a[lo:hi] = d[off : off + hi - lo]
            off += hi - lo
        return
    ids, c = _chunks(runs)
    scatter_chunks(flat, ids, c, data)


def _wide(c: int, *ts: torch.Tensor) -> torch.dtype:
    """The widest integer dtype whose size divides ``c`` and every ``ts``' address: an indexed copy
    of byte rows moves one byte per element (about 1 GB/s for 32-byte rows), of int64 rows 4-8x that."""
    for dt, w in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if c % w == 0 and all(t.data_ptr() % w == 0 for t in ts):
            return dt
    return torch.uint8


def _rows(t: torch.Tensor, c: int, dt: torch.dtype) -> torch.Tensor:
    """1-D ``uint8`` ``t`` (``c`` dividing its length) as rows of ``c`` bytes of ``dt`` elements."""
    return t.view(dt).view(-1, c // dt.itemsize)


def _voids(t: torch.Tensor, c: int) -> np.ndarray:
    """A host ``uint8`` tensor as a NumPy array of ``c``-byte items (shares memory): NumPy's
    fancy indexing copies each item with one ``memcpy`` (8-20 GB/s for 32-byte rows)."""
    return t.numpy().view(np.dtype((np.void, c)))


def gather_chunks(flat: torch.Tensor, ids: torch.Tensor | np.ndarray, c: int) -> torch.Tensor:
    """The ``c``-byte chunks ``ids`` of ``flat`` (1-D ``uint8``), concatenated in ``ids`` order."""
    rows = flat[: flat.numel() // c * c]
    if host_readable(flat):
        ids = ids.numpy() if isinstance(ids, torch.Tensor) else ids
        return torch.from_numpy(np.take(_voids(rows, c), ids).view(np.uint8))
    ids = torch.from_numpy(ids) if isinstance(ids, np.ndarray) else ids
    out = _rows(rows, c, _wide(c, rows)).index_select(0, to_device(ids, flat.device))
    return out.view(torch.uint8).reshape(-1)


def scatter_chunks(flat: torch.Tensor, ids: torch.Tensor | np.ndarray, c: int, data: torch.Tensor) -> None:
    """Write ``data`` (``len(ids) * c`` bytes, as :func:`gather_chunks` returns) to the chunks ``ids``."""
    rows = flat[: flat.numel() // c * c]
    if host_readable(flat) and host_readable(data):
        ids = ids.numpy() if isinstance(ids, torch.Tensor) else ids
        _voids(rows, c)[ids] = _voids(data.contiguous(), c)
        return
    ids = torch.from_numpy(ids) if isinstance(ids, np.ndarray) else ids
    d = data.contiguous()
    dt = _wide(c, rows, d)
    _rows(rows, c, dt).index_copy_(0, to_device(ids, flat.device), _rows(d, c, dt))


def chunk_runs(ids: np.ndarray, c: int) -> np.ndarray:
    """Sorted unique chunk ids as sorted disjoint byte runs (adjacent chunks merged), shape ``(n, 2)``."""
    if ids.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    new = np.ones(ids.size, dtype=bool)
    new[1:] = ids[1:] != ids[:-1] + 1
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, ids.size - 1)
    return np.stack([ids[first] * c, (ids[last] + 1) * c], axis=1).astype(np.int64)


def first_chunks(runs: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chunks of ``c``-aligned ``runs`` (shape ``(n, 2)``: several entries' sorted disjoint
    runs, concatenated oldest entry first), and which of them is the *first* to cover each chunk.

    Returns ``(ids, uniq, first)``: ``ids`` the chunk ids of ``runs`` in run order (the order of
    the entries' concatenated bytes), ``uniq`` their sorted unique values and ``first`` (int64)
    for each the position in ``ids`` of its first occurrence (the oldest entry's). One stable sort
    (``np.unique`` with ``return_index``): O(m log m) in the ``m`` chunks, no Python per run.
    """
    ids = _run_ids(runs, c) if runs.shape[0] else np.zeros(0, np.int64)
    uniq, first = np.unique(ids, return_index=True)
    return ids, uniq, first.astype(np.int64)


#: Mean run length (bytes) from which a CPU journal copies run by run through NumPy views: about
#: 0.3 us a run, so 4 KiB runs copy at ~10 GB/s where an indexed copy of byte rows reaches
#: 0.5-1.7 GB/s (benchmarks/bench_journal.py prints bytes/s). Shorter runs (scattered
#: elements) keep the one indexed copy, which costs no Python per run.
SLICE_RUN_BYTES = 512


def _by_slices(flat: torch.Tensor, runs: np.ndarray) -> bool:
    """Copy ``runs`` one slice each, in NumPy (CPU storages whose runs are long on average)?"""
    return host_readable(flat) and int(runs[:, 1].sum() - runs[:, 0].sum()) >= SLICE_RUN_BYTES * runs.shape[0]


#: Up to this many runs, one slice copy per run; beyond, one indexed copy of common-size chunks.
_FEW_RUNS = 4


def common_chunk(runs: np.ndarray) -> int:
    """The largest power of two (bytes) dividing every bound of ``runs``: one bitwise OR over the
    bounds (15x less than their gcd on 64K bounds, a few us against 150). Element-scattered
    writes of float32 share ``4``; 32-byte rows ``32``; granularity-rounded runs the granularity's
    power-of-two factor (a run that ends at a storage's odd-sized end brings it down with it)."""
    v = int(np.bitwise_or.reduce(runs.reshape(-1))) if runs.size else 0
    return v & -v if v else 1


def _chunks(runs: np.ndarray) -> tuple[torch.Tensor, int]:
    """Runs (any order) as row ids of ``flat.view(-1, c)``, ``c`` their :func:`common_chunk`.

    Returns ``(ids, c)``; ``ids`` is int64, in run order.
    """
    c = common_chunk(runs)
    return torch.from_numpy(_run_ids(runs, c)), c


def _run_ids(runs: np.ndarray, c: int) -> np.ndarray:
    """Ids of the ``c``-byte chunks covered by ``c``-aligned runs, in run order (int64)."""
    lo = runs[:, 0] // c
    lengths = -(-runs[:, 1] // c) - lo
    if lengths.size and int(lengths.max()) == 1:  # one chunk a run (rows of one chunk): the ids are the starts
        return lo.astype(np.int64, copy=False)
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(
        lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)


def runs_within(runs: np.ndarray, cover: np.ndarray) -> bool:
    """True if every byte of ``runs`` lies inside ``cover`` (sorted disjoint runs, shape ``(n, 2)``)."""
    if runs.shape[0] == 0:
        return True
    if cover.shape[0] == 0:
        return False
    if cover.shape[0] == 1:  # the common case (a whole view restored): no numpy calls on tiny arrays
        lo, hi = cover[0].tolist()
        return lo <= int(runs[:, 0].min()) and int(runs[:, 1].max()) <= hi
    i = np.searchsorted(cover[:, 0], runs[:, 0], side="right") - 1
    return bool((i >= 0).all() and (runs[:, 1] <= cover[np.maximum(i, 0), 1]).all())


def run_bytes(runs: np.ndarray) -> int:
    """Total bytes covered by disjoint ``runs``."""
    return int((runs[:, 1] - runs[:, 0]).sum()) if runs.size else 0


def merge_close(runs: np.ndarray, gap_bytes: int) -> np.ndarray:
    """Merge sorted disjoint runs separated by fewer than ``gap_bytes`` bytes.

    A run costs 16 bytes of metadata (two int64), so bridging a gap below 16 bytes keeps fewer
    bytes in all: the journal's automatic granularity.
    """
    if runs.shape[0] <= 1:
        return runs
    gaps = runs[1:, 0] - runs[:-1, 1]
    new = np.ones(runs.shape[0], dtype=bool)
    new[1:] = gaps >= gap_bytes
    idx = np.flatnonzero(new)
    ends = np.append(runs[idx[1:] - 1, 1], runs[-1, 1])
    return np.stack([runs[idx, 0], ends], axis=1)


def _uniq(a: np.ndarray) -> np.ndarray:
    """Sorted unique values (faster than ``np.unique`` on the small arrays of a journal)."""
    a = np.sort(a.reshape(-1))
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def first_cover(runs: np.ndarray, owner_order: np.ndarray):
    """Split the union of ``runs`` into pieces, each taken from the earliest run covering it.

    Args:
        runs: ``(n, 2)`` byte runs, possibly overlapping (the runs of several journal entries).
        owner_order: ``(n,)`` int rank of each run (lower wins: the entry's age).

    Returns:
        ``(pieces, owner)``: sorted disjoint ``(m, 2)`` pieces covering the union, and for each
        the index of the run its bytes come from.
    """
    pts = _uniq(runs)
    a = np.searchsorted(pts, runs[:, 0])
    span = np.searchsorted(pts, runs[:, 1]) - a
    order = np.lexsort((np.arange(len(runs)), owner_order))[::-1]  # latest rank first: earliest assigned last
    span_o = span[order]
    total = int(span_o.sum())
    owner = np.full(max(len(pts) - 1, 0), -1, dtype=np.int64)
    if total:
        shift = np.repeat(a[order] - (np.cumsum(span_o) - span_o), span_o)
        owner[np.arange(total, dtype=np.int64) + shift] = np.repeat(order, span_o)
    valid = owner >= 0
    return np.stack([pts[:-1][valid], pts[1:][valid]], axis=1), owner[valid]


def fingerprint(t: torch.Tensor) -> tuple[int, ...] | torch.Tensor:
    """A cheap summary of ``t``'s bytes (changes with any realistic write; not a cryptographic hash).

    Three integer sums over the tensor's bytes viewed as words: all of them, every third and every
    seventh (so a permutation of values is seen unless it moves each word by a multiple of 21
    words: swapping two neighbouring float64 elements is seen). Allocates nothing of ``t``'s size.
    A tuple of ints where ``t`` is :func:`host_readable`; else the sums as an int64 tensor on
    ``t``'s device (nothing read on the host): compare with :func:`fingerprint_changed`.
    """
    with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
        b = t.detach().contiguous().view(-1).view(torch.uint8)
        w = b.view(torch.int32) if b.numel() % 4 == 0 else b
        sums = (w.sum(dtype=torch.int64), w[::3].sum(dtype=torch.int64), w[::7].sum(dtype=torch.int64))
        if not host_readable(t):
            return torch.stack(sums)
        return tuple(int(x) for x in sums)


def fingerprint_changed(t: torch.Tensor, before: tuple[int, ...] | torch.Tensor) -> bool | torch.Tensor:
    """Has ``t``'s :func:`fingerprint` changed since ``before``? A bool, or (device path, where
    ``before`` is a tensor) a 0-dim bool tensor on the device, to be read later."""
    now = fingerprint(t)
    if isinstance(before, torch.Tensor) != isinstance(now, torch.Tensor):
        return True  # (the tensor moved between host and device)
    if isinstance(now, torch.Tensor):
        with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
            return (now != before).any() if now.device == before.device else True
    return now != before


def storage_key(t: torch.Tensor) -> StorageKey:
    """Return a hashable identity of ``t``'s storage: ``(device type, index, data_ptr)``."""
    dev = t.device
    return (dev.type, -1 if dev.index is None else dev.index, t.untyped_storage().data_ptr())


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """Return a 1-D ``uint8`` tensor over all bytes of ``t``'s storage.

    Writes through it change the bytes every alias sees but bump neither ``t``'s version
    counter nor any alias's: used to restore and reinstate bytes (R2, R5).
    """
    st = t.untyped_storage()
    with torch.no_grad():
        return torch.empty(0, dtype=torch.uint8, device=t.device).set_(st, 0, (st.nbytes(),), (1,))


def byte_extent(t: torch.Tensor) -> tuple[int, int]:
    """Return the smallest byte range ``[lo, hi)`` of the storage that holds every element of ``t``."""
    item = t.element_size()
    lo = t.storage_offset() * item
    if t.numel() == 0:
        return lo, lo
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return lo, lo + span * item + item


def merge_runs(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Merge byte runs ``[starts[i], ends[i])`` into sorted disjoint runs, shape ``(n, 2)``."""
    if starts.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    e = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    out_e = np.append(e[idx[1:] - 1], e[-1])
    return np.stack([out_s, out_e], axis=1).astype(np.int64)


def round_runs(runs: np.ndarray, granularity_bytes: int, nbytes: int) -> np.ndarray:
    """Round runs outward to multiples of ``granularity_bytes`` (clipped to the storage) and merge."""
    if runs.size == 0:
        return runs
    g = granularity_bytes
    lo = (runs[:, 0] // g) * g
    hi = np.minimum(-(-runs[:, 1] // g) * g, nbytes)
    return merge_runs(lo, hi)


def _element_runs(shape: list[int], stride: list[int], item: int) -> tuple[np.ndarray, int]:
    """Element byte offsets (relative) of a strided block as runs: ``(run starts, run length)``."""
    dims = [(s, st) for s, st in zip(shape, stride) if s != 1]
    run = item
    if dims:
        dims.sort(key=lambda d: d[1], reverse=True)
        # Coalesce the innermost dims that are contiguous into one run.
        while dims and dims[-1][1] * item == run:
            run *= dims[-1][0]
            dims.pop()
    starts = np.zeros(1, dtype=np.int64)
    for size, st in dims:
        starts = (starts[:, None] + np.arange(size, dtype=np.int64)[None, :] * (st * item)).reshape(-1)
    return starts, run


def view_runs(t: torch.Tensor) -> np.ndarray:
    """Exact byte runs of the storage holding the elements of ``t``, shape ``(n, 2)``."""
    if t.is_contiguous():  # the common case: one run
        n = t.numel()
        if n == 0:
            return np.zeros((0, 2), dtype=np.int64)
        lo = t.storage_offset() * t.element_size()
        return np.array([[lo, lo + n * t.element_size()]], dtype=np.int64)
    lo, hi = byte_extent(t)
    if t.numel() == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if t.numel() * t.element_size() == hi - lo or t.numel() > _MAX_ENUMERATED_ELEMENTS:
        return np.array([[lo, hi]], dtype=np.int64)
    starts, run = _element_runs(list(t.shape), list(t.stride()), t.element_size())
    return merge_runs(lo + starts, lo + starts + run)


def _index_runs(self_t: torch.Tensor, dim: int, index: torch.Tensor) -> np.ndarray | None:
    """Byte runs written by an index-along-``dim`` write (``index_copy_``, ``index_put_`` on one dim)."""
    if self_t.dim() == 0:  # a 0-dim view: its one element (the full view)
        return None
    if index.numel() * (self_t.numel() // max(self_t.shape[dim], 1)) > _MAX_ENUMERATED_ELEMENTS:
        return None
    item = self_t.element_size()
    dim = dim % max(self_t.dim(), 1)
    idx = _np_index(index) % max(self_t.shape[dim], 1)
    rest_shape = [s for d, s in enumerate(self_t.shape) if d != dim]
    rest_stride = [st for d, st in enumerate(self_t.stride()) if d != dim]
    starts, run = _element_runs(rest_shape, rest_stride, item)
    base = self_t.storage_offset() * item + np.unique(idx) * (self_t.stride(dim) * item)
    all_starts = (base[:, None] + starts[None, :]).reshape(-1)
    return merge_runs(all_starts, all_starts + run)


def _np_index(index: torch.Tensor) -> np.ndarray:
    return index.detach().reshape(-1).to("cpu", torch.int64).numpy()


def _element_offsets(t: torch.Tensor, coords: list[np.ndarray]) -> np.ndarray:
    """Byte offsets in the storage of the elements of ``t`` at ``coords`` (one array per dim)."""
    item = t.element_size()
    off = np.full(coords[0].shape, t.storage_offset(), dtype=np.int64)
    for d, c in enumerate(coords):
        off += (c % max(t.shape[d], 1)) * t.stride(d)
    return off * item


def _runs_of(offsets: np.ndarray, item: int) -> np.ndarray:
    offsets = np.unique(offsets)
    return merge_runs(offsets, offsets + item)


def _scatter_runs(t: torch.Tensor, dim: int, index: torch.Tensor) -> np.ndarray | None:
    """``scatter_``-family: element ``p`` of ``index`` writes ``t[p with p[dim] = index[p]]``."""
    if index.numel() > _MAX_ENUMERATED_ELEMENTS or index.dim() != t.dim() or t.dim() == 0:
        return None
    dim = dim % t.dim()
    idx = index.detach().to("cpu", torch.int64).numpy()
    coords = [np.broadcast_to(np.arange(n).reshape([-1 if k == d else 1 for k in range(idx.ndim)]), idx.shape)
              for d, n in enumerate(idx.shape)]
    coords[dim] = idx
    return _runs_of(_element_offsets(t, [c.reshape(-1) for c in coords]).reshape(-1), t.element_size())


def _mask_runs(t: torch.Tensor, mask: torch.Tensor) -> np.ndarray | None:
    """``masked_fill_``/``masked_scatter_``: the elements where the broadcast mask is true."""
    if t.numel() > _MAX_ENUMERATED_ELEMENTS or mask.dtype != torch.bool:
        return None
    m = torch.broadcast_to(mask.detach().to("cpu"), t.shape).numpy()
    coords = [c.astype(np.int64) for c in np.nonzero(m)]
    if not coords or coords[0].size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    return _runs_of(_element_offsets(t, coords), t.element_size())


def _index_put_runs(t: torch.Tensor, indices: list) -> np.ndarray | None:
    """``index_put_`` with index tensors on the leading dims (broadcast together), the rest whole."""
    k = len(indices)
    if k == 0 or k > t.dim() or any(i is None for i in indices):
        return None
    if k == 1 and indices[0].dtype in (torch.int64, torch.int32):
        return _index_runs(t, 0, indices[0])
    expanded: list[torch.Tensor] = []
    for i in indices:
        if i.dtype == torch.bool and i.dim() == 0:  # selects everything (or nothing): the full view
            return None
        if i.dtype == torch.bool:  # a mask over as many dims as it has
            expanded.extend(torch.nonzero(i.detach().to("cpu"), as_tuple=True))
        elif i.dtype in (torch.int64, torch.int32):
            expanded.append(i.detach().to("cpu", torch.int64))
        else:
            return None
    if len(expanded) > t.dim():
        return None
    lead = [x.numpy().reshape(-1) for x in torch.broadcast_tensors(*expanded)]
    rest_shape, rest_stride = list(t.shape[len(lead):]), list(t.stride()[len(lead):])
    if lead[0].size * max(1, int(np.prod(rest_shape))) > _MAX_ENUMERATED_ELEMENTS:
        return None
    item = t.element_size()
    base = _element_offsets(t, lead)
    starts, run = _element_runs(rest_shape, rest_stride, item)
    all_starts = (np.unique(base)[:, None] + starts[None, :]).reshape(-1)
    return merge_runs(all_starts, all_starts + run)


_SCATTER_OPS = {"scatter_", "scatter_add_", "scatter_reduce_", "scatter", "scatter_add", "scatter_reduce"}
_MASK_OPS = {"masked_fill_", "masked_scatter_", "masked_fill", "masked_scatter"}
#: Ops whose written elements :func:`write_runs` resolves from their index/mask arguments.
_ELEMENT_OPS = _INDEX_DIM_OPS | _SCATTER_OPS | _MASK_OPS | {"index_put_", "index_put", "_index_put_impl_"}


def _indices_on_host(args: tuple) -> bool:
    """Are the index and mask tensors among ``args`` :func:`host_readable`? Resolving the elements
    an op writes reads them on the host; on the device path the written view is journaled instead."""
    for a in args[1:]:
        if isinstance(a, torch.Tensor):
            if not host_readable(a):
                return False
        elif type(a) in (list, tuple):
            if any(isinstance(x, torch.Tensor) and not host_readable(x) for x in a):
                return False
    return True


#: ATen op -> its base name (``aten::index_put_`` -> ``index_put_``).
_OP_NAMES: dict = {}


_INT_INDEX = (torch.int64, torch.int32)


class ElementWrite:
    """The elements a device-indexed write changes, kept on the device (no host read).

    An index, scatter or ``index_put_`` write whose index tensors are not :func:`host_readable`:
    the written view's geometry and a copy of the index tensors, so the journal keeps the old
    values of exactly the written elements (:meth:`read`) and puts them back (:meth:`write`)
    with device ops, newest entry first. ``bytes``: the index copies' device bytes.
    """

    __slots__ = ("kind", "dtype", "geometry", "dim", "index", "bytes")

    def __init__(self, kind: str, written: torch.Tensor, dim: int, index: Any) -> None:
        self.kind, self.dtype, self.dim = kind, written.dtype, dim
        self.geometry = (tuple(written.shape), tuple(written.stride()), written.storage_offset())
        with torch.no_grad():
            if kind == "put":
                self.index = tuple(i.detach().to(torch.int64, copy=True) for i in index)
                self.bytes = sum(i.numel() * i.element_size() for i in self.index)
            else:
                self.index = index.detach().to(torch.int64, copy=True)
                self.bytes = self.index.numel() * self.index.element_size()

    def view(self, flat: torch.Tensor) -> torch.Tensor:
        """The written view, rebuilt on ``flat``'s storage."""
        size, stride, offset = self.geometry
        with torch.no_grad():
            return torch.empty(0, dtype=self.dtype, device=flat.device).set_(
                flat.untyped_storage(), offset, size, stride)

    def read(self, flat: torch.Tensor) -> torch.Tensor:
        """The current values of the written elements (a new tensor)."""
        v = self.view(flat)
        if self.kind == "index":
            return v.index_select(self.dim, self.index)
        if self.kind == "scatter":
            return v.gather(self.dim, self.index)
        return v[self.index]

    def write(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Put ``values`` (as :meth:`read` returned them) back into the written elements."""
        v = self.view(flat)
        if self.kind == "index":
            v.index_copy_(self.dim, self.index, values)
        elif self.kind == "scatter":
            v.scatter_(self.dim, self.index, values)
        else:
            v.index_put_(self.index, values)


def element_write(func: torch._ops.OpOverload, args: tuple, written: torch.Tensor) -> ElementWrite | None:
    """An :class:`ElementWrite` for an index, scatter or integer ``index_put_`` write to ``written``
    whose index tensors are on a device (not :func:`host_readable`); None for every other write
    (masks and boolean indices among them: their written view is journaled)."""
    name = _OP_NAMES.get(func)
    if name is None:
        name = _OP_NAMES[func] = func._schema.name.split("::")[-1]
    if not args or args[0] is not written or name not in _ELEMENT_OPS or written.dim() == 0:
        return None
    if name in _INDEX_DIM_OPS and len(args) >= 3 and isinstance(args[2], torch.Tensor):
        idx = args[2]
        if idx.dtype in _INT_INDEX and idx.dim() <= 1 and not host_readable(idx):
            return ElementWrite("index", written, int(args[1]) % written.dim(), idx.reshape(-1))
    elif name in _SCATTER_OPS and len(args) >= 3 and isinstance(args[2], torch.Tensor):
        idx = args[2]
        if idx.dtype == torch.int64 and idx.dim() == written.dim() and not host_readable(idx):
            return ElementWrite("scatter", written, int(args[1]) % written.dim(), idx)
    elif name in ("index_put_", "index_put", "_index_put_impl_") and len(args) >= 2:
        ind = list(args[1])
        if ind and len(ind) <= written.dim() and all(isinstance(i, torch.Tensor) and i.dtype in _INT_INDEX
                                                     for i in ind) and not all(host_readable(i) for i in ind):
            return ElementWrite("put", written, 0, ind)
    return None


def write_runs(func: torch._ops.OpOverload, args: tuple, kwargs: dict, written: torch.Tensor) -> np.ndarray:
    """Byte runs of ``written``'s storage that ``func`` may write, exact where it can tell.

    Index writes (``index_copy_``/``index_add_``/``index_fill_``, ``index_put_`` with index
    tensors or masks on the leading dims, ``scatter_``/``scatter_add_``/``scatter_reduce_``,
    ``masked_fill_``/``masked_scatter_``) are resolved to the elements they write; every other
    write is the full set of elements of the written view (exact for slices and strided views).
    Index and mask tensors that are not :func:`host_readable` (on a device) are not read: the
    op's written view is journaled instead (a superset, computed from sizes, strides and offset
    alone), so a journaled write never waits for the device's stream.
    """
    name = _OP_NAMES.get(func)
    if name is None:
        name = _OP_NAMES[func] = func._schema.name.split("::")[-1]
    runs = None
    if args and args[0] is written and name in _ELEMENT_OPS and _indices_on_host(args):
        if name in _INDEX_DIM_OPS and len(args) >= 3:
            runs = _index_runs(written, int(args[1]), args[2])
        elif name in ("index_put_", "index_put", "_index_put_impl_") and len(args) >= 2:
            runs = _index_put_runs(written, list(args[1]))
        elif name in _SCATTER_OPS and len(args) >= 3 and isinstance(args[2], torch.Tensor):
            runs = _scatter_runs(written, int(args[1]), args[2])
        elif name in _MASK_OPS and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            runs = _mask_runs(written, args[1])
    return view_runs(written) if runs is None else runs
