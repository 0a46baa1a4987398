"""Host-side objects reused across steps (issue 26) are never stale.

``_hostcache`` keeps the byte view of each small declared storage across steps and ``whole.py``
copies the small whole snapshots of a transaction in batches. Each test changes the model
between steps in one way that could leave a reused object stale (a buffer replaced, ``.data =``,
``set_``, the storage resized, the dtype changed, a module added, a buffer registered) and
compares every buffer, every gradient and the loss, step by step and bit for bit, with eager
execution: under ``state="auto"`` and strict ``state=[module]``, both preservers, nested or not.
A stale view would restore and reinstate bytes of a storage the replay no longer reads: the
running statistics would be updated twice, and the replay would read the post-forward counter.
"""
from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch import nn

from stateremat.torch import checkpoint
from stateremat.torch import _hostcache
from stateremat.torch._preserve import whole
from stateremat.torch._storage import flat_bytes

D = torch.float64
STEPS = 4


class Block(nn.Module):
    """BatchNorm (3 buffers) and two small buffers the forward reads and writes in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("acc", torch.zeros(4))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        h = self.bn(self.lin(x))
        with torch.no_grad():
            self.acc.mul_(0.5).add_(h.mean(0))
            self.count.add_(1)
        out = h * (1 + self.acc) * self.count.to(h.dtype)  # the replay reads what the forward read
        extra = getattr(self, "extra", None)
        if extra is not None:
            out = extra(out)
        return out


def _replace(m):
    m.bn.running_mean = m.bn.running_mean.clone() + 0.25


def _data_swap(m):
    m.bn.running_var.data = m.bn.running_var.data.clone() * 2


def _set(m):
    with torch.no_grad():
        m.acc.set_(m.acc.clone() + 1)


def _resize(m):  # the same tensor object, its storage grown (moved) and then shrunk back (moved)
    s = m.acc.untyped_storage()
    n = s.nbytes()
    s.resize_(n * 4)
    if m.step % 2:
        s.resize_(n)


def _double(m):
    m.double()


def _add_module(m):
    m.extra = nn.BatchNorm1d(4).to(m.lin.weight.dtype)


def _register(m):
    m.register_buffer("count", torch.full((), 5, dtype=torch.long))


CHANGES = {"buffer replaced": _replace, ".data =": _data_swap, "set_": _set, "storage resized": _resize,
           "dtype changed": _double, "module added": _add_module, "buffer registered": _register}


def _run(m, call, change, steps=STEPS):
    out = []
    for i in range(steps):
        m.step = i
        if i in (1, 2):
            change(m)
        dtype = m.lin.weight.dtype
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i)).to(dtype).requires_grad_()
        loss = call(m, x).square().sum()
        loss.backward()
        out.append((loss.detach().clone(), x.grad.clone(),
                    {k: v.detach().clone() for k, v in m.state_dict().items()},
                    {k: p.grad.clone() for k, p in m.named_parameters()}))
        m.zero_grad(set_to_none=True)
    return out


def _same(a, b):
    for (la, xa, sa, ga), (lb, xb, sb, gb) in zip(a, b):
        assert torch.equal(la, lb)
        assert torch.equal(xa, xb)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), \
            [k for k in sa if not torch.equal(sa[k], sb.get(k, torch.empty(0)))]
        assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)


def _calls(preserve):
    return {
        "auto": lambda m, x: checkpoint(m, x, preserve=preserve),
        "strict": lambda m, x: checkpoint(m, x, state=[m], preserve=preserve),
        "nested auto": lambda m, x: checkpoint(lambda y: checkpoint(m, y, preserve=preserve) + 0, x, preserve=preserve),
        "nested strict": lambda m, x: checkpoint(lambda y: checkpoint(m, y, state=[m], preserve=preserve) + 0, x,
                                                 state=[m], preserve=preserve),
    }


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("how", ["auto", "strict", "nested auto", "nested strict"])
@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_a_change_between_steps_is_seen(change, how, preserve):
    torch.manual_seed(0)
    m0 = Block().to(D)
    want = _run(copy.deepcopy(m0), lambda m, x: m(x), CHANGES[change])
    got = _run(copy.deepcopy(m0), _calls(preserve)[how], CHANGES[change])
    _same(got, want)


def test_the_view_is_reused_only_while_it_covers_the_same_bytes():
    t = torch.arange(8, dtype=torch.float32)
    f = _hostcache.flat_of(t)
    assert _hostcache.flat_of(t) is f  # reused
    t.untyped_storage().resize_(64)  # the same tensor, its storage moved and grown
    g = _hostcache.flat_of(t)
    assert g is not f and g.numel() == 64 and g.data_ptr() == t.untyped_storage().data_ptr()
    t.set_(torch.ones(8))  # another storage, the same size
    h = _hostcache.flat_of(t)
    assert h is not g and h.data_ptr() == t.data_ptr()
    h.copy_(torch.zeros(32, dtype=torch.uint8))
    assert torch.equal(t, torch.zeros(8))  # writes through it reach the tensor
    t.data = torch.full((8,), 2.0)
    assert _hostcache.flat_of(t).data_ptr() == t.data_ptr()
    big = torch.zeros(_hostcache.CACHED_BYTES)  # four times the limit: not cached
    assert _hostcache.flat_of(big) is not _hostcache.flat_of(big)
    gc.collect()
    n = _hostcache.cached_views()
    del t
    gc.collect()
    assert _hostcache.cached_views() == n - 1  # dropped with its tensor


def test_batched_copies_equal_one_copy_per_storage():
    ts = [torch.randn(n, dtype=D) for n in (1, 3, 7, 64)] + [torch.zeros((), dtype=torch.long)]
    from stateremat.torch._runtime import runtime
    from stateremat.torch._storage import storage_key

    rt = runtime()
    sts = [rt.acquire(storage_key(t), t) for t in ts]
    ps = [whole.WholePreserver(st, 1, None) for st in sts]
    before = [flat_bytes(t).clone() for t in ts]
    whole.begin_all(ps)
    for t in ts:
        t.add_(1)
    after = [flat_bytes(t).clone() for t in ts]
    restored = whole.restore_all(ps, "seg")
    assert [torch.equal(flat_bytes(t), b) for t, b in zip(ts, before)] == [True] * len(ts)
    assert [torch.equal(r.visible, a) for (_, r), a in zip(restored, after)] == [True] * len(ts)
    whole.reinstate_all(restored)
    assert [torch.equal(flat_bytes(t), a) for t, a in zip(ts, after)] == [True] * len(ts)
    for p, st in zip(ps, sts):
        p.release()
        rt.release(st)


class _Own(torch.Tensor):
    """Its own ``__torch_function__`` runs every call itself (past the marked tensors' handler)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        return out.as_subclass(cls) if type(out) is torch.Tensor else out


@pytest.mark.parametrize("small_first", [True, False])
def test_a_refused_restore_leaves_the_batched_small_storages_as_they_were(small_first):
    """A region journal's refusal (a version gap, R8) comes before any small whole storage is
    restored: the refused replay leaves every declared byte as the forward left it."""
    from stateremat.torch import ReplayError
    from stateremat.torch._txn import SMALL_STORAGE_BYTES

    big = torch.zeros(SMALL_STORAGE_BYTES // 8 + 3, dtype=D)[:3]  # journaled under region
    small = [torch.zeros(3, dtype=D), torch.zeros(2, dtype=D)]  # kept whole, batched
    w = torch.randn(3, dtype=D, requires_grad=True)
    x = torch.randn(4, 3, dtype=D).as_subclass(_Own)

    def f(x, w):
        with torch.no_grad():
            for s in small:
                s.add_(1.0)
            torch.add(x.mean(0), big, out=big)  # past the handler: unseen, but the version bumps
        return (x * w).as_subclass(torch.Tensor).sum()

    state = [*small, big] if small_first else [big, *small]
    out = checkpoint(f, x, w, state=state, preserve="region")
    after = [s.clone() for s in small]
    with pytest.raises(ReplayError, match="version gap"):
        out.backward()
    assert all(torch.equal(s, a) for s, a in zip(small, after))
