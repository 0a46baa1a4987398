"""One focused test per kind of deliberate bug the suite used to miss (issue 27, item 5).

Each test here was checked against its bug: the bug put into the source on purpose, the test
run and seen to fail, the source restored and the test seen to pass (the commit that added the
test names the bug). Storages are above ``SMALL_STORAGE_BYTES`` (or the threshold is lowered
for the test) wherever the region journal is what is under test: a smaller storage is kept by a
whole snapshot under ``region`` and never builds a journal.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from _journal import JournalSpy
from stateremat.torch import UndeclaredStateError, checkpoint, is_replaying, preservation_stats
from stateremat.torch._txn import SMALL_STORAGE_BYTES

D = torch.float64
#: float64 elements of a storage journaled under region (above SMALL_STORAGE_BYTES)
BIG = SMALL_STORAGE_BYTES // 8 + 64
SIZES = {"small": 64, "journaled": BIG}


def _same(got, want) -> bool:
    return all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(got, want))


# --- the replay's bindings and a changed dtype ------------------------------------------------

@pytest.mark.parametrize("mode", ["whole", "region"])
@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("when", ["in_forward", "before_backward"])
@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("change", ["dtype", "dtype_and_offset"])
def test_a_tensor_reviewed_as_another_dtype_is_replayed_through_the_forwards_dtype(change, declared, when, size,
                                                                                    mode):
    """``q.data = q.data.view(torch.int64)`` (same bytes, offset, size and stride: only the dtype
    differs; or also a window further into the bytes) in the forward or before the backward: the
    replay must read ``q`` as the forward did, float64 from its start."""
    if change == "dtype_and_offset" and not declared and when == "in_forward":
        pytest.skip("an undeclared tensor moved within its bytes in the forward is refused (R7), by design")
    n = SIZES[size]

    def review(q):
        q.data = q.data.view(torch.int64) if change == "dtype" else q.data.view(torch.int64)[4:]

    def run(ckpt):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(n, dtype=D, generator=g)
        x = torch.randn(n, dtype=D, generator=g, requires_grad=True)

        def seg(x):
            y = (x * q.clone()).sin().sum()
            if when == "in_forward":
                review(q)
            return y

        y = seg(x) if ckpt is None else checkpoint(seg, x, state=[q] if declared else [], preserve=ckpt)
        if when == "before_backward":
            review(q)
        y.backward()
        return x.grad, q.dtype, q.shape, q.view(D).clone()

    assert _same(run(mode), run(None))


# --- an nn.RReLU segment runs its replay to the end ----------------------------------------------

@pytest.mark.parametrize("mode", ["whole", "region"])
@pytest.mark.parametrize("after", ["last", "then_linear"])
def test_an_rrelu_segment_replays_to_the_end(after, mode):
    """rrelu saves its noise tensor before filling it: a replay stopped early (at the last saved
    tensor) hands backward unfilled noise. The gradient must equal eager's, bit for bit."""
    def run(ckpt):
        torch.manual_seed(0)
        layers = [nn.RReLU(0.1, 0.3)] + ([nn.Linear(16, 16)] if after == "then_linear" else [])
        m = nn.Sequential(nn.Linear(16, 16), *layers).to(D).train()
        x = torch.randn(32, 16, dtype=D, requires_grad=True)
        c = torch.randn(32, 16, dtype=D)
        torch.manual_seed(1)
        y = m(x) if ckpt is None else checkpoint(m, x, state=[m], preserve=ckpt)
        torch.rand(64)  # draws between forward and backward: the replay must use the forward's
        (y * c).sum().backward()
        return x.grad, m[0].weight.grad

    assert _same(run(mode), run(None))


# --- norm statistics are kept whole at any size -------------------------------------------------

class _Log(torch.Tensor):
    """Its own ``__torch_function__`` runs every call itself (past stateremat's marks)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        return out.as_subclass(cls) if type(out) is torch.Tensor else out


@pytest.mark.parametrize("declare", ["module", "statistics"])
def test_large_norm_statistics_updated_past_the_handler_are_kept_whole_under_region(declare):
    """A handler-first subclass runs batch norm past the marks, and ``native_batch_norm`` bumps no
    version: a journal never sees the update. Running statistics above SMALL_STORAGE_BYTES must be
    kept by a whole snapshot under region too, or the replay updates them a second time."""
    c = SMALL_STORAGE_BYTES // 8 + 16  # float64 channels: each statistic above the threshold

    def run(mode):
        torch.manual_seed(0)
        bn = nn.BatchNorm1d(c).to(D)
        x = torch.randn(4, c, dtype=D).as_subclass(_Log).requires_grad_()
        state = [bn] if declare == "module" else [bn.running_mean, bn.running_var, bn.num_batches_tracked]
        out = bn(x) if mode == "eager" else checkpoint(bn, x, state=state, preserve=mode)
        (out.as_subclass(torch.Tensor) ** 2).sum().backward()
        return bn.running_mean.clone(), bn.running_var.clone(), x.grad.as_subclass(torch.Tensor)

    assert c * 8 > SMALL_STORAGE_BYTES
    assert _same(run("region"), run("eager"))


# --- a replay write outside the restored cover is undone -----------------------------------------

@pytest.mark.parametrize("where", ["untouched", "partly_covered"])
def test_a_replay_write_outside_the_restored_bytes_is_undone(where):
    """Only the replay writes ``q[lo:hi]`` (guarded by ``is_replaying()``): outside (or partly
    outside) the bytes the restore set aside, so the reinstatement does not overwrite it; the
    replay log must undo it. Afterwards ``q`` is what eager leaves."""
    lo, hi = (2000, 2010) if where == "untouched" else (105, 120)  # q[100:110] is written before backward

    def run(mode):
        q = torch.arange(BIG, dtype=D) / 7
        x = torch.randn(8, dtype=D, generator=torch.Generator().manual_seed(0), requires_grad=True)

        def seg(x):
            if is_replaying():  # (before the saved tensors: an early-stopped replay runs it)
                q[lo:hi].fill_(-5.0)  # scratch use of the buffer by the replay only
            y = (x * q[:8].clone()).sin().sum()
            q[:8].add_(1.0)
            return y

        y = seg(x) if mode == "eager" else checkpoint(seg, x, state=[q], preserve=mode)
        q[100:110].mul_(2.0)  # a write between forward and backward (journaled too)
        y.backward()
        return x.grad, q

    with JournalSpy() as spy:
        got = run("region")
    assert spy.entries > 0  # the journal was built (q is above SMALL_STORAGE_BYTES)
    assert _same(got, run("eager"))


# --- the direct-write fast path is not taken for a tensor that requires grad ---------------------

@pytest.mark.parametrize("op", ["add_", "mul_", "zero_", "copy_"])
def test_a_refused_write_to_a_declared_leaf_that_requires_grad_journals_nothing(op):
    """autograd refuses ``p.add_()`` on a leaf that requires grad before any kernel runs: nothing
    is written, so nothing may be journaled (the fast path records writes before the call)."""
    p = nn.Parameter(torch.ones(BIG, dtype=D))  # journaled under region
    x = torch.ones(3, dtype=D, requires_grad=True)
    calls = {"add_": lambda: p.add_(1.0), "mul_": lambda: p.mul_(2.0), "zero_": lambda: p.zero_(),
             "copy_": lambda: p.copy_(torch.zeros(BIG, dtype=D))}
    held = {}

    def f(x):
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            calls[op]()
        held["journal"] = preservation_stats().journal_bytes
        return (x * p[:3]).sum()

    before = preservation_stats().journal_bytes
    with JournalSpy() as spy:
        y = checkpoint(f, x, state=[p], preserve="region")
        assert held["journal"] == before and spy.entries == 0
        y.backward()
    assert torch.equal(p.detach(), torch.ones(BIG, dtype=D)) and torch.equal(x.grad, torch.ones(3, dtype=D))


# --- negative indices are wrapped when recording written runs ------------------------------------

def _element_bytes(t: torch.Tensor, written: torch.Tensor) -> set[int]:
    """Byte offsets of ``t``'s storage where ``written`` (a bool mask over ``t``) is true."""
    item = t.element_size()
    out = set()
    for coord in torch.nonzero(written).tolist():
        off = t.storage_offset() + sum(c * s for c, s in zip(coord, t.stride()))
        out.update(range(off * item, off * item + item))
    return out


def _run_bytes(runs: np.ndarray) -> set[int]:
    return {b for lo, hi in runs.tolist() for b in range(lo, hi)}


_NEG_WRITES = {
    "index_put_1d": (torch.ops.aten.index_put_.default,
                     lambda t: (t, [torch.tensor([-1, -3])], torch.tensor(1.0, dtype=D))),
    "index_put_2d": (torch.ops.aten.index_put_.default,
                     lambda t: (t, [torch.tensor([-1, 0]), torch.tensor([-2, -1])], torch.tensor(1.0, dtype=D))),
    "index_copy_neg_dim": (torch.ops.aten.index_copy_.default,
                           lambda t: (t, -1, torch.tensor([2]), torch.ones(t.shape[0], 1, dtype=D))),
    "index_fill_neg": (torch.ops.aten.index_fill_.int_Scalar, lambda t: (t, 0, torch.tensor([-2]), 3.0)),
    "scatter_neg_dim": (torch.ops.aten.scatter_.value,
                        lambda t: (t, -1, torch.tensor([[1], [0], [2], [1], [0]]), 2.0)),
}


@pytest.mark.parametrize("view", ["base", "offset_view"])
@pytest.mark.parametrize("form", sorted(_NEG_WRITES))
def test_written_runs_of_negative_indices_are_the_elements_written(form, view):
    """``write_runs`` of index writes with negative indices (and a negative dim) names exactly the
    bytes the op writes, wrapped as torch wraps them, on the base and on a view with an offset."""
    from stateremat.torch._storage import write_runs

    base = torch.zeros(8, 3, dtype=D)
    t = base if view == "base" else base[2:7]  # storage offset 6 elements
    op, make = _NEG_WRITES[form]
    args = make(t)
    runs = write_runs(op, args, {}, t)
    probe = torch.zeros_like(t)
    op(probe, *args[1:])  # the same write on a fresh tensor: which elements it touches
    assert _run_bytes(runs) == _element_bytes(t, probe != 0)


# --- overlapping journal entries restore from each entry's own offset -----------------------------

@pytest.mark.parametrize("order", ["growing", "shrinking", "shifted"])
def test_a_restore_through_heavily_overlapping_entries_takes_each_byte_from_its_first_entry(order):
    """Entries that overlap much (their old bytes more than twice the union) take the one-copy-
    per-owning-entry path, which must address each entry's old bytes from that entry's start."""
    from stateremat.torch._preserve.region import Journal
    from stateremat.torch._runtime import Runtime
    from stateremat.torch._storage import storage_key

    n = 4096
    rng = np.random.default_rng(0)
    buf = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
    j = Journal(Runtime().acquire(storage_key(buf), buf), None)
    spans = {"growing": [(0, 100), (0, 200), (0, 300), (0, 400)],
             "shrinking": [(100, 400), (0, 400), (0, 400), (50, 350)],
             "shifted": [(300, 700), (200, 600), (100, 500), (0, 400)]}[order]
    history = [buf.clone()]
    for lo, hi in spans:
        j.record(np.array([[lo, hi]], dtype=np.int64))
        buf[lo:hi] = torch.from_numpy(rng.integers(0, 256, hi - lo, dtype=np.uint8))
        history.append(buf.clone())
    union = max(hi for _, hi in spans) - min(lo for lo, _ in spans)
    assert sum(hi - lo for lo, hi in spans) > 2 * union  # the much-overlap path
    before = buf.clone()
    runs, visible = j.restore(j.entries[0].seq)
    assert torch.equal(buf, history[0])
    assert torch.equal(visible, torch.cat([before[a:b] for a, b in runs.tolist()]))


@pytest.mark.parametrize("mode", ["region", "whole"])
def test_overlapping_writes_through_an_offset_view_replay_exactly(mode):
    """Segments writing overlapping slices of a view that starts inside its storage (and eager
    writes between them): each replay restores the bytes at the view's offset, not the base's."""
    def run(ckpt):
        base = torch.arange(BIG, dtype=D) / 3
        v = base[300:]  # storage offset 300 elements
        x = torch.randn(4, dtype=D, generator=torch.Generator().manual_seed(0), requires_grad=True)
        total = 0
        for i, (lo, hi) in enumerate([(0, 40), (10, 60), (5, 80), (0, 100)]):
            def seg(x, lo=lo, hi=hi, i=i):
                y = (x * v[lo:lo + 4].clone() * (i + 1)).sin().sum()
                v[lo:hi].mul_(1.5).add_(i)
                return y + (x * v[lo:lo + 4].clone()).cos().sum()

            total = total + (seg(x) if ckpt is None else checkpoint(seg, x, state=[v], preserve=ckpt))
            v[lo + 2:hi + 5].add_(0.25)  # eager code between segments
        total.backward()
        return x.grad, base

    with JournalSpy() as spy:
        got = run(mode)
    assert spy.entries > 0 or mode == "whole"
    assert _same(got, run(None))


# --- an adopted region preserver is a consumer of the journal (nested checkpoints) -----------------

@pytest.mark.parametrize("inner_grad", [True, False])
@pytest.mark.parametrize("outer_declares", [False, True])
@pytest.mark.parametrize("outer", ["region", "whole"])
def test_an_outer_segment_keeps_the_journal_of_an_inner_one_it_adopted(outer, outer_declares, inner_grad):
    """The inner segment declares ``q`` (journaled) and ends inside the outer one, which adopts it.
    Once the inner segment's own frame is gone (``inner_grad=False``: no graph keeps it, so it is
    released as the inner forward returns), the outer one must still consume the journal: eager
    writes before the backward are journaled, and the outer replay restores ``B0``."""
    def run(ckpt):
        q = torch.arange(BIG, dtype=D) / 5
        x = torch.randn(4, dtype=D, generator=torch.Generator().manual_seed(1), requires_grad=True)

        def inner(x):
            y = (x * q[:4].clone()).sin()
            q[:16].mul_(0.5)
            return y

        def f(x):
            a = x if inner_grad else x.detach()
            h = inner(a) if ckpt is None else checkpoint(inner, a, state=[q], preserve="region")
            return (x * h * q[8:12].clone()).sum()

        y = f(x) if ckpt is None else checkpoint(f, x, state=[q] if outer_declares else [], preserve=ckpt)
        q[:32].add_(1.0)  # eager code between forward and backward
        y.backward()
        return x.grad, q

    with JournalSpy() as spy:
        got = run(outer)
    assert spy.entries > 0
    assert _same(got, run(None))


# --- a global tensor is a binding slot --------------------------------------------------------------

_G = torch.ones(3, dtype=D)


def _rebinds_global(x):
    global _G
    y = (x * _G).sum()
    _G = _G + 1.0  # a rebinding of module state, not an in-place write
    return y


class _UsesGlobal(nn.Module):
    def forward(self, x):
        return _rebinds_global(x) * 1.0


class _RebindsGlobal(nn.Module):
    def forward(self, x):
        global _G
        y = (x * _G).sum()
        _G = _G * 2.0
        return y


@pytest.mark.parametrize("via", ["function", "module_helper", "submodule_forward"])
@pytest.mark.parametrize("mode", ["whole", "region"])
@pytest.mark.parametrize("state", [None, "auto"])
def test_a_global_tensor_rebound_by_the_forward_is_replayed_as_of_the_forward(mode, via, state):
    """A segment's code rebinds a module global tensor: its replay would read the new tensor. The
    global is a binding slot of the segment, so the replay reads the forward's tensor (gradient 1,
    not 2) and the global is rebound once (2, not 4), in strict mode and by default."""
    global _G
    _G = torch.ones(3, dtype=D)
    fn = {"function": lambda: _rebinds_global, "module_helper": _UsesGlobal,
          "submodule_forward": lambda: nn.Sequential(_RebindsGlobal())}[via]()
    x = torch.ones(3, dtype=D, requires_grad=True)
    checkpoint(fn, x, preserve=mode, state=state).backward()
    assert torch.equal(x.grad, torch.ones(3, dtype=D)) and torch.equal(_G, torch.full((3,), 2.0, dtype=D))


# --- journal pruning ------------------------------------------------------------------------------------

def test_journal_prune_drops_exactly_the_entries_older_than_the_oldest_consumer():
    from stateremat.torch._preserve.region import Journal
    from stateremat.torch._runtime import Runtime
    from stateremat.torch._storage import storage_key

    buf = torch.zeros(4096, dtype=torch.uint8)
    rt = Runtime()
    j = Journal(rt.acquire(storage_key(buf), buf), None)
    for lo in (0, 100, 200, 300):
        j.record(np.array([[lo, lo + 10]], dtype=np.int64))
    seqs = [e.seq for e in j.entries]
    assert j.bytes == 40 and rt.counters.journal_bytes == 40 and j.meta_bytes == 4 * 16
    j.prune(seqs[0])  # the oldest consumer started before every entry: nothing to drop
    assert [e.seq for e in j.entries] == seqs and j.bytes == 40
    j.prune(seqs[2])  # entries from seqs[2] on are still needed
    assert [e.seq for e in j.entries] == seqs[2:]
    assert j.bytes == 20 and j.meta_bytes == 2 * 16 and rt.counters.journal_bytes == 20
    j.prune(None)  # no consumer left
    assert j.entries == [] and j.bytes == 0 and j.meta_bytes == 0 and rt.counters.journal_bytes == 0


def test_a_released_segment_prunes_the_journal_to_what_later_segments_need(fresh_runtime):
    import gc

    q = torch.zeros(BIG, dtype=D)
    x = torch.ones(4, dtype=D, requires_grad=True)

    def seg(lo):
        def f(x):
            y = (x * q[lo:lo + 4].clone()).sum()
            q[lo:lo + 100].add_(1.0)  # 800 bytes journaled
            return y
        return f

    ya = checkpoint(seg(0), x, state=[q], preserve="region")
    yb = checkpoint(seg(1000), x, state=[q], preserve="region")
    assert preservation_stats().journal_bytes == 1600  # both segments' writes
    ya.backward()
    del ya
    gc.collect()
    # a's entry is older than b's start: dropped; b's own entry stays (b may still replay)
    assert preservation_stats().journal_bytes == 800
    yb.backward()
    del yb
    gc.collect()
    assert preservation_stats().journal_bytes == 0
    assert q[:100].eq(1).all() and q[1000:1100].eq(1).all()


# --- the profile card: P's allowance for what runs outside the segments; the head in the last q ---

class _StemHeavy(nn.Module):
    """A stem whose temporary dwarfs everything the segments hold (it runs before the first
    segment), two small segments, and an output the step's loss blows up (the head)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 32)
        self.seg1 = nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.seg2 = nn.Sequential(nn.Linear(32, 32), nn.Tanh())

    def forward(self, x):
        h = self.stem(x)
        h = h.detach().repeat(1, 256).view(h.shape[0], 256, 32).mean(1) + h  # 256x the stem's bytes, freed
        return self.seg2(self.seg1(h))


def _stem_heavy_card():
    from stateremat.torch import profile

    torch.manual_seed(0)
    model = _StemHeavy().double()
    x = torch.randn(16, 8, dtype=D, generator=torch.Generator().manual_seed(1))

    def step(m):
        (m(x).repeat(1, 16) ** 2).mean().backward()  # the head: a temporary 16x the output

    return profile(model, ["seg1", "seg2"], step, repeats=1)


@pytest.fixture(scope="module")
def stem_heavy_card():
    return _stem_heavy_card()


def test_p_allows_for_the_peaks_outside_the_segments(stem_heavy_card):
    """Eq. (3)'s ``P + Σ r + max q`` must bound the step's peak for every plan, also where the
    peak is outside the segments (the stem's temporary): ``P`` = live bytes at the first segment's
    entry + the allowance for those peaks."""
    card = stem_heavy_card
    parts = card.meta["persistent"]
    outside = max(parts["before_first_segment_peak_bytes"], parts["after_backward_peak_bytes"])
    r_min = sum(min(c.retained_bytes for c in s.options.values()) for s in card.segments)
    q_min = max(min(c.temp_bytes for c in s.options.values()) for s in card.segments)
    assert outside > parts["first_segment_entry_bytes"] + r_min + q_min  # the stem dominates
    assert parts["outside_peak_allowance_bytes"] > 0
    assert card.persistent_bytes == parts["first_segment_entry_bytes"] + parts["outside_peak_allowance_bytes"]
    assert card.persistent_bytes + r_min + q_min >= outside  # eq. (3) of the cheapest plan covers it


def test_the_head_and_loss_are_charged_to_the_last_segment(stem_heavy_card):
    """The head and loss run right after the last segment's forward: their bytes belong in the
    last segment's ``q`` under every option, not in the first segment's."""
    card = stem_heavy_card
    head = card.meta["persistent"]["head_bytes"]
    first, last = card.segments[0], card.segments[-1]
    assert head > max(c.temp_bytes for c in first.options.values())  # a head that dominates
    assert all(c.temp_bytes >= head for c in last.options.values())
    assert all(c.temp_bytes < head for c in first.options.values())


# --- the whole-snapshot threshold, and lowering it for journal tests ----------------------------------

def _tiny_region_step():
    q = torch.zeros(8, dtype=D)
    x = torch.ones(2, dtype=D, requires_grad=True)

    def f(x):
        y = (x * q[:2].clone()).sum()
        q[:2].add_(1.0)
        return y

    y = checkpoint(f, x, state=[q], preserve="region")
    during = preservation_stats()
    y.backward()
    return during


def test_a_tiny_region_storage_is_kept_whole_by_default(fresh_runtime):
    during = _tiny_region_step()
    assert during.journal_bytes == 0 and during.snapshot_bytes == 64


def test_the_lowered_threshold_makes_region_journal_a_tiny_storage(fresh_runtime, journal_every_storage):
    """What the journal tests rely on (the ``journal_every_storage`` fixture): under it a tiny
    region storage builds a journal, seen in the statistics during the step."""
    during = _tiny_region_step()
    assert during.journal_bytes == 16 and during.snapshot_bytes == 0
