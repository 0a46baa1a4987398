"""The per-write fast paths of the marked-tensor handler and the journal (issue 15) change no result.

* Calls whose writes are known at the ``__torch_function__`` level (``Tensor`` methods that write
  ``self``, ``F.batch_norm``) skip the dispatch mode: for every such op, both preservers, nested
  or not, the gradients, the buffers and the journal bytes equal those of the dispatch path
  (``direct_writes`` switched off) and eager execution, bit for bit.
* A replay write inside the bytes the restore set aside needs no undo (the reinstatement
  overwrites it): property-tested against eager over random partial writes.
* ``library_ops`` nests at no cost and an exception leaves grad mode and the nesting depth as
  they were; the scan skips plain values without missing a tensor next to them.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from stateremat.torch import ReplayError, StatefulCheckpoint, UnsupportedError, checkpoint, preservation_stats
from stateremat.torch import _compat, _mode
from stateremat.torch._scan import reach
from stateremat.torch._storage import runs_within
from stateremat.torch._txn import SMALL_STORAGE_BYTES
from _journal import JournalSpy, journal_every_storage

D = torch.float64
#: rows of 6 float64 making a storage above SMALL_STORAGE_BYTES (journaled under region)
LARGE_ROWS = SMALL_STORAGE_BYTES // 48 + 1
_SELF_OPS = {
    "add_": lambda b, v: b.add_(v),
    "sub_": lambda b, v: b.sub_(v * 0.5),
    "mul_": lambda b, v: b.mul_(1 + v),
    "div_": lambda b, v: b.div_(2 + v),
    "copy_": lambda b, v: b.copy_(b * 0.5 + v),
    "zero_": lambda b, v: b.zero_(),
    "fill_": lambda b, v: b.fill_(float(v.sum())),
    "lerp_": lambda b, v: b.lerp_(v, 0.25),
    "addcmul_": lambda b, v: b.addcmul_(v, v, value=0.5),
    "addcdiv_": lambda b, v: b.addcdiv_(v, v + 2, value=0.5),
    "clamp_": lambda b, v: b.clamp_(min=-0.1, max=0.3),
}


def test_every_direct_op_is_listed_with_its_aten_op():
    assert set(_SELF_OPS) == set(_mode._SELF_WRITERS)


class _Block(torch.nn.Module):
    """Writes its buffer with one op (on a slice when ``part``), reads it, and has a BatchNorm."""

    def __init__(self, op: str, part: bool) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6).to(D)
        self.bn = torch.nn.BatchNorm1d(6).to(D)
        self.register_buffer("buf", torch.linspace(-1, 1, 12, dtype=D).reshape(2, 6))
        self.op, self.part = op, part

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        target = self.buf[0] if self.part else self.buf
        _SELF_OPS[self.op](target, h.detach()[0] if self.part else h.detach()[:2])
        return self.bn(h) * self.buf.sum() + h


def _run(op: str, part: bool, how: str, preserve: str, direct: bool, monkeypatch) -> tuple:
    if not direct:
        monkeypatch.setattr(_mode, "direct_writes", lambda *a: None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(op, part), _Block(op, part))
    if how == "wrapped":
        model[0] = StatefulCheckpoint(model[0], state="buffers", preserve=preserve)
    elif how == "nested":
        inner = StatefulCheckpoint(model[1], state="buffers", preserve=preserve)
        model = torch.nn.Sequential(model[0], inner)
        outer = model
        model = StatefulCheckpoint(outer, state="buffers", preserve=preserve)
    journal = 0
    for step in range(2):
        x = torch.randn(4, 6, dtype=D, generator=torch.Generator().manual_seed(step))
        before = preservation_stats().journal_bytes
        out = model(x)
        journal += preservation_stats().journal_bytes - before
        out.square().sum().backward()
    params = [p.grad.clone() for p in model.parameters()]
    return params, [b.clone() for b in model.buffers()], journal


@pytest.mark.parametrize("journaled", [False, True], ids=["small", "journaled"])
@pytest.mark.parametrize("op", sorted(_SELF_OPS))
@pytest.mark.parametrize("part", [False, True], ids=["whole_view", "slice"])
@pytest.mark.parametrize("how", ["wrapped", "nested"])
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_direct_writes_equal_the_dispatch_path_and_eager(op, part, how, preserve, journaled, monkeypatch):
    """``journaled``: the whole-snapshot threshold lowered to 0, so region journals the (12-element)
    buffer and the journal bytes of both paths are compared for real (else both are 0)."""
    with journal_every_storage() if journaled else contextlib.nullcontext():
        fast = _run(op, part, how, preserve, True, monkeypatch)
        with monkeypatch.context() as m:
            slow = _run(op, part, how, preserve, False, m)
    eager = _run(op, part, "eager", preserve, True, monkeypatch)
    for a, b, c in zip(fast[0] + fast[1], slow[0] + slow[1], eager[0] + eager[1]):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert fast[2] == slow[2]  # the same bytes journaled (none under whole)
    if preserve == "whole" or not journaled:
        assert fast[2] == 0
    else:
        assert fast[2] > 0


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("momentum", [0.1, 1.0])
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_functional_batch_norm_keywords_and_modes(training, momentum, preserve):
    torch.manual_seed(0)
    rm, rv = torch.zeros(3, dtype=D), torch.ones(3, dtype=D)
    erm, erv = rm.clone(), rv.clone()
    x = torch.randn(5, 3, dtype=D, requires_grad=True)

    def f(x, rm, rv):
        return F.batch_norm(x, running_mean=rm, running_var=rv, training=training, momentum=momentum).exp().sum()

    checkpoint(lambda x: f(x, rm, rv), x, state=[rm, rv], preserve=preserve).backward()
    g = x.grad.clone()
    x.grad = None
    f(x, erm, erv).backward()
    assert torch.equal(g, x.grad) and torch.equal(rm, erm) and torch.equal(rv, erv)


@pytest.mark.parametrize("size", ["small", "journaled"])
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_a_write_to_a_declared_leaf_that_requires_grad_keeps_torchs_error(preserve, size):
    """``journaled``: ``p`` above SMALL_STORAGE_BYTES, so region journals it; the journal bytes are
    read inside the segment, after the refused write (once the segment fails, its journal is
    pruned, so a check after it could not fail)."""
    n = 3 if size == "small" else SMALL_STORAGE_BYTES // 8 + 3
    p = torch.nn.Parameter(torch.ones(n, dtype=D))
    before = preservation_stats().journal_bytes
    inside = []

    def f(x):
        try:
            p.add_(1.0)
        finally:
            inside.append(preservation_stats().journal_bytes)
        return (x * p[:3]).sum()

    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        checkpoint(f, torch.ones(3, dtype=D, requires_grad=True), state=[p], preserve=preserve)
    assert inside == [before]  # nothing written, nothing journaled
    assert preservation_stats().journal_bytes == before
    assert torch.equal(p.detach(), torch.ones(n, dtype=D))


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_unmarked_alias_written_with_a_marked_argument_is_seen(preserve):
    buf = torch.zeros(4, 3, dtype=D)
    alias = buf[1]  # taken before the segment marks buf: writes through it alone are not seen
    eager_buf = buf.clone()
    x = torch.randn(3, dtype=D, requires_grad=True)

    def f(x, b, a):
        a.add_(b[0] + 1.0)  # the marked buf is an argument: the write to its storage is seen
        return (b[1] * x).exp().sum()

    checkpoint(lambda x: f(x, buf, alias), x, state=[buf], preserve=preserve).backward()
    g = x.grad.clone()
    x.grad = None
    f(x, eager_buf, eager_buf[1]).backward()
    assert torch.equal(g, x.grad) and torch.equal(buf, eager_buf)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_replay_writes_inside_restored_runs_match_eager(data):
    """Random partial writes in forward, between forward and backward and again in the replay."""
    n = data.draw(st.integers(4, 16))
    spans = st.tuples(st.integers(0, n - 1), st.integers(1, 4)).map(lambda t: (t[0], min(n, t[0] + t[1])))
    inside = data.draw(st.lists(spans, min_size=1, max_size=4))
    between = data.draw(st.lists(spans, max_size=3))
    results = []
    for mode in ("region", "whole", "eager"):
        buf = torch.arange(n, dtype=D)
        x = torch.linspace(0.1, 1, n, dtype=D, requires_grad=True)

        def seg(x):
            for k, (a, b) in enumerate(inside):
                buf[a:b].mul_(0.5).add_(k + 1)
            return (x * buf.clone()).sin().sum()  # eager saves no alias of buf: it may change before backward

        out = seg(x) if mode == "eager" else checkpoint(seg, x, state=[buf], preserve=mode)
        for a, b in between:
            buf[a:b] += 3.0
        out.backward()
        results.append((x.grad.clone(), buf.clone()))
    for got in results[:2]:
        assert torch.equal(got[0], results[2][0]) and torch.equal(got[1], results[2][1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 8)), max_size=5),
       st.lists(st.tuples(st.integers(0, 60), st.integers(1, 8)), max_size=4))
def test_runs_within_equals_a_byte_set_check(runs, cover):
    def norm(rs):
        spans = sorted((a, a + k) for a, k in rs)
        merged: list[list[int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return np.array(merged, dtype=np.int64).reshape(-1, 2)

    r, c = norm(runs), norm(cover)
    covered = {i for a, b in c for i in range(a, b)}
    assert runs_within(r, c) == all(i in covered for a, b in r for i in range(a, b))


def test_library_ops_nest_and_an_exception_restores_everything():
    x = torch.ones(2, requires_grad=True)
    assert torch.is_grad_enabled()
    with pytest.raises(KeyError):
        with _compat.library_ops():
            with _compat.library_ops():
                assert not torch.is_grad_enabled()
                assert not (x * 2).requires_grad
                raise KeyError("inner")
    assert torch.is_grad_enabled() and _compat._HIDDEN.depth == 0
    assert (x * 2).requires_grad


def test_scan_skips_plain_values_without_missing_tensors_beside_them():
    t1, t2, t3 = torch.zeros(1), torch.zeros(2), torch.zeros(3)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.log = [*range(1000), t1, "x", None]
            self.table = {**{i: float(i) for i in range(1000)}, "t": t2}
            self.cfg = type("Cfg", (), {})()
            self.cfg.n, self.cfg.t = 3, t3

        def forward(self, x):
            return x

    r = reach(M(), (torch.ones(1),), {})
    found = {id(t) for _, t in r.tensors.values()}
    assert {id(t1), id(t2), id(t3)} <= found


class _Tagged(torch.Tensor):
    """A user subclass with torch's own ``__torch_function__`` (markable)."""


@pytest.mark.parametrize("preserve", ["whole", "region"])
@pytest.mark.parametrize("op", ["add_", "copy_", "mul_"])
def test_direct_writes_on_a_user_tensor_subclass(op, preserve):
    x = torch.randn(3, dtype=D, requires_grad=True)
    results = []
    for mode in (preserve, "eager"):
        buf = torch.linspace(0, 1, 3, dtype=D).as_subclass(_Tagged)

        def seg(x):
            _SELF_OPS[op](buf, x.detach())
            return (x * buf.clone()).exp().sum()

        out = seg(x) if mode == "eager" else checkpoint(seg, x, state=[buf], preserve=mode)
        buf.add_(1.0)  # between forward and backward
        out.backward()
        results.append((x.grad.clone(), buf.as_subclass(torch.Tensor).clone(), type(buf)))
        x.grad = None
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert results[0][2] is _Tagged  # the class is given back once nothing can replay


# --- review findings: a write recorded before the call must be a write that happens -----------

def _bn_calls():
    bn = torch.nn.BatchNorm1d(3).to(D)

    def empty(x):
        return torch.tanh(x) * 2 + F.batch_norm(x[:0], bn.running_mean, bn.running_var, training=True).sum()

    def one_value(x):  # eager raises before any write; the model catches it
        try:
            F.batch_norm(x[:1], bn.running_mean, bn.running_var, training=True)
        except ValueError:
            pass
        return torch.tanh(x) * 2

    def bad_eps(x):
        try:
            F.batch_norm(x, bn.running_mean, bn.running_var, training=True, eps=0.0)
        except ValueError:
            pass
        return torch.tanh(x) * 2

    def wrong_weight(x):  # a size error before the kernel
        try:
            F.batch_norm(x, bn.running_mean, bn.running_var, torch.ones(4, dtype=D), training=True)
        except RuntimeError:
            pass
        return torch.tanh(x) * 2

    def wrong_channels(x):
        try:
            F.batch_norm(torch.cat([x, x], 1), bn.running_mean, bn.running_var, training=True)
        except RuntimeError:
            pass
        return torch.tanh(x) * 2

    return bn, {"empty": empty, "one_value": one_value, "bad_eps": bad_eps, "wrong_weight": wrong_weight,
                "wrong_channels": wrong_channels}


@pytest.mark.parametrize("call", ["empty", "one_value", "bad_eps", "wrong_weight", "wrong_channels"])
@pytest.mark.parametrize("outer", ["stateremat", "stateremat_warn", "torch"])
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_a_batch_norm_that_writes_nothing_is_not_a_write(call, outer, preserve):
    """The statistics are declared by a live segment; a later call that writes nothing in eager
    (empty batch, one value per channel, eps <= 0) is no undeclared write and no foreign replay write."""
    import warnings

    import torch.utils.checkpoint as tuc

    bn, calls = _bn_calls()
    lin = torch.nn.Linear(3, 3).to(D)
    x = torch.randn(4, 3, dtype=D, requires_grad=True)
    y = checkpoint(lambda x: bn(lin(x)), x, state=[bn], preserve=preserve)
    before = (bn.running_mean.clone(), bn.running_var.clone())
    f = calls[call]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if outer == "torch":
            z = tuc.checkpoint(f, y, use_reentrant=False)
        else:
            z = checkpoint(f, y, on_undeclared="warn" if outer == "stateremat_warn" else "raise")
        z.sum().backward()
    assert torch.equal(bn.running_mean, before[0]) and torch.equal(bn.running_var, before[1])


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_a_declared_inference_tensor_is_refused_with_a_clear_error(preserve):
    with torch.inference_mode():
        buf = torch.zeros(3, dtype=D)
    calls = []

    def f(x):
        calls.append(1)
        return (x * buf).sum()

    with pytest.raises(UnsupportedError, match="inference tensor.*Tip:"):
        checkpoint(f, torch.ones(3, dtype=D, requires_grad=True), state=[buf], preserve=preserve)
    assert not calls  # refused before the forward ran


# --- review finding: a later segment's replay must not hide an unseen write from a region journal ---

def _two_segments(mode: str, first: str, second: str, rows: int = 5):
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(6, 6).to(D), torch.nn.Linear(6, 6).to(D)
    q = torch.linspace(-1, 1, rows * 6, dtype=D).reshape(rows, 6)
    early_alias = q[4]  # taken before any segment: never marked, its writes bypass the journal

    def seg(lin, row):
        def f(x):
            h = torch.tanh(lin(x))
            out = h * q[4].clone() + h * q[row].clone()
            q[row].mul_(1.1)
            return out
        return f

    x = torch.randn(4, 6, dtype=D, generator=torch.Generator().manual_seed(0))
    fa, fb = seg(lin1, 0), seg(lin2, 1)
    out = fb(fa(x)) if mode == "eager" else checkpoint(
        fb, checkpoint(fa, x, state=[q], preserve=first), state=[q], preserve=second)
    loss = out.square().sum()
    early_alias.add_(0.25)  # eager code between forward and backward, unseen by the journal
    loss.backward()
    return q, lin1.weight.grad, lin2.weight.grad


@pytest.mark.parametrize("second", ["whole", "region"])
def test_an_unseen_write_is_refused_for_a_region_segment_whatever_replays_first(second):
    with pytest.raises(ReplayError, match="version gap"):
        _two_segments("checkpoint", "region", second, rows=LARGE_ROWS)


@pytest.mark.parametrize("rows", [5, LARGE_ROWS])
def test_an_unseen_write_is_fine_when_every_segment_keeps_a_whole_snapshot(rows):
    got, want = _two_segments("checkpoint", "whole", "whole", rows), _two_segments("eager", "", "", rows)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("first,second", [("region", "whole"), ("region", "region"), ("whole", "region")])
def test_an_unseen_write_to_a_small_region_storage_is_replayed_right(first, second):
    """A storage of at most SMALL_STORAGE_BYTES is kept whole under region: no journal to miss it."""
    got, want = _two_segments("checkpoint", first, second), _two_segments("eager", "", "")
    assert all(torch.equal(a, b) for a, b in zip(got, want))


# --- review finding: results of calls on a declared user subclass keep the subclass -----------

class _Doubling(torch.Tensor):
    """Overrides a method: ``add_`` adds twice."""

    def add_(self, other, alpha=1):
        return super().add_(other, alpha=2 * alpha)


_DERIVED = {
    "row": lambda q: q[0],
    "transpose": lambda q: q.T,
    "flat_view": lambda q: q.view(-1)[:3],
    "product": lambda q: q * 2,
    "clone": lambda q: q.clone(),
}


@pytest.mark.parametrize("derive", sorted(_DERIVED))
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_results_of_a_declared_subclass_keep_its_class_and_overrides(derive, preserve):
    lin = torch.nn.Linear(3, 3).to(D)
    x = torch.randn(2, 3, dtype=D)
    results = []
    for mode in ("eager", preserve):
        q = torch.zeros(2, 3, dtype=D).as_subclass(_Doubling)
        seen = []

        def f(x):
            d = _DERIVED[derive](q)
            seen.append(isinstance(d, _Doubling))
            d.add_(1.0)
            return lin(x) * q.as_subclass(torch.Tensor).sum()

        out = f(x) if mode == "eager" else checkpoint(f, x, state=[q], preserve=mode)
        out.sum().backward()
        results.append((q.as_subclass(torch.Tensor).clone(), lin.weight.grad.clone(), all(seen)))
        lin.weight.grad = None
    assert results[0][2] and results[1][2]
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


# --- second review: one call writing twice; subclasses with their own __torch_function__ -------

def _write_twice(kind: str):
    if kind == "fill_diagonal":
        q = torch.rand(8, dtype=D, generator=torch.Generator().manual_seed(0))
        return q, lambda: q.view(4, 2).fill_diagonal_(0.5, wrap=True)  # one call, two ATen fills
    q = torch.rand(8, dtype=D, generator=torch.Generator().manual_seed(0))  # both statistics on one storage
    return q, lambda: F.instance_norm(torch.randn(2, 4, 5, dtype=D, generator=torch.Generator().manual_seed(1)),
                                      running_mean=q[:4], running_var=q[4:], use_input_stats=True)


@pytest.mark.parametrize("journaled", [False, True])
@pytest.mark.parametrize("kind", ["fill_diagonal", "instance_norm"])
@pytest.mark.parametrize("first,second", [("region", "region"), ("whole", "region"), ("region", "whole"),
                                          ("whole", "whole")])
def test_one_call_that_writes_twice_is_no_gap(kind, first, second, journaled):
    """``journaled``: the whole-snapshot threshold lowered to 0, so region journals ``q`` (8
    float64) and a write the dispatch mode does not settle before the next one is a gap."""
    results = []
    for mode in ("eager", "checkpoint"):
        torch.manual_seed(0)
        q, write = _write_twice(kind)
        if journaled and mode == "checkpoint":
            with journal_every_storage(), JournalSpy() as spy:
                results.append(_two_writes_run(q, write, first, second, mode))
            assert spy.entries > 0 or "region" not in (first, second)
            continue
        results.append(_two_writes_run(q, write, first, second, mode))
    assert all(torch.equal(u, v) for u, v in zip(*results))


def _two_writes_run(q, write, first, second, mode):
    l1, l2 = torch.nn.Linear(4, 4).to(D), torch.nn.Linear(4, 4).to(D)

    def a(x):
        write()
        return torch.tanh(l1(x)) * q[:4].clone()

    def b(x):
        out = torch.tanh(l2(x)) * q[4:].clone()
        q[4:].mul_(0.9)
        return out

    x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(2))
    if mode == "eager":
        ya, yb = a(x), b(x)
    else:
        ya = checkpoint(a, x, state=[q], preserve=first)
        yb = checkpoint(b, x, state=[q], preserve=second)
    ya.square().sum().backward()  # a replays first, then b
    yb.square().sum().backward()
    return l1.weight.grad, l2.weight.grad, q


class _Log(torch.Tensor):
    """Its own ``__torch_function__`` runs every call itself, without looking at ``types``."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        return cls._wrap(out)

    @classmethod
    def _wrap(cls, out):
        return out.as_subclass(cls) if type(out) is torch.Tensor else out


class _FakeQuant(_Log):
    """Runs the op like ``_Log``, then rounds float results to quarters (straight through)."""

    @classmethod
    def _wrap(cls, out):
        if type(out) is torch.Tensor and out.is_floating_point():
            return (out + ((out * 4).round() / 4 - out).detach()).as_subclass(cls)
        return out


@pytest.mark.parametrize("order", ["buffer_first", "subclass_first"])
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_a_subclass_with_its_own_torch_function_still_handles_calls_with_declared_tensors(order, preserve):
    results = []
    for mode in ("eager", preserve):
        torch.manual_seed(0)
        scale = torch.tensor([0.3, 0.7, 1.1], dtype=D)
        w = torch.randn(3, dtype=D, requires_grad=True)

        def f(x):
            xq = (x * w).as_subclass(_FakeQuant)
            y = scale + xq if order == "buffer_first" else xq + scale  # add saves neither input
            scale.mul_(0.5)  # a write to the declared buffer in the same segment
            return y.as_subclass(torch.Tensor)

        x = torch.randn(2, 3, dtype=D, generator=torch.Generator().manual_seed(1))
        out = f(x) if mode == "eager" else checkpoint(f, x, state=[scale], preserve=mode)
        out.sum().backward()
        results.append((out.detach(), w.grad, scale))
    assert all(torch.equal(u, v) for u, v in zip(*results))


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_batch_norm_statistics_are_right_when_a_subclass_input_runs_the_norm_itself(preserve):
    """The subclass's handler runs ``batch_norm`` past the marks, and ``native_batch_norm`` bumps
    no version: running statistics are kept by a whole snapshot even under region."""
    results = []
    for mode in ("eager", preserve):
        torch.manual_seed(0)
        bn = torch.nn.BatchNorm1d(3).to(D)
        x = torch.randn(4, 3, dtype=D).as_subclass(_FakeQuant).requires_grad_()
        out = bn(x) if mode == "eager" else checkpoint(bn, x, state=[bn], preserve=mode)
        out.as_subclass(torch.Tensor).sum().backward()
        results.append((bn.running_mean.clone(), bn.running_var.clone(), x.grad.as_subclass(torch.Tensor)))
    assert all(torch.equal(u, v) for u, v in zip(*results))


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_a_subclass_activation_through_a_declared_batch_norm_keeps_its_class(preserve):
    results = []
    for mode in ("eager", preserve):
        torch.manual_seed(0)
        bn = torch.nn.BatchNorm1d(3).to(D)
        x = torch.randn(4, 3, dtype=D).as_subclass(_Doubling).requires_grad_()
        classes = []

        def f(x):
            y = bn(x)
            classes.append(type(y))
            z = y * 1.0
            z.add_(1.0)  # _Doubling.add_ in eager: adds 2
            return z

        out = f(x) if mode == "eager" else checkpoint(f, x, state=[bn], preserve=mode)
        out.sum().backward()
        results.append((out.detach().as_subclass(torch.Tensor), x.grad.as_subclass(torch.Tensor),
                        bn.running_mean.clone()))
        assert all(issubclass(c, _Doubling) for c in classes)
    assert all(torch.equal(u, v) for u, v in zip(*results))


def test_a_subclass_whose_init_subclass_needs_a_keyword_can_be_declared():
    class NeedsKind(torch.Tensor):
        def __init_subclass__(cls, *, kind, **kw):
            super().__init_subclass__(**kw)
            cls.kind = kind

    results = []
    for mode in ("eager", "region", "whole"):
        q = torch.zeros(3, dtype=D).as_subclass(NeedsKind)
        x = torch.ones(3, dtype=D, requires_grad=True)

        def f(x):
            q.add_(1.0)
            return (x * q.as_subclass(torch.Tensor).clone()).sum()

        (f(x) if mode == "eager" else checkpoint(f, x, state=[q], preserve=mode)).backward()
        results.append((x.grad, q.as_subclass(torch.Tensor).clone(), type(q)))
    for r in results[1:]:
        assert torch.equal(r[0], results[0][0]) and torch.equal(r[1], results[0][1]) and r[2] is NeedsKind


class _RebindsItsBuffer(torch.nn.Module):
    """Rebinds its buffer's storage in the forward (``self.q.data = ...``)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("q", torch.linspace(0, 1, 4))

    def forward(self, x):
        h = torch.tanh(self.lin(x)) * self.q.clone()
        self.q.data = self.q.data * 0.5 + 1
        return h


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_a_block_rebinding_its_buffer_storage_runs_two_micro_batches_before_backward(preserve):
    """The second forward declares the buffer on its new storage: the same thread, not two."""
    results = []
    for mode in ("eager", preserve):
        torch.manual_seed(0)
        a = _RebindsItsBuffer().to(D)
        net = a if mode == "eager" else StatefulCheckpoint(a, preserve=mode)
        x1, x2 = torch.randn(3, 4, dtype=D), torch.randn(3, 4, dtype=D)
        (net(x1).square().sum() + net(x2).square().sum()).backward()
        results.append((a.lin.weight.grad, a.q.clone()))
    assert all(torch.equal(u, v) for u, v in zip(*results))


# --- third review: statistics inside a flat buffer; re-entering handlers; device inference ----

@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_batch_norm_statistics_that_are_views_of_a_declared_flat_buffer(preserve):
    results = []
    for mode in ("eager", preserve):
        torch.manual_seed(0)
        bn = torch.nn.BatchNorm1d(4).to(D)
        flat = torch.zeros(8, dtype=D)
        flat[4:] = 1.0
        bn.running_mean, bn.running_var = flat[:4], flat[4:]
        x = torch.randn(6, 4, dtype=D).as_subclass(_Log).requires_grad_()
        out = bn(x) if mode == "eager" else checkpoint(bn, x, state=[flat, bn.num_batches_tracked], preserve=mode)
        out.as_subclass(torch.Tensor).square().sum().backward()
        results.append((flat.clone(), x.grad.as_subclass(torch.Tensor)))
    assert all(torch.equal(u, v) for u, v in zip(*results))


class _Reenter(torch.Tensor):
    """Unwraps its own instances and calls the function again, torch functions still on."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = tuple(a.as_subclass(torch.Tensor) if type(a) is cls else a for a in args)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("zcls", [torch.Tensor, _Reenter])
def test_a_handler_that_calls_again_is_journaled_once(zcls):
    buf = torch.zeros(SMALL_STORAGE_BYTES // 8 + 1000, dtype=D)
    x = torch.ones(3, dtype=D, requires_grad=True)
    z = torch.ones(100, dtype=D).as_subclass(zcls)

    def f(x):
        buf[:100].add_(z)
        return (x * x).sum()

    before = preservation_stats().journal_bytes
    y = checkpoint(f, x, state=[buf], preserve="region")
    assert preservation_stats().journal_bytes - before == 800  # 100 float64 written, once
    y.backward()
    assert torch.equal(buf[:100], torch.ones(100, dtype=D)) and not buf[100:].any()


def test_device_type_of_cpu_tensors_is_torchs_default_as_in_torch_checkpoint():
    import torch.utils.checkpoint as tuc

    x = torch.ones(2)
    before = tuc.DefaultDeviceType.get_device_type()
    try:
        for default in ("cuda", "cpu"):
            tuc.DefaultDeviceType.set_device_type(default)
            assert _compat.infer_device_type(x, 3) == tuc._infer_device_type(x, 3) == default
            assert _compat.infer_device_type() == tuc._infer_device_type()
    finally:
        tuc.DefaultDeviceType.set_device_type(before)


class _MyNorm(torch.nn.Module):
    """A custom norm module (not a ``_NormBase``) calling ``F.batch_norm`` on its own buffers."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rm", torch.zeros(3, dtype=D))
        self.register_buffer("rv", torch.ones(3, dtype=D))

    def forward(self, x):
        return F.batch_norm(x, self.rm, self.rv, training=True, momentum=0.3)


@pytest.mark.parametrize("preserve", ["whole", "region"])
@pytest.mark.parametrize("how", ["functional", "custom_module"])
def test_statistics_updated_past_the_handler_are_replayed_right(how, preserve):
    """A handler-first subclass runs batch norm past the marks on statistics the scan does not
    know as a norm layer's (no version bump, nothing journaled): small storages are kept whole
    under region too, so both preservers match eager."""
    def run(mode):
        torch.manual_seed(0)
        norm = _MyNorm()
        x = torch.randn(4, 3, dtype=D).as_subclass(_Log).requires_grad_()

        def f(x):
            y = norm(x) if how == "custom_module" else F.batch_norm(x, norm.rm, norm.rv, training=True, momentum=0.3)
            return y.as_subclass(torch.Tensor).square().sum()

        out = f(x) if mode == "eager" else checkpoint(f, x, state=[norm.rm, norm.rv], preserve=mode)
        out.backward()
        return norm.rm.clone(), norm.rv.clone(), x.grad.as_subclass(torch.Tensor)

    assert all(torch.equal(u, v) for u, v in zip(run(preserve), run("eager")))


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_a_hidden_update_beside_journaled_bytes_of_the_same_storage_is_replayed_right(preserve):
    """A seen write to part of the statistics and a hidden update of all of them."""
    def run(mode):
        rm, rv = torch.zeros(3, dtype=D), torch.ones(3, dtype=D)
        x = torch.randn(4, 3, dtype=D, generator=torch.Generator().manual_seed(0)).as_subclass(_Log).requires_grad_()

        def f(x):
            rm[0:1].zero_()
            rv[0:1].fill_(1.0)
            y = F.batch_norm(x, rm, rv, training=True, momentum=0.3)  # past the handler: all of it
            return y.as_subclass(torch.Tensor).square().sum()

        out = f(x) if mode == "eager" else checkpoint(f, x, state=[rm, rv], preserve=mode)
        out.backward()
        return rm, rv, x.grad.as_subclass(torch.Tensor)

    assert all(torch.equal(u, v) for u, v in zip(run(preserve), run("eager")))


@pytest.mark.parametrize("replayed", [True, False])
def test_a_version_bumping_write_past_the_handler_is_a_gap_refused_at_the_replay_only(replayed):
    b = torch.zeros(SMALL_STORAGE_BYTES // 8 + 3, dtype=D)[:3]  # a journaled storage
    w = torch.randn(3, dtype=D, requires_grad=True)
    x = torch.randn(4, 3, dtype=D).as_subclass(_Log)

    def f(x, w):
        with torch.no_grad():
            torch.add(x.mean(0), b, out=b)  # handler-first subclass: unseen, but the version bumps
        return (x * w).as_subclass(torch.Tensor).sum()

    out = checkpoint(f, x, w, state=[b], preserve="region")  # not refused at the forward
    if replayed:
        with pytest.raises(ReplayError, match="version gap"):
            out.backward()
    else:
        (w * 2).sum().backward()  # the segment is never replayed: nothing to refuse
        assert b._version == 1


def test_a_version_bumping_write_past_the_handler_to_a_small_storage_is_replayed_right():
    def run(mode):
        b = torch.zeros(3, dtype=D)  # kept whole under region: no journal to miss the write
        w = torch.ones(3, dtype=D, requires_grad=True)
        x = torch.randn(4, 3, dtype=D, generator=torch.Generator().manual_seed(0)).as_subclass(_Log)

        def f(x, w):
            with torch.no_grad():
                torch.add(x.mean(0), b, out=b)
            return (x * w * b).as_subclass(torch.Tensor).sum()

        out = f(x, w) if mode == "eager" else checkpoint(f, x, w, state=[b], preserve=mode)
        out.backward()
        return b, w.grad

    want = run("eager")
    for mode in ("region", "whole"):
        assert all(torch.equal(u, v) for u, v in zip(run(mode), want))
