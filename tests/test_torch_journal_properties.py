"""Property tests of the region journal against eager execution (issues 13.5 and 15).

Random chains of segments read a declared float64 buffer, write it with a random pattern
(contiguous rows, strided views, index_copy_/index_fill_, index_put_ with one or two index
tensors or a mask, scatter_/scatter_add_, masked_fill_, writes through views), and eager code
between segments writes it too (R6). For every journal granularity — automatic (exact bytes)
and rounded ones below and above the element size — the gradients and the final buffer equal
eager execution bit for bit, and the journal keeps no more than the bytes written plus 16
bytes of metadata per run (automatic granularity).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from _journal import JournalSpy, journal_every_storage
from stateremat.torch import checkpoint, preservation_stats, reset_preservation_stats
from stateremat.torch._preserve.region import Journal
from stateremat.torch._runtime import Runtime
from stateremat.torch._storage import gather, storage_key

D = torch.float64
#: patterns whose random mask may select no element
MAY_WRITE_NOTHING = {"mask_put", "masked_fill"}
PATTERNS = ["rows", "strided", "index_copy", "index_fill", "index_put", "index_put2", "mask_put",
            "scatter", "scatter_add", "masked_fill", "view"]


def _write(buf: torch.Tensor, pattern: str, g: np.random.Generator) -> None:
    r, c = buf.shape
    val = float(g.integers(1, 9)) / 4
    if pattern == "rows":
        a = int(g.integers(0, r))
        buf[a:a + int(g.integers(1, 3))] = val
    elif pattern == "strided":
        s = int(g.integers(2, 4))
        buf.view(-1)[int(g.integers(0, s))::s].mul_(1.5)
    elif pattern == "index_copy":
        idx = torch.from_numpy(g.choice(r, size=int(g.integers(1, r + 1)), replace=False))
        buf.index_copy_(0, idx, torch.full((len(idx), c), val, dtype=D))
    elif pattern == "index_fill":
        buf.index_fill_(1, torch.from_numpy(g.choice(c, size=int(g.integers(1, c + 1)), replace=False)), val)
    elif pattern == "index_put":
        buf[torch.from_numpy(g.integers(-r, r, size=3))] = val
    elif pattern == "index_put2":
        ii, jj = torch.from_numpy(g.integers(0, r, size=4)), torch.from_numpy(g.integers(0, c, size=4))
        buf[ii, jj] = torch.arange(4, dtype=D) + val
    elif pattern == "mask_put":
        buf[torch.from_numpy(g.random((r, c)) < 0.3)] = val
    elif pattern == "scatter":
        idx = torch.from_numpy(g.integers(0, c, size=(r, 1)))
        buf.scatter_(1, idx, torch.full((r, 1), val, dtype=D))
    elif pattern == "scatter_add":
        idx = torch.from_numpy(g.integers(0, r, size=(2, c)))
        buf.scatter_add_(0, idx, torch.ones(2, c, dtype=D))
    elif pattern == "masked_fill":
        buf.masked_fill_(torch.from_numpy(g.random(c) < 0.5), val)  # broadcast over rows
    else:  # a view taken inside the segment, written later
        v = buf.view(-1)[int(g.integers(0, r * c - 2)):]
        v[:2].add_(val)


def _run(plan, shape, wrap, granularity):
    """Forward/backward of a chain; ``plan`` is a list of (pattern, seed, outside pattern or None)."""
    w = torch.ones((), dtype=D, requires_grad=True)
    buf = torch.arange(shape[0] * shape[1], dtype=D).reshape(shape) / 7
    total = torch.zeros((), dtype=D)
    for i, (pattern, seed, outside) in enumerate(plan):
        def seg(w, pattern=pattern, seed=seed, i=i):
            y = (w * (i + 1) * buf.clone()).sin().sum()  # reads B0
            _write(buf, pattern, np.random.default_rng(seed))
            return y + (w * buf.clone()).cos().sum()  # reads the written state

        total = total + (wrap(seg, w, buf, granularity) if wrap else seg(w))
        if outside is not None:
            _write(buf, outside, np.random.default_rng(seed + 1))  # eager code between segments
    total.backward()
    return w.grad, buf


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PATTERNS), st.integers(0, 2**31),
                          st.one_of(st.none(), st.sampled_from(PATTERNS))), min_size=1, max_size=4),
       st.sampled_from([(5, 3), (8, 4), (3, 7)]),
       st.sampled_from([None, 1, 3, 8, 64, 4096]))
def test_region_replay_equals_eager_for_any_write_pattern_and_granularity(plan, shape, granularity):
    """Run twice: as is (the buffer, at most SMALL_STORAGE_BYTES, kept by a whole snapshot) and with
    the threshold lowered to 0, where the journal itself is built and replayed (asserted)."""
    g_ref, buf_ref = _run(plan, shape, None, None)
    wrap = lambda seg, w, buf, gran: checkpoint(seg, w, state=[buf], preserve="region", granularity_bytes=gran)
    g, buf = _run(plan, shape, wrap, granularity)
    assert torch.equal(g, g_ref)
    assert torch.equal(buf, buf_ref)
    with journal_every_storage(), JournalSpy() as spy:
        g, buf = _run(plan, shape, wrap, granularity)
    assert spy.journals > 0
    if any(p not in MAY_WRITE_NOTHING for p, _, _ in plan):
        assert spy.entries > 0
    assert torch.equal(g, g_ref)
    assert torch.equal(buf, buf_ref)


@pytest.mark.parametrize("pattern", ["contiguous", "strided", "scattered"])
def test_journal_keeps_the_written_bytes_plus_run_metadata(pattern, fresh_runtime):
    n = 1 << 14  # float32 elements
    buf = torch.zeros(n)
    g = torch.Generator().manual_seed(0)
    if pattern == "contiguous":
        idx = torch.arange(100, 100 + n // 100)
    elif pattern == "strided":
        idx = torch.arange(0, n, 7)
    else:
        idx = torch.sort(torch.randperm(n, generator=g)[: n // 100]).values
    w = torch.ones((), requires_grad=True)
    reset_preservation_stats()

    def seg(w):
        y = (w * buf).sum()
        buf.index_fill_(0, idx, 1.0)
        return y

    y = checkpoint(seg, w, state=[buf], preserve="region")
    kept = preservation_stats().journal_bytes
    written = 4 * len(idx)
    runs = 1 if pattern == "contiguous" else len(idx)
    assert written <= kept <= 1.1 * written + 16 * runs
    y.backward()
    assert preservation_stats().journal_bytes == 0  # pruned once nothing can replay


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_journal_restore_equals_undoing_every_later_write(data):
    """``Journal.restore`` (each byte from the first entry covering it) = undoing entries newest
    first, byte for byte; the visible bytes it returns are the bytes before the restore."""
    g = data.draw(st.sampled_from([None, 1, 8, 256, 4096]), label="granularity")
    n = data.draw(st.sampled_from([64 * 1024, 64 * 1024 + 100]), label="storage bytes")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    buf = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
    j = Journal(Runtime().acquire(storage_key(buf), buf), g)
    history = [buf.clone()]  # bytes before each write
    seqs = []
    for _ in range(data.draw(st.integers(1, 8), label="writes")):
        k = int(rng.integers(1, 80))  # up to 80 scattered runs: both gather/scatter paths
        starts = np.sort(rng.choice(n - 16, size=k, replace=False))
        runs = np.stack([starts, starts + rng.integers(1, 16, size=k)], axis=1).astype(np.int64)
        from stateremat.torch._storage import merge_runs

        runs = merge_runs(runs[:, 0], runs[:, 1])
        j.record(runs)
        seqs.append(j.entries[-1].seq)
        for a, b in runs:
            buf[a:b] = torch.from_numpy(rng.integers(0, 256, b - a, dtype=np.uint8))
        history.append(buf.clone())
    i = data.draw(st.integers(0, len(seqs) - 1), label="segment start")
    before = buf.clone()
    union, visible = j.restore(seqs[i])
    assert torch.equal(buf, history[i])  # B0 of a segment that started before write i
    assert torch.equal(visible, gather(before, union))
    changed = torch.nonzero(history[i] != before).flatten().numpy()
    covered = np.zeros(n, dtype=bool)
    for a, b in union:
        covered[a:b] = True
    assert covered[changed].all()  # every byte that changed is reinstated later
