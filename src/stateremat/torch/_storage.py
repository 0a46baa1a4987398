"""Storage identity, raw byte views and written-byte runs of in-place writes (R1, R2, R6).

A declared tensor is tracked at the level of its *storage*: every view of it shares the
bytes, so restoring bytes restores every alias (R2). Writes are described as sorted,
disjoint byte runs ``[lo, hi)`` inside the storage, rounded out to the journal granularity.
"""
from __future__ import annotations

import numpy as np
import torch

StorageKey = tuple[str, int, int]

#: Index-style writes whose destination is a subset of ``self`` given by index tensors.
_INDEX_DIM_OPS = {"index_copy_", "index_add_", "index_fill_", "index_copy", "index_add", "index_fill"}
#: Past this many touched elements we fall back to the conservative full extent.
_MAX_ENUMERATED_ELEMENTS = 1 << 22


def gather(flat: torch.Tensor, runs: np.ndarray) -> torch.Tensor:
    """Copy the bytes of ``runs`` (shape ``(n, 2)``) out of ``flat`` into one ``uint8`` tensor."""
    if runs.shape[0] == 1:
        return flat[int(runs[0, 0]) : int(runs[0, 1])].clone()
    if runs.shape[0] <= 32:
        return torch.cat([flat[int(a) : int(b)] for a, b in runs])
    ch = _chunks(runs, flat.numel())
    if ch is None:
        return flat.index_select(0, _byte_index(runs, flat.device))
    ids, c, full, tail = ch
    rows = flat[:full].view(-1, c).index_select(0, ids.to(flat.device)).reshape(-1)
    return torch.cat([rows, flat[full:]]) if tail else rows


def scatter(flat: torch.Tensor, runs: np.ndarray, data: torch.Tensor) -> None:
    """Write ``data`` (as produced by :func:`gather`) back into ``flat`` at ``runs``."""
    if runs.shape[0] <= 32:
        off = 0
        for a, b in runs:
            n = int(b - a)
            flat[int(a) : int(b)].copy_(data[off : off + n])
            off += n
        return
    ch = _chunks(runs, flat.numel())
    if ch is None:
        flat.index_copy_(0, _byte_index(runs, flat.device), data)
        return
    ids, c, full, tail = ch
    k = ids.numel() * c
    flat[:full].view(-1, c).index_copy_(0, ids.to(flat.device), data[:k].view(-1, c))
    if tail:
        flat[full:].copy_(data[k:])


#: Smallest common chunk worth a row-wise copy (below it, per-byte indexing is as good).
_MIN_CHUNK = 256


def _chunks(runs: np.ndarray, n: int):
    """Runs whose boundaries share a chunk size ``c`` as row ids of ``flat[:full].view(-1, c)``.

    Region-journal runs are granularity-aligned (:func:`round_runs`), so one row copy replaces
    ``c`` byte-index entries. Returns ``(ids, c, full, tail)`` — ``full = n // c * c`` and
    ``tail``: the last run also covers the partial chunk ``[full, n)`` — or None when the runs
    share no chunk of at least :data:`_MIN_CHUNK` bytes.
    """
    b = runs.reshape(-1)
    inner = b[b != n]
    c = int(np.gcd.reduce(inner)) if inner.size else 0
    if c < _MIN_CHUNK:
        return None
    full = n // c * c
    ids = _run_ids(np.minimum(runs, full), c)
    return torch.from_numpy(ids), c, full, bool(full < n and runs[-1, 1] == n)


def _byte_index(runs: np.ndarray, device: torch.device) -> torch.Tensor:
    """Every byte offset covered by ``runs`` (shape ``(n, 2)``), in run order, as an int64 tensor."""
    lengths = runs[:, 1] - runs[:, 0]
    starts = runs[:, 0] - np.concatenate([[0], np.cumsum(lengths)[:-1]])
    idx = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts, lengths)
    return torch.from_numpy(idx).to(device)


def _run_ids(runs: np.ndarray, c: int) -> np.ndarray:
    """Ids of the ``c``-byte chunks covered by ``c``-aligned runs, in run order (int64)."""
    lo = runs[:, 0] // c
    lengths = -(-runs[:, 1] // c) - lo
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(
        lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)



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
    lo, hi = byte_extent(t)
    if t.numel() == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if t.numel() * t.element_size() == hi - lo or t.numel() > _MAX_ENUMERATED_ELEMENTS:
        return np.array([[lo, hi]], dtype=np.int64)
    starts, run = _element_runs(list(t.shape), list(t.stride()), t.element_size())
    return merge_runs(lo + starts, lo + starts + run)


def _index_runs(self_t: torch.Tensor, dim: int, index: torch.Tensor) -> np.ndarray | None:
    """Byte runs written by an index-along-``dim`` write (``index_copy_``, ``index_put_`` on one dim)."""
    if index.numel() * (self_t.numel() // max(self_t.shape[dim], 1)) > _MAX_ENUMERATED_ELEMENTS:
        return None
    item = self_t.element_size()
    dim = dim % max(self_t.dim(), 1)
    idx = index.detach().reshape(-1).to("cpu", torch.int64).numpy() % max(self_t.shape[dim], 1)
    rest_shape = [s for d, s in enumerate(self_t.shape) if d != dim]
    rest_stride = [st for d, st in enumerate(self_t.stride()) if d != dim]
    starts, run = _element_runs(rest_shape, rest_stride, item)
    base = self_t.storage_offset() * item + np.unique(idx) * (self_t.stride(dim) * item)
    all_starts = (base[:, None] + starts[None, :]).reshape(-1)
    return merge_runs(all_starts, all_starts + run)


def write_runs(func: torch._ops.OpOverload, args: tuple, kwargs: dict, written: torch.Tensor) -> np.ndarray:
    """Byte runs of ``written``'s storage that ``func`` may write, conservative where unsure.

    Index writes (``index_put_`` with one leading index tensor, ``index_copy_``/``index_add_``/
    ``index_fill_``) are resolved to the indexed rows; every other write is the full set of
    elements of the written view (exact for slices and strided views).
    """
    name = func._schema.name.split("::")[-1]
    if args and args[0] is written:
        if name in _INDEX_DIM_OPS and len(args) >= 3:
            runs = _index_runs(written, int(args[1]), args[2])
            if runs is not None:
                return runs
        if name in ("index_put_", "index_put", "_index_put_impl_") and len(args) >= 2:
            indices = list(args[1])
            if (
                len(indices) == 1
                and isinstance(indices[0], torch.Tensor)
                and indices[0].dtype in (torch.int64, torch.int32)
                and written.dim() >= 1
            ):
                runs = _index_runs(written, 0, indices[0])
                if runs is not None:
                    return runs
    return view_runs(written)
