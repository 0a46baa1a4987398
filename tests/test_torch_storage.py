"""Written-byte runs of in-place writes equal the bytes that actually change (R6 journal extents)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stateremat.torch._mode import written_tensors
from stateremat.torch._storage import flat_bytes, round_runs, write_runs


def _changed_bytes(base: torch.Tensor, write) -> set[int]:
    flat = flat_bytes(base)
    before = flat.clone()
    write()
    return set(np.flatnonzero((flat != before).numpy()).tolist())


def _covered(runs: np.ndarray) -> set[int]:
    return {b for lo, hi in runs for b in range(int(lo), int(hi))}


def _runs_of(func, args, kwargs=None):
    kwargs = kwargs or {}
    (w,) = written_tensors(func, args, kwargs)
    return write_runs(func, args, kwargs, w)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_strided_view_runs_are_exact(data):
    base = torch.zeros(6, 7, 5, dtype=torch.float32)
    sl = []
    for size in base.shape:
        a = data.draw(st.integers(0, size - 1))
        b = data.draw(st.integers(a + 1, size))
        step = data.draw(st.integers(1, 3))
        sl.append(slice(a, b, step))
    view = base[tuple(sl)]
    if data.draw(st.booleans()) and view.dim() >= 2:
        view = view.transpose(0, 1)
    runs = _runs_of(torch.ops.aten.fill_.Scalar, (view, 1.1))
    changed = _changed_bytes(base, lambda: view.fill_(1.1))  # 1.1 has no zero byte
    assert _covered(runs) == changed


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.integers(0, 31), min_size=1, max_size=6), dim=st.sampled_from([0, 1]))
def test_index_copy_runs_cover_exactly_the_indexed_rows(rows, dim):
    base = torch.zeros(32, 32, dtype=torch.float64)
    idx = torch.tensor(sorted(set(rows)))
    src = torch.full((len(idx), 32) if dim == 0 else (32, len(idx)), 1.1, dtype=torch.float64)
    args = (base, dim, idx, src)
    runs = _runs_of(torch.ops.aten.index_copy_.default, args)
    changed = _changed_bytes(base, lambda: base.index_copy_(*args[1:]))
    assert _covered(runs) == changed


def test_index_put_with_row_indices_and_granularity_rounding():
    base = torch.zeros(1024, 256)  # 1 KiB rows
    idx = torch.tensor([3, 700])
    runs = _runs_of(torch.ops.aten.index_put_.default, (base, [idx], torch.ones(2, 256)))
    assert runs.tolist() == [[3 * 1024, 4 * 1024], [700 * 1024, 701 * 1024]]
    assert round_runs(runs, 4096, base.numel() * 4).tolist() == [[0, 4096], [175 * 4096, 176 * 4096]]


def test_batch_norm_hidden_writes_are_listed():
    x = torch.randn(8, 3)
    rm, rv = torch.zeros(3), torch.ones(3)
    args = (x, None, None, rm, rv, True, 0.1, 1e-5)
    assert [t is rm or t is rv for t in written_tensors(torch.ops.aten.native_batch_norm.default, args, {})] == [True, True]
    eval_args = args[:5] + (False,) + args[6:]
    assert written_tensors(torch.ops.aten.native_batch_norm.default, eval_args, {}) == []


@pytest.mark.parametrize("n", [120, 121, 4096 + 13])
@pytest.mark.parametrize("k", [3, 5, 40])
def test_gather_and_scatter_take_runs_in_any_order(n, k):
    # the journal gathers pieces out of concatenated entries in owner order, not address order
    from stateremat.torch._storage import gather, scatter

    rng = np.random.default_rng(n * k)
    bounds = np.sort(rng.choice(np.arange(1, n), size=2 * k - 1, replace=False))
    runs = np.stack([np.r_[0, bounds][0::2], np.r_[bounds, n][0::2]], axis=1)[:k]
    runs[-1, 1] = n  # one run ends at the (odd-sized) end
    runs = runs[rng.permutation(len(runs))]
    flat = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
    got = gather(flat, runs)
    assert torch.equal(got, torch.cat([flat[a:b] for a, b in runs]))
    out = torch.zeros(n, dtype=torch.uint8)
    scatter(out, runs, got)
    mask = torch.zeros(n, dtype=torch.bool)
    for a, b in runs:
        mask[a:b] = True
    assert torch.equal(out[mask], flat[mask]) and not out[~mask].any()


@pytest.mark.parametrize("run_bytes", [4, 100, 512, 4096, 40000])
@pytest.mark.parametrize("k", [5, 33])
def test_gather_and_scatter_agree_on_both_copy_paths(run_bytes, k, monkeypatch):
    # long runs copy slice by slice through NumPy views, short ones by one indexed copy: same bytes
    from stateremat.torch import _storage

    rng = np.random.default_rng(run_bytes + k)
    n = 2 * k * run_bytes + 7
    starts = np.sort(rng.choice(2 * k, size=k, replace=False)) * run_bytes + rng.integers(0, 3)
    runs = np.stack([starts, starts + run_bytes - rng.integers(0, 2, k)], axis=1)
    runs = runs[rng.permutation(k)]
    flat = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
    results = {}
    for path in (True, False):
        monkeypatch.setattr(_storage, "_by_slices", lambda f, r, path=path: path)
        got = _storage.gather(flat, runs)
        assert torch.equal(got, torch.cat([flat[a:b] for a, b in runs])), path
        out = torch.zeros(n, dtype=torch.uint8)
        _storage.scatter(out, runs, got)
        results[path] = out
    assert torch.equal(results[True], results[False])
    mask = torch.zeros(n, dtype=torch.bool)
    for a, b in runs:
        mask[a:b] = True
    assert torch.equal(results[True][mask], flat[mask]) and not results[True][~mask].any()
    monkeypatch.undo()
    assert _storage._by_slices(flat, runs) == bool((runs[:, 1] - runs[:, 0]).mean() >= _storage.SLICE_RUN_BYTES)
