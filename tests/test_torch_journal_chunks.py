"""Fast paths of the region journal's copies and restore (issue 26): chunk-wise ``B0`` of short-run
entries (:meth:`Journal._restore_chunks`, its disjoint, little-overlap and much-overlap branches)
and the indexed copies of ``c``-byte rows (:func:`gather_chunks`/:func:`scatter_chunks`: NumPy
void items on the host, the widest integer rows on the device path), each against a byte-by-byte
reference on both the host and the device path (``HOST_READS_ON_CPU`` False), and end to end
with storages above the whole-snapshot threshold written by several segments (overlapping rows,
nested segments, writes after the segments before the backward).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from stateremat.torch import _storage, checkpoint
from stateremat.torch._preserve import region
from stateremat.torch._preserve.region import Journal, _Entry
from stateremat.torch._storage import chunk_runs, first_chunks, gather, gather_chunks, merge_runs, scatter, \
    scatter_chunks
from stateremat.torch._txn import SMALL_STORAGE_BYTES


@pytest.fixture(params=["host", "device_path"])
def path(request, monkeypatch):
    """Both copy paths on CPU: NumPy (host-readable) and torch index ops (the device path)."""
    monkeypatch.setattr(_storage, "HOST_READS_ON_CPU", request.param == "host")
    return request.param


def _bytes(rng, n: int) -> torch.Tensor:
    return torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))


@pytest.mark.parametrize("c", [1, 2, 4, 8, 12, 32, 4096])
@pytest.mark.parametrize("misaligned", [False, True])
def test_chunk_copies_move_exactly_the_chunks(c, misaligned, path):
    """Gather then scatter of random chunk ids (unsorted, so order matters) equals slice copies;
    ``misaligned``: the data tensor starts at an odd address (byte rows, no wide view)."""
    rng = np.random.default_rng(c)
    flat = _bytes(rng, 64 * c + 3)  # (an odd tail: rows of the first 64 * c bytes only)
    ids = rng.permutation(64)[:40].astype(np.int64)
    got = gather_chunks(flat, ids, c)
    want = torch.cat([flat[i * c:(i + 1) * c] for i in ids])
    assert torch.equal(got, want)
    data = _bytes(rng, 40 * c + 1)
    data = data[1:] if misaligned else data[:-1]
    ref = flat.clone()
    for k, i in enumerate(ids):
        ref[i * c:(i + 1) * c] = data[k * c:(k + 1) * c]
    scatter_chunks(flat, torch.from_numpy(ids), c, data)
    assert torch.equal(flat, ref)


def test_chunk_runs_and_first_chunks():
    runs = np.array([[0, 8], [16, 24], [8, 16], [32, 40], [16, 24]], dtype=np.int64)  # 3 entries' runs
    ids, uniq, first = first_chunks(runs, 8)
    assert ids.tolist() == [0, 2, 1, 4, 2]
    assert uniq.tolist() == [0, 1, 2, 4] and first.tolist() == [0, 2, 1, 3]  # chunk 2: its first cover
    assert chunk_runs(uniq, 8).tolist() == [[0, 24], [32, 40]]


def _entries(rng, flat: torch.Tensor, c: int, writes: int, rows: int, per_write: int):
    """Record ``writes`` entries of random ``c``-byte rows (drawn from ``rows``) and write random
    bytes there; returns the entries and the bytes before each write."""
    history, entries = [flat.clone()], []
    for k in range(writes):
        r = np.unique(rng.integers(0, rows, per_write))
        runs = merge_runs(r * c, r * c + c)
        entries.append(_Entry(k, runs, gather(flat, runs)))
        scatter(flat, runs, _bytes(rng, int((runs[:, 1] - runs[:, 0]).sum())))
        history.append(flat.clone())
    return entries, history


@pytest.mark.parametrize("case", ["disjoint", "little_overlap", "much_overlap"])
@pytest.mark.parametrize("c", [4, 32, 24])
def test_restore_chunks_equals_undoing_newest_first(case, c, path):
    """Each branch of ``_restore_chunks``: every byte back to its first entry's old value, the
    visible bytes those before the restore, and reinstating them gives the bytes after."""
    rng = np.random.default_rng(7)
    rows = 4000
    flat = _bytes(rng, rows * c + 5)
    if case == "disjoint":  # strided rows, a different phase per write (the recurrence)
        history, entries = [flat.clone()], []
        for k in range(6):
            r = np.arange(k, rows, 10)
            runs = merge_runs(r * c, r * c + c)
            entries.append(_Entry(k, runs, gather(flat, runs)))
            scatter(flat, runs, _bytes(rng, r.size * c))
            history.append(flat.clone())
    elif case == "little_overlap":
        entries, history = _entries(rng, flat, c, 12, rows, 300)
    else:
        entries, history = _entries(rng, flat, c, 12, 40, 30)
    runs = np.concatenate([e.runs for e in entries])
    ids, uniq, _ = first_chunks(runs, c)
    sizes = sum(e.old.numel() for e in entries) // c
    branch = "disjoint" if uniq.size == ids.size else "little_overlap" if sizes <= 2 * uniq.size else "much_overlap"
    assert branch == case
    for start in (0, 3):
        work = history[-1].clone()
        before = work.clone()
        restored = Journal._restore_chunks(work, entries[start:], np.concatenate([e.runs for e in entries[start:]]), c)
        assert torch.equal(work, history[start])
        assert torch.equal(restored.visible, gather(before, restored.runs))
        scatter(work, restored.runs, restored.visible)
        assert torch.equal(work, before)


class _Spy:
    def __init__(self, monkeypatch):
        self.calls = 0
        real = Journal._restore_chunks

        def spy(flat, entries, runs, c):
            self.calls += 1
            return real(flat, entries, runs, c)

        monkeypatch.setattr(Journal, "_restore_chunks", staticmethod(spy))


def _chain(buf: torch.Tensor, w: torch.Tensor, wrap, nested: bool) -> torch.Tensor:
    """Six segments, each reading the buffer and writing random rows of it with ``index_copy_`` (host
    path) and every third row (overlapping); eager writes between; the last two nested in an outer one."""
    g = torch.Generator().manual_seed(3)
    plan = [torch.randint(buf.shape[0], (40,), generator=g).unique() for _ in range(6)]

    def seg(w, i):
        idx = plan[i]
        y = (w * (i + 1) * buf.clone()).sin().sum()  # reads B0
        if _storage.HOST_READS_ON_CPU:  # (on the device path an index write is journaled by elements)
            buf.index_copy_(0, idx, (buf.index_select(0, idx) * w.detach() + i).cos())
        buf[i % 3::3].mul_(0.5 + i)  # strided rows: segments i and i + 3 overlap
        return y + (w * buf.clone()).cos().sum()  # reads the written state

    total = torch.zeros((), dtype=buf.dtype)
    for i in range(4):
        total = total + (wrap(seg, w, i) if wrap else seg(w, i))
        buf[i * 3: i * 3 + 2].mul_(1.5)  # an eager write between segments
    if nested and wrap:
        def outer(w):
            return wrap(seg, w, 4) + wrap(seg, w, 5)

        total = total + wrap(outer, w, None)
    else:
        total = total + seg(w, 4) + seg(w, 5) if not wrap else total + wrap(seg, w, 4) + wrap(seg, w, 5)
    buf[::4].fill_(2.0)  # written after every segment, before the backward: reinstated after each replay
    return total


@pytest.mark.parametrize("nested", [False, True])
def test_region_chain_above_threshold_equals_eager(nested, path, monkeypatch):
    """A float64 buffer above ``SMALL_STORAGE_BYTES`` (journaled at the default threshold) whose
    rows several segments overwrite: gradients and the final buffer equal eager execution bit for
    bit, and the chunk-wise restore ran."""
    rows, width = 2 * SMALL_STORAGE_BYTES // 64 + 8, 8
    init = torch.randn(rows, width, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w_ref = torch.ones((), dtype=torch.float64, requires_grad=True)
    buf_ref = init.clone()
    _chain(buf_ref, w_ref, None, nested).backward()

    buf = init.clone()
    w = torch.ones((), dtype=torch.float64, requires_grad=True)

    def wrap(fn, w, i):
        f = (lambda w: fn(w)) if i is None else (lambda w: fn(w, i))
        return checkpoint(f, w, state=[buf], preserve="region")

    spy = _Spy(monkeypatch)
    _chain(buf, w, wrap, nested).backward()
    assert spy.calls > 0
    assert torch.equal(w.grad, w_ref.grad)
    assert torch.equal(buf, buf_ref)
    assert region  # (the module under test)
