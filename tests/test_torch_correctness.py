"""Issue 13: every pattern that gave a silent wrong result, with its neighbours.

Each small input from the issue is a test with the right value (eager autograd, float64,
bitwise unless stated); each kind is parametrized over both preservers and, where it applies,
nesting and other write ops. A pattern ends either exactly right or in a clear error.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch import nn

import stateremat
from _journal import JournalSpy, journal_every_storage
from stateremat.torch import (
    Checkpointer,
    ReplayError,
    StatefulCheckpoint,
    UndeclaredStateError,
    UndeclaredStateWarning,
    UnsupportedError,
    checkpoint,
    is_replaying,
)

PRESERVERS = ["region", "whole"]
D = torch.float64


# ---- 1. library keywords never swallow the function's own keywords -------------------------
def _cell(x, state=None):
    return torch.tanh(x if state is None else x + state)


def test_configured_checkpoint_passes_state_on_to_fn():
    x = torch.tensor([0.5, -1.0, 2.0], dtype=D, requires_grad=True)
    h = torch.tensor(2.0, dtype=D)
    y = Checkpointer()(_cell, x, state=h)
    assert torch.allclose(y, torch.tensor([0.9866, 0.7616, 0.9993], dtype=D), atol=1e-4)
    assert torch.equal(y, _cell(x, state=h))
    (g,) = torch.autograd.grad(y.sum(), x)
    (g_ref,) = torch.autograd.grad(_cell(x, state=h).sum(), x)
    assert torch.equal(g, g_ref)


@pytest.mark.parametrize("kw", ["state", "preserve", "verify", "granularity_bytes", "on_undeclared"])
def test_checkpoint_refuses_fn_that_declares_a_stateremat_keyword(kw):
    fn = eval(f"lambda x, {kw}=None: x * 2")  # noqa: S307 - builds a signature
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(TypeError, match=rf"declares parameter\(s\) \['{kw}'\].*Checkpointer"):
        checkpoint(fn, x)
    # torch's signature: every keyword torch does not reserve reaches fn
    y = Checkpointer()(fn, x, **{kw: None})
    assert torch.equal(y, x * 2)


def test_module_forward_keywords_and_partials():
    class Cell(nn.Module):
        def forward(self, x, state=None):
            return _cell(x, state)

    x = torch.tensor([0.5, -1.0, 2.0], dtype=D, requires_grad=True)
    h = torch.tensor(2.0, dtype=D)
    with pytest.raises(TypeError, match="Checkpointer"):
        checkpoint(Cell(), x, state=h)
    assert torch.equal(StatefulCheckpoint(Cell())(x, state=h), _cell(x, h))
    assert torch.equal(Checkpointer()(functools.partial(_cell, state=h), x), _cell(x, h))


def test_torch_reserved_keywords_are_not_passed_to_fn():
    seen = {}

    def fn(x, **kwargs):
        seen.update(kwargs)
        return x * 2

    x = torch.ones(2, requires_grad=True)
    for ck in (checkpoint, Checkpointer()):
        seen.clear()
        ck(fn, x, early_stop=False, preserve_rng_state=True, debug=False, use_reentrant=False,
           determinism_check="default", other=1).sum().backward()
        assert seen == {"other": 1}


# ---- 2. state reached by rebinding ---------------------------------------------------------
class _Rebind(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.ones((), dtype=D))
        self.register_buffer("m", torch.zeros((), dtype=D))

    def forward(self, x):
        y = self.w * x * (1 + self.m)
        if self.how == "assign":
            self.m = self.m + 1
        elif self.how == "data":
            self.m.data = self.m + 1
        elif self.how == "register":
            self.register_buffer("m", self.m + 1)
        return y


@pytest.mark.parametrize("how", ["assign", "data", "register"])
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("wrap", ["function", "module", "nested"])
def test_rebinding_a_declared_buffer_replays_the_forward_binding(how, preserve, wrap):
    m = _Rebind(how)
    x = torch.tensor(3.0, dtype=D)
    if wrap == "function":
        y = checkpoint(m, x, state="buffers", preserve=preserve)
    elif wrap == "module":
        y = StatefulCheckpoint(m, preserve=preserve)(x)
    else:
        y = checkpoint(lambda t: checkpoint(m, t, state="buffers", preserve=preserve) * 1.0, x, state=[m],
                       preserve=preserve)
    y.backward()
    assert m.w.grad.item() == 3.0  # d(w x (1 + m0))/dw with m0 = 0
    assert m.m.item() == 1.0  # rebound once


# ---- 3. nesting ----------------------------------------------------------------------------
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_inner_declaration_does_not_cover_the_outer_segments_own_write(preserve):
    b = torch.zeros((), dtype=D)
    w = torch.ones((), dtype=D, requires_grad=True)
    x = torch.tensor(3.0, dtype=D)

    def inner(h):
        y = h * (1 + b)
        b.add_(1)
        return y

    def outer(x):
        h = w * x * (1 + b)
        b.add_(1)
        return checkpoint(inner, h, state=[b], preserve=preserve)

    with pytest.raises(UndeclaredStateError, match=r"captured variable 'b'.*before the inner segment"):
        checkpoint(outer, x, state=[])


@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("reentrant", [False, True])
def test_torch_checkpoint_inside_a_stateful_segment_is_refused_not_doubled(preserve, reentrant):
    bn = nn.BatchNorm1d(3).double()
    x = torch.randn(4, 3, dtype=D, requires_grad=True)

    def body(h):
        return tuc.checkpoint(bn, h * 2, use_reentrant=reentrant)

    y = checkpoint(body, x, state=[bn], preserve=preserve)
    # torch's frame replays bn again during backward, outside our transaction: refused there
    with pytest.raises(ReplayError, match="torch.utils.checkpoint recomputes"):
        y.sum().backward()


def test_stateful_segment_inside_torch_checkpoint_is_refused():
    bn = nn.BatchNorm1d(3).double()
    x = torch.randn(4, 3, dtype=D, requires_grad=True)
    y = tuc.checkpoint(lambda h: checkpoint(bn, h, state=[bn]) * 2, x, use_reentrant=False)
    with pytest.raises(ReplayError, match="recomputed by torch.utils.checkpoint"):
        y.sum().backward()


@pytest.mark.parametrize("outer_preserve", PRESERVERS)
@pytest.mark.parametrize("inner_preserve", PRESERVERS)
def test_nested_stateful_segments_update_once(outer_preserve, inner_preserve):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout(0.3)).double()
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout(0.3)).double()
    net.load_state_dict(ref.state_dict())
    x = torch.randn(6, 3, dtype=D, requires_grad=True)
    torch.manual_seed(1)
    (g_ref,) = torch.autograd.grad(ref(x).pow(2).sum(), x)

    def outer(t):
        h = net[0](t)
        return checkpoint(lambda u: net[2](net[1](u)), h, state=[net[1]], preserve=inner_preserve)

    torch.manual_seed(1)
    (g,) = torch.autograd.grad(checkpoint(outer, x, state=[net], preserve=outer_preserve).pow(2).sum(), x)
    assert torch.equal(g, g_ref)
    assert torch.equal(net[1].running_mean, ref[1].running_mean)
    assert int(net[1].num_batches_tracked) == 1


# ---- 4. writes that bump no version counter, outside any segment ----------------------------
@pytest.mark.parametrize("journaled", [False, True])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_batch_norm_outside_any_segment_is_journaled(preserve, journaled):
    """``journaled``: the whole-snapshot threshold lowered to 0 (the statistics are 8 bytes), so
    under region the update outside the segment must really be journaled (asserted)."""
    with journal_every_storage() if journaled else contextlib.nullcontext(), JournalSpy() as spy:
        W = torch.ones((), dtype=D, requires_grad=True)
        rm, rv = torch.zeros((), dtype=D).reshape(1), torch.ones(1, dtype=D)
        x = torch.tensor([3.0], dtype=D)
        y = checkpoint(lambda x: W * x * (1 + rm), x, state=[rm, rv], preserve=preserve)
        z = torch.tensor([[5.0], [7.0]], dtype=D)
        F.batch_norm(z, rm, rv, training=True, momentum=1.0)  # sets rm = 6 without a version bump
        assert rm.item() == 6.0
        y.sum().backward()
    assert W.grad.item() == 3.0
    assert rm.item() == 6.0
    if journaled and preserve == "region":
        assert spy.entries >= 2  # both statistics' old bytes


# ---- 5. the region journal below the default granularity ------------------------------------
@pytest.mark.parametrize("granularity", [8, 64, 100, 256, 4096])
def test_scattered_index_fill_below_the_default_granularity(granularity):
    buf = torch.zeros(4096, dtype=D)
    w = torch.ones((), dtype=D, requires_grad=True)

    def f(w):
        y = (w * buf).sum() + 2 * w
        buf.index_fill_(0, torch.arange(0, 4096, 97), 1.0)
        return y

    y = checkpoint(f, w, state=[buf], preserve="region", granularity_bytes=granularity)
    y.backward()
    assert w.grad.item() == 2.0
    assert buf.sum().item() == 43.0


# ---- 6. library ops never leak into the user's dispatch modes --------------------------------
def _sac():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_selective_checkpoint_policy_with_batch_norm_state(preserve):
    x = torch.randn(6, 4, dtype=D, requires_grad=True)
    W = torch.randn(4, 4, dtype=D, requires_grad=True)
    rm, rv = torch.zeros(4, dtype=D), torch.ones(4, dtype=D)
    ref_rm, ref_rv = rm.clone(), rv.clone()
    g_ref = torch.autograd.grad(F.batch_norm(x @ W, ref_rm, ref_rv, training=True).pow(2).sum(), (x, W))
    y = checkpoint(lambda a: F.batch_norm(a @ W, rm, rv, training=True), x, state=[rm, rv], preserve=preserve,
                   context_fn=_sac)
    g = torch.autograd.grad(y.pow(2).sum(), (x, W))
    assert all(torch.equal(a, b) for a, b in zip(g, g_ref))
    assert torch.equal(rm, ref_rm) and torch.equal(rv, ref_rv)


def test_selective_checkpoint_policy_with_verify():
    x = torch.randn(5, dtype=D, requires_grad=True)
    y = checkpoint(lambda a: a.sin().cos(), x, context_fn=_sac, verify=True)
    (g,) = torch.autograd.grad(y.sum(), x)
    (g_ref,) = torch.autograd.grad(x.sin().cos().sum(), x)
    assert torch.equal(g, g_ref)


# ---- 8. tensor subclasses without a data pointer ---------------------------------------------
def test_wrapper_subclass_input_without_declared_state():
    from torch.testing._internal.two_tensor import TwoTensor

    x = TwoTensor(torch.zeros(1), torch.zeros(1)).requires_grad_()
    (g,) = torch.autograd.grad(checkpoint(torch.exp, x).sum(), x)
    assert torch.equal(g.a, torch.ones(1)) and torch.equal(g.b, torch.ones(1))


# ---- 9. random draws from a user-owned generator ---------------------------------------------
@pytest.mark.parametrize("how", ["captured", "argument", "declared", "module attribute"])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_user_generator_is_replayed(how, preserve):
    x = torch.ones(8, dtype=D, requires_grad=True)
    g_ref = torch.Generator().manual_seed(7)
    mask = torch.rand(8, generator=g_ref) >= 0.5
    g = torch.Generator().manual_seed(7)
    holder = nn.Module()
    holder.gen = g

    def draw(x, gen):
        return x * (torch.rand(x.shape, generator=gen) >= 0.5)

    if how == "captured":
        y = checkpoint(lambda x: draw(x, g), x, preserve=preserve)
    elif how == "argument":
        y = checkpoint(draw, x, g, preserve=preserve)
    elif how == "declared":
        y = checkpoint(functools.partial(_draw_from_global, gen_box=[g]), x, state=[g], preserve=preserve)
    else:
        y = checkpoint(lambda x: draw(x, holder.gen), x, preserve=preserve)
    y.sum().backward()
    assert torch.equal(x.grad, mask.to(D))
    assert torch.equal(g.get_state(), g_ref.get_state())


def _draw_from_global(x, gen_box):
    return x * (torch.rand(x.shape, generator=gen_box[0]) >= 0.5)


# ---- 10. Python side effects know they are being replayed ------------------------------------
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_forward_hook_guarded_by_is_replaying_fires_once(preserve):
    calls, guarded = [], []
    lin = nn.Linear(3, 3).double()
    lin.register_forward_hook(lambda m, i, o: calls.append(1))
    lin.register_forward_hook(lambda m, i, o: None if is_replaying() else guarded.append(1))
    assert not is_replaying()
    x = torch.randn(2, 3, dtype=D, requires_grad=True)
    checkpoint(lambda t: lin(t).sin(), x, preserve=preserve).sum().backward()
    assert len(calls) == 2 and len(guarded) == 1  # the plain hook fires again at replay


# ---- 11. on_undeclared="warn" warns every time it lets a repeated write through -------------
def test_warn_mode_warns_in_forward_and_at_replay():
    Dict = {"t": torch.zeros(())}
    x = torch.ones(2, requires_grad=True)

    def seg(x):
        Dict["t"].add_(1)
        return x.exp()

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        checkpoint(seg, x, on_undeclared="warn").sum().backward()
    msgs = [str(w.message) for w in rec if issubclass(w.category, UndeclaredStateWarning)]
    assert len(msgs) == 2 and all("captured variable 'Dict'['t']" in m or "global 'Dict'['t']" in m for m in msgs)
    assert Dict["t"].item() == 2.0  # the replay repeated it, as the warning says


# ---- 12. drop-in parity with torch's non-reentrant checkpoint ---------------------------------
def test_early_stop_is_honoured(fresh_runtime):
    # a fresh runtime: once any auto forward wrote state no scan reaches, auto replays run on
    # past the early-stop point for the rest of the thread (Runtime.unreached_writes)
    counts = []

    def fn(x):
        a = x.sin().exp()  # the last saved tensor is packed inside exp
        counts.append(1)  # reached at recomputation only without early stop
        return a

    x = torch.ones(2, requires_grad=True)
    for early, expected in [(True, 1), (False, 2)]:
        counts.clear()
        checkpoint(fn, x, early_stop=early).sum().backward()
        assert len(counts) == expected
        counts.clear()
        Checkpointer()(fn, x, early_stop=early).sum().backward()
        assert len(counts) == expected
    counts.clear()
    with tuc.set_checkpoint_early_stop(False):
        y = checkpoint(fn, x)
    y.sum().backward()
    assert len(counts) == 2


def test_debug_lists_the_operators_of_both_runs():
    flag = [True]

    def fn(x):
        y = x.sin()
        if flag[0]:
            y = y.cos()
        return y

    x = torch.ones(2, requires_grad=True)
    y = checkpoint(fn, x, debug=True)
    flag[0] = False
    with pytest.raises(ReplayError, match=r"(?s)different number.*original forward.*aten\.cos.*recomputation"):
        y.sum().backward()
    flag[0] = True
    with tuc.set_checkpoint_debug_enabled(True):
        y = checkpoint(fn, x)
    flag[0] = False
    with pytest.raises(ReplayError, match=r"(?s)aten\.cos"):
        y.sum().backward()


def test_every_replay_error_is_a_torch_checkpoint_error():
    x = torch.ones(2, requires_grad=True)
    flag = [True]
    y = checkpoint(lambda t: t.sin().cos() if flag[0] else t.sin(), x)
    flag[0] = False
    with pytest.raises(tuc.CheckpointError):
        y.sum().backward()
    assert issubclass(stateremat.torch._errors.UndeclaredStateError, tuc.CheckpointError)
    with pytest.raises(tuc.CheckpointError):
        checkpoint(lambda t: Dict0["t"].add_(1) * t, x, state=None)
    assert isinstance(UndeclaredStateError("x"), stateremat.ReplayError)


Dict0 = {"t": torch.zeros(2)}


@pytest.mark.parametrize("state", [[1], "bufers", [torch.zeros(1), "x"], object()])
def test_bad_state_is_refused_at_construction(state):
    with pytest.raises((TypeError, ValueError), match="state"):
        StatefulCheckpoint(nn.Linear(2, 2), state=state)
    with pytest.raises((TypeError, ValueError), match="state"):
        Checkpointer(state=state)


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_generators_after_the_step_are_the_callers_with_draws_between_forward_and_backward(preserve):
    # R5 for randomness: the replay draws from R0, then the caller's generators are reinstated,
    # so draws made between forward and backward (and after) continue exactly as in eager.
    g = torch.Generator().manual_seed(3)

    def seg(t):
        return t * (torch.rand(t.shape, dtype=D) > 0.5) * torch.rand(t.shape, generator=g, dtype=D)

    def run(wrap):
        torch.manual_seed(5)
        g.manual_seed(3)
        x = torch.ones(16, dtype=D, requires_grad=True)
        y = wrap(seg, x)
        between = (torch.rand(4), torch.rand(4, generator=g))  # draws between forward and backward
        y.sum().backward()
        return x.grad, between, torch.get_rng_state(), g.get_state()

    ref = run(lambda f, x: f(x))
    got = run(lambda f, x: checkpoint(f, x, preserve=preserve))
    assert torch.equal(got[0], ref[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))
    assert torch.equal(got[2], ref[2]) and torch.equal(got[3], ref[3])


@pytest.mark.parametrize("outer", PRESERVERS)
@pytest.mark.parametrize("inner", PRESERVERS)
def test_nested_segments_that_read_what_they_write(outer, inner):
    # Both segments read declared state before writing it, so every replay needs its own B0.
    b = torch.zeros(3, dtype=D)
    w = torch.ones((), dtype=D, requires_grad=True)
    x = torch.tensor([1.0, 2.0, 3.0], dtype=D)

    def inner_fn(h):
        y = (h * (1 + b.clone())).sum()
        b.add_(1)
        return y

    def outer_fn(x):
        h = w * x * (2 + b.clone())
        b.mul_(3)
        return checkpoint(inner_fn, h, state=[b], preserve=inner) * (1 + b.clone()).sum()

    y = checkpoint(outer_fn, x, state=[b], preserve=outer)
    y.backward()
    b0 = torch.zeros(3, dtype=D)
    w0 = torch.ones((), dtype=D, requires_grad=True)
    h = w0 * x * (2 + b0)
    b1 = b0 * 3
    ref = (h * (1 + b1)).sum() * (1 + (b1 + 1)).sum()
    (g,) = torch.autograd.grad(ref, w0)
    assert torch.equal(w.grad, g)
    assert torch.equal(b, b1 + 1)


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_replay_that_writes_elsewhere_leaves_no_trace(preserve):
    # Python state read by the segment changed between forward and replay (a step counter), so
    # the replay writes another row than the forward did; reinstatement must undo it too (R5).
    buf = torch.zeros(4, 2, dtype=D)
    counter = [0]
    w = torch.ones((), dtype=D, requires_grad=True)

    def seg(w):
        buf[counter[0]] = 7.0  # before the reads: the replay (early stop) reaches it
        return (w * buf.clone()).sum() + w

    y = checkpoint(seg, w, state=[buf], preserve=preserve)
    counter[0] = 2  # the replay writes row 2
    y.backward()
    expected = torch.zeros(4, 2, dtype=D)
    expected[0] = 7.0
    assert torch.equal(buf, expected)
    assert w.grad.item() == 15.0  # 2 x 7 + 1, whichever row holds the 7s


# ---- review: writes no version counter of the tensor sees --------------------------------------
class _EMA(nn.Module):
    def __init__(self, n, how):
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.ones(n, dtype=D))
        self.register_buffer("ema", torch.ones(n, dtype=D))

    def forward(self, x):
        if self.how == "data_inplace":
            self.ema.data.mul_(0.5).add_(x.detach(), alpha=0.5)  # .data has its own version counter
        else:  # "data_rebind": MoCo's momentum update
            self.ema.data = self.ema.data * 0.5 + x.detach() * 0.5
        return (self.w * x * self.ema).sum()


@pytest.mark.parametrize("n", [8, 65536, 65537, 1 << 20])
@pytest.mark.parametrize("how", ["data_inplace", "data_rebind"])
def test_undeclared_writes_through_data_are_refused_at_any_size(n, how):
    x = torch.full((n,), 3.0, dtype=D)
    m = _EMA(n, how)
    with pytest.raises(UndeclaredStateError, match=r"buffer 'ema'"):
        checkpoint(m, x, state=None)  # strict mode
    assert m.ema[0].item() == 2.0  # made once, as eager would
    ok = _EMA(n, how)  # declared: exact
    checkpoint(ok, x, state="buffers").backward()
    ref = _EMA(n, how)
    ref(x).backward()
    assert torch.equal(ok.w.grad, ref.w.grad) and torch.equal(ok.ema, ref.ema)


class _Rebinder(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.w = nn.Parameter(torch.ones(3, dtype=D))
        if kind == "buffer":
            self.register_buffer("m", torch.ones(3, dtype=D))
        elif kind == "plain_attr":
            self.m = torch.ones(3, dtype=D)

    def forward(self, x):
        if self.kind == "new_buffer":
            if not hasattr(self, "m"):
                self.register_buffer("m", torch.ones(3, dtype=D))
            self.m.add_(1)
        else:
            self.m = self.m + 1
        return (self.w * x * self.m).sum()


@pytest.mark.parametrize("kind,state,exact", [
    ("buffer", None, False), ("buffer", "tensor", True), ("buffer", "buffers", True),
    ("plain_attr", "buffers", True), ("plain_attr", "module", True), ("plain_attr", None, False),
    ("new_buffer", "buffers", True), ("new_buffer", None, False)])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_rebinding_is_replayed_when_declared_and_refused_when_not(kind, state, exact, preserve):
    x = torch.ones(3, dtype=D)
    ref = _Rebinder(kind)
    ref(x).backward()
    m = _Rebinder(kind)
    st = {"tensor": [getattr(m, "m", None)], "module": [m]}.get(state, state)
    if not exact:
        with pytest.raises(UndeclaredStateError, match=r"'m'"):
            checkpoint(m, x, state=st, preserve=preserve)
        return
    checkpoint(m, x, state=st, preserve=preserve).backward()
    assert torch.equal(m.w.grad, ref.w.grad) and torch.equal(m.m, ref.m)


class _Deep:
    def __init__(self, depth):
        self.g = torch.Generator().manual_seed(3) if depth == 0 else None
        self.inner = _Deep(depth - 1) if depth else None


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_generator_a_few_plain_objects_deep_is_replayed(depth):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(8, dtype=D))
            self.cfg = _Deep(depth)

        def gen(self):
            o = self.cfg
            while o.g is None:
                o = o.inner
            return o.g

        def forward(self, x):
            return (self.w * x * (torch.rand(8, generator=self.gen()) > 0.5)).sum()

    x = torch.arange(1.0, 9.0, dtype=D)
    ref, m = M(), M()
    ref(x).backward()
    checkpoint(m, x, state="buffers").backward()
    assert torch.equal(m.w.grad, ref.w.grad)
    assert torch.equal(m.gen().get_state(), ref.gen().get_state())


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_parameters_changed_between_forward_and_backward_are_refused(preserve):
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    y = checkpoint(m, torch.randn(3, 4, dtype=D), state="buffers", preserve=preserve).sum()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(2)  # an optimizer step before backward
    with pytest.raises(ReplayError, match=r"parameter '0.weight'.*changed in place between its forward"):
        y.backward()


@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("how", ["set_", "data"])
def test_declared_tensor_rebound_after_the_forward_is_refused(preserve, how):
    q = torch.arange(4.0, dtype=D)
    w = torch.ones(4, dtype=D, requires_grad=True)
    y = checkpoint(lambda w: (w * q.clone()).sum(), w, state=[q], preserve=preserve)
    other = torch.full((4,), 9.0, dtype=D)
    if how == "set_":
        q.set_(other)
    else:
        q.data = other
    with pytest.raises(ReplayError, match=r"now uses another storage"):
        y.backward()


class _Sub(torch.Tensor):  # a plain subclass (torch's own __torch_function__)
    pass


@pytest.mark.parametrize("journaled", [False, True])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_plain_tensor_subclass_buffer_journals_writes_after_the_forward(preserve, journaled):
    """``journaled``: the whole-snapshot threshold lowered to 0, so region journals the buffer."""
    def run(wrap):
        m = nn.Module()
        m.register_buffer("q", torch.arange(24.0, dtype=D).reshape(8, 3).as_subclass(_Sub))
        w = torch.ones(3, dtype=D, requires_grad=True)

        def f(x):
            out = (x * w * m.q.clone()).sum()
            m.q[:2] = 0.0
            return out

        loss = wrap(f, torch.ones(3, dtype=D), m)
        with torch.no_grad():
            m.q[3:6].mul_(2)  # through the declared tensor, outside any segment
        loss.backward()
        return w.grad, m.q.clone()

    ref = run(lambda f, x, m: f(x))
    with journal_every_storage() if journaled else contextlib.nullcontext(), JournalSpy() as spy:
        got = run(lambda f, x, m: checkpoint(f, x, state=[m], preserve=preserve))
    if journaled and preserve == "region":
        assert spy.entries >= 2  # the segment's write and the one after the forward
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1].as_subclass(torch.Tensor),
                                                       ref[1].as_subclass(torch.Tensor))


def test_profile_restores_generators_and_containers_the_model_holds():
    from stateremat.torch import profile

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.g = torch.Generator().manual_seed(1)
            self.seen = [0]

        def forward(self, x):
            self.seen.append(1)
            return self.lin(x) * (torch.rand(8, generator=self.g) > 0.2)

    model = nn.Sequential(Block(), Block())
    states = [b.g.get_state() for b in model]
    profile(model, ["0", "1"], torch.randn(4, 8), repeats=1)
    assert all(torch.equal(b.g.get_state(), s) for b, s in zip(model, states))
    assert all(b.seen == [0] for b in model)


@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_the_lazy_modules_tip_followed_gives_eager_results(preserve):
    """The lazy-module refusal's tip (one forward in evaluation mode without gradients) only
    materializes the parameters: the BatchNorm statistics stay as built (the tip's old wording,
    a forward in training mode, updated them), and checkpointed training from there equals eager
    training from the same materialized model, bit for bit."""
    torch.manual_seed(0)
    got = nn.Sequential(nn.LazyLinear(4), nn.LazyBatchNorm1d(), nn.Dropout(0.2), nn.Tanh(), nn.Linear(4, 2)).double()
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match=r"lazy") as exc:
        checkpoint(got, x.clone().requires_grad_(), preserve=preserve)
    assert "model.eval(); with torch.no_grad(): model(x); model.train()" in str(exc.value)
    got.eval()  # the tip
    with torch.no_grad():
        got(x)
    got.train()
    bn = got[1]
    assert torch.equal(bn.running_mean, torch.zeros(4, dtype=torch.float64))
    assert torch.equal(bn.running_var, torch.ones(4, dtype=torch.float64)) and int(bn.num_batches_tracked) == 0
    ref = copy.deepcopy(got)
    for step in range(3):
        torch.manual_seed(step)
        xr = (x + step).requires_grad_()
        ref(xr).pow(2).sum().backward()
        torch.manual_seed(step)
        xg = (x + step).requires_grad_()
        checkpoint(got, xg, preserve=preserve).pow(2).sum().backward()
        assert torch.equal(xr.grad, xg.grad)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(ref.parameters(), got.parameters()))
        assert all(torch.equal(a, b) for a, b in zip(ref.buffers(), got.buffers()))
        ref.zero_grad()
        got.zero_grad()


def test_clear_errors_for_lazy_modules_and_too_many_sequential_segments():
    from stateremat.torch import checkpoint_sequential

    with pytest.raises(ValueError, match=r"lazy.*run one forward"):
        checkpoint(nn.LazyLinear(3), torch.ones(2, 4, requires_grad=True))
    with pytest.raises(ValueError, match=r"segments=20 exceeds the number of functions \(3\)"):
        checkpoint_sequential(nn.Sequential(nn.Tanh(), nn.Tanh(), nn.Tanh()), 20, torch.ones(2, requires_grad=True))
    wrapped = StatefulCheckpoint(nn.Sequential(nn.Tanh(), nn.ReLU()))
    wrapped[1] = nn.Sigmoid()
    assert len(wrapped) == 2 and isinstance(list(wrapped)[1], nn.Sigmoid)


# ---- state reached by any path the forward can take (user review of issue 14) --------------
class _Bag:  # a plain object holding state
    def __init__(self):
        self.t = torch.zeros(3, dtype=D)
        self.g = torch.Generator().manual_seed(5)


_GLOBAL_BAG = _Bag()
_FN_BAG = _Bag()


def _global_fetch():  # a global helper function that loads a global of its own
    return _FN_BAG


class _Fetch:  # a callable object (not a module) holding state
    def __init__(self, bag):
        self.bag = bag

    def __call__(self):
        return self.bag


def _bag_self(bag):  # a method of a plain object, bound
    return bag


_Bag.me = _bag_self


class _Holder(nn.Module):
    """One block whose state sits at ``path``; ``op`` is an in-place write, a rebinding or a draw."""

    table = torch.zeros(3, dtype=D)  # a class attribute
    bag = _Bag()

    def __init__(self, path, op, parent=None):
        super().__init__()
        self.path, self.op = path, op
        self.w = nn.Parameter(torch.ones(3, dtype=D))
        if path == "underscore":
            self._t, self._g = torch.zeros(3, dtype=D), torch.Generator().manual_seed(5)
        elif path == "plain_object":
            self.mem = _Bag()
        elif path == "underscore_plain_object":
            self._mem = _Bag()
        elif path == "list_in_object":
            self.mem = _Bag()
            self.mem.t = [torch.zeros(3, dtype=D)]
        elif path == "unregistered_module":
            object.__setattr__(self, "parent", parent)
        elif path == "helper_closure":
            bag = _Bag()
            self.fetch = lambda: bag  # a helper closing over the state
        elif path == "callable_object":
            self.fetch = _Fetch(_Bag())
        elif path == "bound_method":
            self.fetch = _Bag().me

    def _get(self):
        return {"underscore": lambda: (self, "_t", "_g"), "plain_object": lambda: (self.mem, "t", "g"),
                "underscore_plain_object": lambda: (self._mem, "t", "g"),
                "global_object": lambda: (_GLOBAL_BAG, "t", "g"),
                "class_object": lambda: (type(self).bag, "t", "g"),
                "list_in_object": lambda: (self.mem.t, 0, None),
                "class_tensor": lambda: (type(self), "table", None),
                "unregistered_module": lambda: (self.parent, "count", None),
                "helper_closure": lambda: (self.fetch(), "t", "g"),
                "callable_object": lambda: (self.fetch(), "t", "g"),
                "bound_method": lambda: (self.fetch(), "t", "g"),
                "global_function": lambda: (_global_fetch(), "t", "g")}[self.path]()

    def forward(self, x):
        obj, name, gname = self._get()
        t = obj[name] if isinstance(obj, list) else getattr(obj, name)
        if self.op == "draw":
            return (self.w * x * (torch.rand(3, generator=getattr(obj, gname), dtype=D) > 0.5)).sum()
        y = (self.w * x * (1 + t)).sum()
        if self.op == "write":
            t.add_(1)
        else:  # rebind
            new = t + 1
            obj.__setitem__(name, new) if isinstance(obj, list) else setattr(obj, name, new)
        return y


def _holder_pair(path, op):
    def one():
        torch.manual_seed(0)
        parent = nn.Module()
        parent.register_buffer("count", torch.zeros(3, dtype=D))
        if path == "global_object":
            _GLOBAL_BAG.__init__()
        if path == "global_function":
            _FN_BAG.__init__()
        if path.startswith("class_"):
            _Holder.table, _Holder.bag = torch.zeros(3, dtype=D), _Bag()
        return _Holder(path, op, parent)
    return one


_PATHS = ["underscore", "plain_object", "underscore_plain_object", "global_object", "class_object",
          "list_in_object", "class_tensor", "unregistered_module",
          # through callables (attack review): a helper's closure, a callable object, a bound
          # method of a plain object, a global function's own global
          "helper_closure", "callable_object", "bound_method", "global_function"]


@pytest.mark.parametrize("path", _PATHS)
@pytest.mark.parametrize("op", ["write", "rebind", "draw"])
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("state", [None, "auto"])
def test_state_reached_by_any_path_is_replayed_or_refused(path, op, preserve, nested, state):
    """Strict mode (``state=None``) refuses every write it did not declare; the default
    (``state="auto"``) preserves it and replays exactly, as eager, at every path."""
    if op == "draw" and path in ("list_in_object", "class_tensor", "unregistered_module"):
        pytest.skip("no generator on this path")
    x = torch.arange(1.0, 4.0, dtype=D)
    make = _holder_pair(path, op)
    ref = make()
    ref(x).backward()
    want = (ref.w.grad.clone(), ref._get())
    m = make()
    def run():
        if nested:
            return checkpoint(lambda x: checkpoint(m, x, preserve=preserve, state=state), x, preserve=preserve,
                              state=state)
        return checkpoint(m, x, preserve=preserve, state=state)

    if op == "draw":  # generators are captured and replayed: exactly eager
        run().backward()
        assert torch.equal(m.w.grad, want[0])
        assert torch.equal(getattr(m._get()[0], m._get()[2]).get_state(),
                           getattr(want[1][0], want[1][2]).get_state())
        return
    if state == "auto" or (op == "rebind" and path in _REBIND_REPLAYED):  # preserved / bound as of the forward
        run().backward()
        obj, name, _ = m._get()
        assert torch.equal(m.w.grad, want[0])
        now = obj[name] if isinstance(obj, list) else getattr(obj, name)
        ref_now = want[1][0][name] if isinstance(want[1][0], list) else getattr(want[1][0], name)
        assert torch.equal(now, ref_now)  # written / rebound once, as eager
        return
    with pytest.raises(UndeclaredStateError, match=r"not declared state|rebound|rebinds|bound"):
        run().backward()


#: Paths whose tensor rebinding the replay binds as of the forward's start even in strict mode
#: (issue 25, item 2): lists, dicts, plain objects, classes and globals; a module's own tensor
#: attribute and a buffer of an unregistered module are refused there (replayed under "auto").
_REBIND_REPLAYED = {"list_in_object", "plain_object", "underscore_plain_object", "global_object", "class_object", "class_tensor",
                    "helper_closure", "callable_object", "bound_method", "global_function"}


@pytest.mark.parametrize("path", _PATHS)
def test_profile_puts_back_state_reached_by_any_path(path):
    from stateremat.torch import profile

    make = _holder_pair(path, "write")
    model = nn.Sequential(make(), make())

    def state():
        out = []
        for b in model:
            obj, name, gname = b._get()
            t = obj[name] if isinstance(obj, list) else getattr(obj, name)
            out.append((t, t.clone(), getattr(obj, gname).get_state() if gname else None))
        return out

    before = state()
    profile(model, ["0", "1"], lambda mdl: mdl(torch.ones(3, dtype=D)).backward(), repeats=1,
            options=["eager", "whole"], on_undeclared="declare")
    for (t0, v0, g0), (t1, v1, g1) in zip(before, state()):
        assert t1 is t0 and torch.equal(t1, v0)
        assert g0 is None or torch.equal(g1, g0)


@pytest.mark.parametrize("kind", ["forward_hook", "forward_pre_hook", "full_backward_hook"])
@pytest.mark.parametrize("op", ["write", "draw"])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_state_a_module_hook_captures_is_replayed_or_refused(kind, op, preserve):
    """A hook on a module inside the segment runs again at replay: a tensor it writes is refused
    (named), a generator it draws from is replayed (attack review of the scan)."""
    def build():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1)).double()
        acc, g = torch.zeros(3, dtype=D), torch.Generator().manual_seed(7)

        def hook(mod, *args):
            if op == "write":
                acc.add_(1)
                return None
            if kind == "forward_pre_hook":
                return (args[0][0] * torch.rand(3, generator=g, dtype=D),)
            if kind == "forward_hook":
                return args[1] * torch.rand(3, generator=g, dtype=D)
            return None
        if kind == "full_backward_hook" and op == "draw":
            pytest.skip("a backward hook's draw happens once, outside the replay")
        getattr(m[1], f"register_{kind}")(hook)
        return m, acc, g

    x = torch.randn(2, 3, dtype=D)
    ref, _, g_ref = build()
    ref(x).sum().backward()
    m, acc, g = build()
    if op == "write" and kind == "full_backward_hook":  # runs in the backward, once: eager's result
        checkpoint(m, x, state="buffers", preserve=preserve).sum().backward()
        assert torch.equal(acc, torch.ones(3, dtype=D))
        return
    if op == "write":  # unguarded: the replay writes again, refused at the backward
        with pytest.raises(UndeclaredStateError, match="captured variable 'acc'.*the replay wrote it again"):
            checkpoint(m, x, state="buffers", preserve=preserve).sum().backward()
        return
    checkpoint(m, x, state="buffers", preserve=preserve).sum().backward()
    for a, b in zip(ref.parameters(), m.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert torch.equal(g.get_state(), g_ref.get_state())


@pytest.mark.parametrize("transform", ["grad", "vmap", "vjp"])
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("form", ["function", "module"])
def test_torch_func_transforms_are_refused_clearly(transform, preserve, form):
    """Attack review: torch.func.grad/vmap over a checkpoint crashed in the library ("Cannot
    access data pointer of Tensor that doesn't have storage")."""
    lin = nn.Linear(3, 3).double()
    seg = (lambda t: checkpoint(lambda u: torch.sin(u) * u, t, preserve=preserve)) if form == "function" \
        else StatefulCheckpoint(lin, state="buffers", preserve=preserve)
    f = lambda t: seg(t).sum()  # noqa: E731
    x = torch.randn(3, dtype=D)
    call = {"grad": lambda: torch.func.grad(f)(x), "vmap": lambda: torch.func.vmap(seg)(x.expand(2, 3)),
            "vjp": lambda: torch.func.vjp(f, x)}[transform]
    with pytest.raises(UnsupportedError, match=r"inside a torch.func transform.*Tip:"):
        call()


class _RebindLater(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4).double()
        self.l2 = nn.Linear(4, 4).double()
        self.register_buffer("q", torch.randn(5, 4, dtype=D))
        self.cache = torch.ones(4, dtype=D)  # a plain tensor attribute

    def forward(self, x):
        h = torch.tanh(self.l2(torch.tanh(self.l(x)))) * self.cache
        return (h @ self.q.clone().T).sum()


_REBINDS = {
    "buffer": (lambda m: setattr(m, "q", m.q * 0.3), "buffer 'q'"),
    "register_buffer": (lambda m: m.register_buffer("q", m.q * 0.3), "buffer 'q'"),
    "parameter": (lambda m: setattr(m.l2, "weight", nn.Parameter(m.l2.weight.detach() * 0.3)), "parameter 'l2.weight'"),
    "submodule": (lambda m: setattr(m, "l2", nn.Linear(4, 4).double()), "submodule 'l2'"),
    "tensor_attribute": (lambda m: setattr(m, "cache", m.cache * 2), "tensor attribute 'cache'"),
    "same_bytes_attribute": (lambda m: setattr(m, "cache", m.cache.clone()), None),  # a refreshed cache
}


@pytest.mark.parametrize("kind", list(_REBINDS))
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("form", ["checkpoint", "stateful", "nested"])
def test_rebinding_between_forward_and_backward_replays_the_forward_objects(kind, preserve, form):
    """Attack review: rebinding a buffer, parameter or submodule after the forward made the
    replay read the new object (gradient off by up to 2.7, silently). The replay now reads what
    the forward read, as eager's backward does; the current bindings are back afterwards."""
    mutate, _ = _REBINDS[kind]

    def step(run):
        torch.manual_seed(0)
        m = _RebindLater()
        x = torch.randn(3, 4, dtype=D)
        loss = run(m, x)
        mutate(m)
        after = {k: v for k, v in [*m.named_parameters(), *m.named_buffers(), ("cache", m.cache)]}
        loss.backward()
        assert all(v is dict([*m.named_parameters(), *m.named_buffers(), ("cache", m.cache)])[k]
                   for k, v in after.items())  # the rebinding stands after the backward
        return [p.grad for p in (m.l.weight, m.l.bias)]

    runs = {"checkpoint": lambda m, x: checkpoint(m, x, state="buffers", preserve=preserve),
            "stateful": lambda m, x: StatefulCheckpoint(m, state="buffers", preserve=preserve)(x),
            "nested": lambda m, x: checkpoint(lambda y: checkpoint(m, y, state="buffers", preserve=preserve), x,
                                              state=[m], preserve=preserve)}
    for a, b in zip(step(lambda m, x: m(x)), step(runs[form])):
        assert torch.equal(a, b)


class _MaskCache(nn.Module):  # rebuilds a cache attribute and a buffer every forward
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()
        self.mask = None
        self.register_buffer("c", torch.zeros(4, dtype=D), persistent=False)

    def forward(self, x):
        self.mask = torch.triu(torch.ones(4, 4, dtype=D)) * x.shape[0]
        self.c = x.detach().mean(0)
        return torch.tanh(self.lin(x) @ self.mask + self.c)


@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("pattern", ["micro_batches", "later_layer_rebinds"])
def test_legitimate_rebinding_patterns_match_eager(preserve, pattern):
    """False refusals found by the follow-up review: two micro-batches through one module whose
    forward rebuilds its cache, then one backward; a segment reaching the whole model through a
    bound method while a later layer rebinds its own buffer."""
    def run(ck):
        torch.manual_seed(0)
        m = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.Tanh()).double(), _MaskCache()])
        x = torch.randn(3, 4, dtype=D)
        if pattern == "micro_batches":
            f = (lambda y: checkpoint(m[1], y, state=[m[1]], preserve=preserve)) if ck else m[1]
            loss = f(x).sum() + f(x[:2]).sum()
        else:
            owner = types.SimpleNamespace(model=m)
            first = (lambda t: owner.model[0](t))
            h = checkpoint(first, x, state=[], preserve=preserve) if ck else first(x)
            loss = m[1](h).pow(2).sum()
        loss.backward()
        return [p.grad for p in m.parameters()]
    want, got = run(False), run(True)
    assert any(g is not None for g in want)
    for a, b in zip(want, got):
        assert (a is None and b is None) or torch.equal(a, b)


class _Grows(nn.Module):  # a buffer allocated at its first call, as torch.ao observers do
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4).double()
        self.register_buffer("stat", torch.tensor([], dtype=D))

    def forward(self, x):
        y = torch.tanh(self.l(x))
        if self.stat.numel() == 0:
            self.stat.resize_(4)
        self.stat.copy_(y.detach().amax(0))
        return y.pow(2).sum()


@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("warm", [False, True])
def test_declared_buffer_resized_inside_the_forward_is_refused_then_fine_once_sized(preserve, warm):
    """Attack review: the error blamed a set_/.data = after the forward, at backward."""
    torch.manual_seed(0)
    m, ref = _Grows(), _Grows()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(3, 4, dtype=D)
    if warm:  # one plain step gives the buffer its size; checkpointed steps then match eager
        m(x).backward(), ref(x).backward()
        checkpoint(m, x, state="buffers", preserve=preserve).backward()
        ref(x).backward()
        assert torch.equal(m.stat, ref.stat) and torch.equal(m.l.weight.grad, ref.l.weight.grad)
        return
    with pytest.raises(UnsupportedError, match=r"resized inside the segment's forward.*Tip: run one step"):
        checkpoint(m, x, state="buffers", preserve=preserve)


@pytest.mark.parametrize("holder", ["closure", "callable_object"])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_hook_guarded_by_is_replaying_may_write_its_own_tensor(holder, preserve):
    """The README's advice for hooks (guard side effects with is_replaying()) must hold for a hook
    accumulating activation statistics into a tensor it captures or holds (follow-up review)."""
    from stateremat.torch import is_replaying

    class Stats:
        def __init__(self):
            self.acc = torch.zeros(3, dtype=D)

        def __call__(self, mod, inp, out):
            if not is_replaying():
                self.acc.add_(out.detach().mean(0))

    def build():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1)).double()
        stats = Stats()
        if holder == "closure":
            acc = stats.acc

            def hook(mod, inp, out):
                if not is_replaying():
                    acc.add_(out.detach().mean(0))
            m[1].register_forward_hook(hook)
        else:
            m[1].register_forward_hook(stats)
        return m, stats.acc

    x = torch.randn(2, 3, dtype=D)
    ref, acc_ref = build()
    for _ in range(2):
        ref(x).sum().backward()
    m, acc = build()
    for _ in range(2):
        checkpoint(m, x, state="buffers", preserve=preserve).sum().backward()
    assert torch.equal(acc, acc_ref) and torch.equal(m[0].weight.grad, ref[0].weight.grad)
