"""``state="auto"``, the default: correct with no declaration (issue 25, item 1).

Every kind of state strict mode refuses (tests/test_torch_review.py, test_torch_semantics.py)
is here run with no declaration and compared bit for bit with eager over several steps, both
preservers, nesting and the module forms: the first step watches every op, later steps declare
what it found, and a write found only at a forward's end makes that one forward eager.
"""
from __future__ import annotations

import collections
import copy
import gc
import types
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from stateremat.torch import (
    Checkpointer, StatefulCheckpoint, UndeclaredStateError, checkpoint, checkpoint_sequential,
    preservation_stats, reset_preservation_stats,
)

D = torch.float64
PRESERVERS = ["whole", "region"]
STEPS = 3


class Queue(nn.Module):
    """A dense queue (64 KiB: above the whole-snapshot threshold, so region journals it), a
    token counter, a BatchNorm and dropout: the contrastive application's kinds of state."""

    def __init__(self, rebind: bool = False):
        super().__init__()
        self.l, self.bn, self.rebind = nn.Linear(8, 8).to(D), nn.BatchNorm1d(8).to(D), rebind
        self.register_buffer("queue", torch.randn(1024, 8, dtype=D, generator=torch.Generator().manual_seed(3)))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(8, dtype=D))

    def forward(self, x):
        h = F.dropout(self.bn(self.l(x)), 0.2)
        logits = h @ self.queue[:64].T.clone()  # read before the enqueue (eager refuses a saved view written later)
        i = int(self.ptr)
        self.queue[i:i + x.shape[0]] = h.detach()
        self.ptr += x.shape[0]
        if self.rebind:  # rebinding a buffer, not writing it
            self.ema = self.ema * 0.9 + h.detach().mean(0)
        else:
            self.ema.mul_(0.9).add_(h.detach().mean(0))
        return logits.logsumexp(-1).sum()


def _steps(model, call, n=STEPS, seed=0):
    out = []
    for step in range(n):
        torch.manual_seed(seed + step)
        x = torch.randn(4, 8, dtype=D, generator=torch.Generator().manual_seed(100 + step))
        loss = call(model, x)
        torch.rand(2)  # draws between forward and backward
        rng = torch.get_rng_state()
        loss.backward()
        assert torch.equal(torch.get_rng_state(), rng)
        out.append((loss.detach(), [p.grad.clone() for p in model.parameters()],
                    [b.clone() for b in model.buffers()]))
        model.zero_grad()
    return out


def _equal(a, b):
    for (la, ga, ba), (lb, gb, bb) in zip(a, b):
        assert torch.equal(la, lb)
        assert all(torch.equal(x, y) for x, y in zip(ga, gb))
        assert all(torch.equal(x, y) for x, y in zip(ba, bb))


CALLS = {
    "checkpoint": lambda preserve: lambda m, x: checkpoint(m, x, preserve=preserve),
    "Checkpointer": lambda preserve: lambda m, x: Checkpointer(preserve=preserve)(m, x),
    "nested": lambda preserve: lambda m, x: checkpoint(lambda z: checkpoint(m, z, preserve=preserve) * 1.0, x,
                                                       preserve=preserve),
}


@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("form", [*CALLS, "StatefulCheckpoint"])
@pytest.mark.parametrize("rebind", [False, True])
def test_undeclared_state_is_preserved_by_default_as_eager(preserve, form, rebind):
    torch.manual_seed(0)
    ref = Queue(rebind)
    got = copy.deepcopy(ref)
    want = _steps(ref, lambda m, x: m(x))
    if form == "StatefulCheckpoint":
        wrapped = StatefulCheckpoint(got, state="auto", preserve=preserve)
        res = _steps(got, lambda m, x: wrapped(x))
    else:
        res = _steps(got, CALLS[form](preserve))
    _equal(want, res)
    assert int(got.ptr) == 4 * STEPS  # updated once per step


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_later_steps_declare_what_the_first_found_and_replay(preserve):
    """Step 1 watches every op (each tensor declared with the preserver before its first write); from step 2 the found
    tensors are declared up front with the segment's preserver: region journals the 64 KiB queue."""
    torch.manual_seed(0)
    m = Queue()
    reset_preservation_stats()
    held = []
    for step in range(3):
        loss = checkpoint(m, torch.randn(4, 8, dtype=D), preserve=preserve)
        held.append(preservation_stats().retained_by_option)
        loss.backward()
    assert preservation_stats().recompute_count == 3
    assert held[0].get("region", 0) < m.queue.nbytes if preserve == "region" else held[0]["whole"] >= m.queue.nbytes
    if preserve == "region":
        assert 0 < held[2]["region"] < m.queue.nbytes  # the queue's written rows only
    else:
        assert held[2]["whole"] >= m.queue.nbytes


class Sometimes(nn.Module):
    """Writes its buffer only on some steps: a branch taken for the first time after step 1."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4).to(D)
        self.register_buffer("hits", torch.zeros(4, dtype=D))
        self.step = 0

    def forward(self, x):
        self.step += 1
        y = (self.l(x) * (1 + self.hits)).tanh()
        if self.step % 2 == 0:
            self.hits.add_(y.detach().mean(0))
        return y.sum()


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_write_first_seen_at_a_later_forward_makes_that_forward_eager(preserve):
    """No replay against state it did not preserve: the forward that first writes ``hits``
    after step 1 keeps its activations (no recomputation), later ones declare it and replay."""
    torch.manual_seed(0)
    ref = Sometimes()
    got = copy.deepcopy(ref)
    counts = []
    for step in range(4):
        x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
        ref(x).backward()
        reset_preservation_stats()
        checkpoint(got, x, preserve=preserve).backward()
        counts.append(preservation_stats().recompute_count)
        assert torch.equal(got.hits, ref.hits) and torch.equal(got.l.weight.grad, ref.l.weight.grad)
    assert counts == [1, 0, 1, 1]  # step 2 wrote hits for the first time: that forward ran eagerly


def test_a_forward_that_ran_eagerly_refuses_a_later_write_to_a_saved_tensor_as_eager_does():
    """A forward that fell back to eager keeps its saved tensors with eager's version check."""
    buf = torch.zeros(4, dtype=D)
    w = torch.ones(4, dtype=D, requires_grad=True)
    step = types.SimpleNamespace(n=0)  # a Python counter: replayed as of the forward

    def seg(x):
        step.n += 1
        if step.n == 2:
            buf.add_(1)  # first written at the second forward: that forward runs eagerly
        return (w * x).mul(buf).sum()  # saves buf (mul's other operand)

    checkpoint(seg, torch.ones(4, dtype=D)).backward()
    y = checkpoint(seg, torch.ones(4, dtype=D))
    buf.add_(1)  # written after the forward saved it
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    y = seg(torch.ones(4, dtype=D))  # eager refuses the same
    buf.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_activations_are_freed_after_a_forward_without_gaps_and_kept_after_one():
    saved = []

    def seg(x):
        h = x.exp()
        saved.append(weakref.ref(h))
        return h.sin().sum()

    x = torch.ones(1000, dtype=D, requires_grad=True)
    for _ in range(2):  # the first step watches; the second keeps tensors until its end, then frees them
        y = checkpoint(seg, x)
        gc.collect()
        assert saved[-1]() is None  # the saved activation is not held: it is recomputed
        y.backward()

    buf = torch.zeros(3, dtype=D)
    step = types.SimpleNamespace(n=0)

    def writes_late(x):
        step.n += 1
        h = x.exp()
        saved.append(weakref.ref(h))
        if step.n == 2:
            buf.add_(1)  # read at step 1 (so known), written first at step 2: a gap
        return (h.sin() * (1 + buf[0])).sum()

    checkpoint(writes_late, x).backward()
    y = checkpoint(writes_late, x)  # a gap: this forward keeps its activations, as eager
    gc.collect()
    assert saved[-1]() is not None
    y.backward()


def test_a_written_input_keeps_its_clear_error_and_the_tip_works():
    lin = nn.Linear(8, 8).to(D)

    def fn(x):
        x.mul_(0.5)
        return lin(x)

    with pytest.raises(UndeclaredStateError, match=r"argument 0 is an input of the segment.*out-of-place"):
        checkpoint(fn, torch.randn(4, 8, dtype=D)).sum().backward()

    def fixed(x):  # the tip: out-of-place
        return lin(x * 0.5)

    x = torch.randn(4, 8, dtype=D)
    checkpoint(fixed, x).sum().backward()
    g = lin.weight.grad.clone()
    lin.weight.grad = None
    fixed(x).sum().backward()
    assert torch.equal(g, lin.weight.grad)


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_hidden_state_kinds_are_exact_by_default(preserve):
    """Captured functional batch-norm statistics, a tensor three levels into a captured dict, a
    captured list and plain object, an unregistered module's tensor attribute: eager's result."""
    deep = {"a": [{"b": torch.zeros(4, dtype=D)}]}
    held = [torch.zeros(4, dtype=D)]
    box = types.SimpleNamespace(t=torch.zeros(4, dtype=D))
    rm, rv = torch.zeros(2, dtype=D), torch.ones(2, dtype=D)

    def seg(x):
        deep["a"][0]["b"].add_(1)
        held[0].add_(x.detach())
        box.t = box.t + 1
        h = F.batch_norm(x.view(-1, 2), rm, rv, training=True, momentum=0.5).view(-1)
        return (h * deep["a"][0]["b"] * held[0] * box.t).sum()

    def state():
        return [deep["a"][0]["b"], held[0], box.t, rm, rv]

    results = []
    for ck in (False, True):
        for t in state():
            t.zero_() if t is not rv else t.fill_(1)
        box.t = torch.zeros(4, dtype=D)
        grads = []
        for step in range(3):
            x = torch.arange(1.0, 5.0, dtype=D).requires_grad_() * (step + 1)
            x.retain_grad()
            (checkpoint(seg, x, preserve=preserve) if ck else seg(x)).backward()
            grads.append(x.grad.clone())
        results.append((grads, [t.clone() for t in state()]))
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_checkpoint_sequential_defaults_to_buffers_and_is_exact():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 8), nn.BatchNorm1d(8)).to(D)
    ref = copy.deepcopy(net)
    for step in range(2):
        x = torch.randn(4, 8, dtype=D, generator=torch.Generator().manual_seed(step))
        checkpoint_sequential(net, 2, x, use_reentrant=False).sum().backward()
        ref(x).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), ref.state_dict().values()))
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(net.parameters(), ref.parameters()))


class Hits(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(3, 3).to(D)
        self.register_buffer("hits", torch.zeros(3, dtype=D))

    def forward(self, x):
        y = self.l(x)
        self.hits.add_(y.detach().mean(0))
        return (y * (1 + self.hits)).sum()


@pytest.mark.parametrize("tip", ["default", "state=[tensor]", "buffers", "on_undeclared='declare'"])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_every_fix_the_strict_refusal_names_gives_eagers_result(tip, preserve):
    """Strict mode's UndeclaredStateError lists its fixes; each one, followed, gives eager's
    gradients and buffers over three steps."""
    torch.manual_seed(0)
    ref = Hits()
    got = copy.deepcopy(ref)
    strict = copy.deepcopy(ref)
    with pytest.raises(UndeclaredStateError) as info:
        checkpoint(strict, torch.ones(2, 3, dtype=D), state=None, preserve=preserve)
    text = str(info.value)
    assert "leave state= at its default" in text and "state=[tensor_or_module]" in text
    assert "state='buffers'" in text and "on_undeclared='declare'" in text
    fixes = {"default": lambda m, x: checkpoint(m, x, preserve=preserve),
             "state=[tensor]": lambda m, x: checkpoint(m, x, state=[m.hits], preserve=preserve),
             "buffers": lambda m, x: StatefulCheckpoint(m, state="buffers", preserve=preserve)(x),
             "on_undeclared='declare'": lambda m, x: checkpoint(m, x, state=None, on_undeclared="declare",
                                                                preserve=preserve)}
    _equal(_steps(ref, lambda m, x: m(x[:, :3])), _steps(got, lambda m, x: fixes[tip](m, x[:, :3])))


# --- the review round's kinds (tests/ of the attack on state="auto") -------------------------------------

class _ReaderWriter(nn.Module):
    """Segment A only reads ``q``; segment B, later in the same forward, writes it from step ``late``."""

    def __init__(self, late):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8).to(D), nn.Linear(8, 8).to(D)
        self.register_buffer("q", torch.randn(8, 8, dtype=D, generator=torch.Generator().manual_seed(0)))
        self.n, self.late = 0, late

    def A(self, x):
        return torch.tanh(self.a(x) @ self.q.clone())

    def B(self, x):
        self.n += 1
        h = self.b(x)
        if self.n >= self.late:
            with torch.no_grad():
                self.q.mul_(0.5).add_(h.mean(0))
        return h

    def forward(self, x, ck):
        c = checkpoint if ck else (lambda f, *a: f(*a))
        return c(self.B, c(self.A, x))


@pytest.mark.parametrize("late", [1, 3])
def test_a_reader_whose_state_a_later_segment_first_writes_is_refused_never_silently_wrong(late):
    """Before: A replayed against B's write, silently wrong on the step B first wrote q. Now that
    step's backward is refused naming q (nothing restored, nothing lost); every other step, and the
    rerun of the refused one, equals eager (q is preserved wherever reached once learned)."""
    from stateremat.torch import ReplayError

    x = torch.randn(16, 8, dtype=D, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    ref = _ReaderWriter(late)
    got = copy.deepcopy(ref)
    refused = []
    for step in range(5):
        ref.zero_grad()
        ref(x, False).pow(2).sum().backward()
        for attempt in range(2):
            got.zero_grad()
            q0, n0 = got.q.clone(), got.n
            try:
                got(x, True).pow(2).sum().backward()
                break
            except ReplayError as exc:
                assert "buffer 'q'" in str(exc) and "Tip: put the tensor back as it was before this step and rerun" in str(exc)
                # the other tip, followed by the test below (running a step without checkpointing does not help)
                assert "declare it where it is read (checkpoint(fn, ..., state=[tensor])" in str(exc)
                assert "run one step before" not in str(exc)
                refused.append(step)
                with torch.no_grad():  # the user reruns the step from the state before it
                    got.q.copy_(q0)
                got.n = n0
        assert torch.equal(got.a.weight.grad, ref.a.weight.grad) and torch.equal(got.q, ref.q)
    assert refused == [late - 1]


@pytest.mark.parametrize("late", [1, 3])
@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_the_refusals_declaration_tip_is_exact_from_the_first_step(late, preserve):
    """The refusal's tip: declare the tensor where it is read (A's checkpoint gets state=[q]): every
    step equals eager, the step B first writes q included (a step run without checkpointing
    first teaches the default nothing, so the tip no longer suggests it)."""
    x = torch.randn(16, 8, dtype=D, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    ref = _ReaderWriter(late)
    got = copy.deepcopy(ref)

    def declared(x):
        return checkpoint(got.B, checkpoint(got.A, x, state=[got.q], preserve=preserve), preserve=preserve)

    for step in range(5):
        ref.zero_grad()
        got.zero_grad()
        ref(x, False).pow(2).sum().backward()
        declared(x).pow(2).sum().backward()
        assert torch.equal(got.a.weight.grad, ref.a.weight.grad) and torch.equal(got.b.weight.grad, ref.b.weight.grad)
        assert torch.equal(got.q, ref.q) and got.n == ref.n


class _CountsAndReads(nn.Module):
    def __init__(self):
        super().__init__()
        self.b1, self.head = nn.Linear(8, 8).to(D), nn.Linear(8, 1).to(D)
        self.step, self.drop = 0, nn.Dropout(0.1)

    def block(self, x):
        return torch.tanh(self.drop(self.b1(x)) / (1.0 + self.step))  # reads the counter

    def tail(self, x):
        self.step += 1  # advanced by a later segment, before the backward
        self.calls = getattr(self, "calls", 0) + 1  # an attribute the first forward creates
        return self.head(x)

    def forward(self, x, ck):
        return (checkpoint(self.tail, checkpoint(self.block, x)) if ck else self.tail(self.block(x)))


def test_python_values_replay_as_the_forward_read_them():
    """A counter a later segment advances, Dropout.p changed between micro-batches and an attribute
    the forward creates: eager's gradients and counters (before: wrong gradients, counters +1)."""
    results = []
    for ck in (False, True):
        torch.manual_seed(0)
        m = _CountsAndReads()
        grads = []
        for step in range(3):
            m.zero_grad()
            xs = [torch.randn(4, 8, dtype=D, generator=torch.Generator().manual_seed(10 * step + i)) for i in range(2)]
            torch.manual_seed(step)
            y0 = m(xs[0], ck)
            m.drop.p = 0.3  # changed between micro-batches: the first one's replay reads 0.1
            y1 = m(xs[1], ck)
            m.drop.p = 0.1
            (y0.sum() + y1.sum()).backward()
            grads.append(m.b1.weight.grad.clone())
        results.append((grads, m.step, m.calls))
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    assert results[0][1:] == results[1][1:] == (6, 6)


_STEP = 0


def _global_counter(x):
    global _STEP
    _STEP += 1
    return (x * _STEP).sum()


def test_a_global_python_counter_advances_once_per_forward():
    global _STEP
    _STEP = 0
    x = torch.ones(3, dtype=D, requires_grad=True)
    for step in range(3):
        x.grad = None
        checkpoint(_global_counter, x).backward()
        assert _STEP == step + 1 and torch.equal(x.grad, torch.full((3,), float(step + 1), dtype=D))


def test_a_permutation_written_through_data_is_seen_and_exact():
    """Swapping two neighbouring float64 elements through .data (its own version counter) was
    invisible to the byte fingerprint: from its first step on, gradients were silently wrong."""
    class Swap(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4).to(D)
            self.register_buffer("w", torch.arange(16.0, dtype=D).view(4, 4) / 10)
            self.n = 0

        def forward(self, x):
            self.n += 1
            y = self.l(x) @ self.w.clone()
            if self.n >= 2:
                d = self.w.data.view(-1)
                d[[1, 2]] = d[[2, 1]]
            return y

    x = torch.randn(8, 4, dtype=D, generator=torch.Generator().manual_seed(0))
    out = []
    for ck in (False, True):
        torch.manual_seed(0)
        m = Swap()
        res = []
        for _ in range(3):
            m.zero_grad()
            (checkpoint(m, x) if ck else m(x)).pow(2).sum().backward()
            res.append((m.l.weight.grad.clone(), m.w.clone()))
        out.append(res)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*out))


def test_an_eval_batchnorm_does_not_keep_every_step_watched():
    """An eval BatchNorm's batch counter is reached but never touched: seen after two watched
    steps, so later steps run unwatched (before: every op watched at every step)."""
    from stateremat.torch import _learn

    modes = []
    orig = _learn.begin

    def spy(rt, r):
        d, mode = orig(rt, r)
        modes.append(mode)
        return d, mode

    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    block[0].train()
    import stateremat.torch._checkpoint as ck
    ck._learn.begin = spy
    try:
        for _ in range(4):
            checkpoint(block, torch.randn(2, 3, 8, 8, requires_grad=True)).sum().backward()
    finally:
        ck._learn.begin = orig
    assert modes[2:] == ["learn", "learn"], modes


class _MemArg(nn.Module):
    """State held by the module and also passed in as an argument (a memory object, a dict)."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8).to(D)
        g = torch.Generator().manual_seed(0)
        self.mem = types.SimpleNamespace(q=torch.randn(8, 8, dtype=D, generator=g))
        self.d = {"q": torch.randn(8, 8, dtype=D, generator=g)}

    def forward(self, x, mem, d):
        h = self.l(x) @ mem.q.clone() @ d["q"].clone()
        with torch.no_grad():
            mem.q.mul_(0.9).add_(h.mean(0))
            d["q"].mul_(0.5)
        return h.tanh()


def test_state_passed_as_an_argument_and_written_replays_exactly():
    """A dict the module holds, passed in as an argument and written in place: the first step
    crashed in backward with autograd's raw version error (the input's saved tensor); now eager's."""
    x = torch.randn(16, 8, dtype=D, generator=torch.Generator().manual_seed(1))
    out = []
    for ck in (False, True):
        torch.manual_seed(0)
        m = _MemArg()
        for step in range(2):
            m.zero_grad()
            ys = [checkpoint(m, x * (k + 1), m.mem, m.d) if ck else m(x * (k + 1), m.mem, m.d) for k in range(2)]
            sum(y.sum() for y in ys).backward()
        out.append((m.l.weight.grad.clone(), m.mem.q.clone(), m.d["q"].clone()))
    assert all(torch.equal(a, b) for a, b in zip(*out))


#: Several in-place writes to one declared-at-first-write tensor in one forward (the EMA idiom).
_TWO_WRITES = {
    "chained": lambda e, v: e.mul_(0.9).add_(v, alpha=0.1),
    "two_statements": lambda e, v: (e.mul_(0.9), e.add_(v)),
    "view_twice": lambda e, v: (e[:8].add_(v), e[:8].add_(v)),
    "view_then_whole": lambda e, v: (e[:8].add_(v), e.add_(v)),
    "zero_then_add": lambda e, v: e.zero_().add_(v),
    "copy_then_add": lambda e, v: e.copy_(e * 0.5).add_(v),
    "three": lambda e, v: (e.mul_(0.9), e.add_(v), e.sub_(v * 0.5)),
    "foreach_two_views": lambda e, v: torch._foreach_mul_([e[-4:], e[:4]], 0.5),  # one call, two writes
    "foreach_views_add": lambda e, v: torch._foreach_add_([e[:2], e[2:6], e[-3:]], [v, v, v]),
}


class _Ema(nn.Module):
    def __init__(self, how: str, n: int = 4096):  # float64: 32 KiB, above the whole-snapshot threshold
        super().__init__()
        self.lin = nn.Linear(8, 8).to(D)
        self.register_buffer("ema", torch.randn(n, dtype=D))
        self.how = how

    def forward(self, x):
        y = self.lin(x)
        out = y * self.ema[:8].clone()
        _TWO_WRITES[self.how](self.ema, y.detach().mean())
        return out.sum() + (y * self.ema[:8]).sum()


@pytest.mark.parametrize("how", sorted(_TWO_WRITES))
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("call", ["checkpoint", "nested"])
def test_several_writes_to_one_state_tensor_in_the_first_watched_forward_are_exact(how, preserve, call):
    """The first step watches every op and declares the buffer at its first write; its later writes
    in the same forward are journaled too (region: their version bumps come after the mode saw them,
    which was read as a version gap and refused in backward). Bit for bit as eager, every step."""
    torch.manual_seed(0)
    ref = _Ema(how)
    got = copy.deepcopy(ref)
    want = _steps(ref, lambda m, x: m(x))
    _equal(want, _steps(got, CALLS[call](preserve)))


class _Slotted:
    __slots__ = ("acc",)


def _unreachable_holders():
    """State the reach scan does not enter: a __slots__ object, a deque, nesting past its depth."""
    slotted = _Slotted()
    slotted.acc = torch.zeros(8, dtype=D)
    deque = collections.deque([torch.zeros(8, dtype=D)])
    deep = {"a": [{"b": [{"c": [torch.zeros(8, dtype=D)]}]}]}
    return {"slots": lambda: slotted.acc, "deque": lambda: deque[0],
            "deep": lambda: deep["a"][0]["b"][0]["c"][0]}


@pytest.mark.parametrize("holder", ["slots", "deque", "deep"])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_state_the_reach_misses_is_refused_at_the_replay_and_the_tip_gives_eagers_result(holder, preserve,
                                                                                       monkeypatch):
    """A tensor the scan cannot reach, read and then written in place after the segment's last saved
    tensor: the watched first forward sees a write to a pre-existing storage no scan reached, keeps
    its activations (exact), and from then on auto replays run on past the early-stop point (which
    would skip the write and let the replay read the advanced value: silently wrong gradients from
    the second step), so the second step's replay refuses it, naming it; the tip (declare it) then
    gives eager's result."""
    from stateremat.torch._runtime import runtime
    monkeypatch.setattr(runtime(), "unreached_writes", False)  # (per thread, sticky: not for other tests)
    def run(ck, steps=3):
        torch.manual_seed(0)
        lin = nn.Linear(8, 8).to(D)
        get = _unreachable_holders()[holder]

        def fn(x):
            y = lin(x)
            t = get()
            out = y * t.clone()
            t.add_(1.0)
            return out

        out = []
        for step in range(steps):
            lin.zero_grad()
            x = torch.randn(4, 8, dtype=D, generator=torch.Generator().manual_seed(step))
            ck(fn, x, get).pow(2).sum().backward()
            out.append((lin.weight.grad.clone(), get().clone()))
        return out

    with pytest.raises(UndeclaredStateError, match="the scan cannot name") as err:
        run(lambda fn, x, get: checkpoint(fn, x, preserve=preserve))
    assert "declare it" in str(err.value)
    want = run(lambda fn, x, get: fn(x))
    got = run(lambda fn, x, get: checkpoint(fn, x, state=[get()], preserve=preserve))
    assert all(torch.equal(a, b) for (ga, sa), (gb, sb) in zip(want, got) for a, b in ((ga, gb), (sa, sb)))


@pytest.mark.parametrize("bound", ["keyword", "positional", "as_fn"])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_tensor_bound_by_functools_partial_is_state_not_an_input(bound, preserve):
    """A partial's bound tensor is state the segment reaches (it was named "partial argument 0" and
    refused as if it were an input, with a tip that declaring cannot help): exact by default."""
    import functools

    def run(ck):
        torch.manual_seed(0)
        lin = nn.Linear(4, 4).to(D)
        t = torch.zeros(4, dtype=D)

        def g(st, y):
            out = y * st.clone()
            st.add_(1.0)
            return out

        p = functools.partial(g, st=t) if bound == "keyword" else functools.partial(g, t)
        fn = (lambda y: p(y=y)) if bound == "keyword" else (lambda y: p(y)) if bound == "positional" else p
        out = []
        for step in range(3):
            lin.zero_grad()
            y = lin(torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step)))
            ck(fn, y).pow(2).sum().backward()
            out.append((lin.weight.grad.clone(), t.clone()))
        return out

    want = run(lambda fn, y: fn(y))
    got = run(lambda fn, y: checkpoint(fn, y, preserve=preserve))
    assert all(torch.equal(a, b) for (ga, sa), (gb, sb) in zip(want, got) for a, b in ((ga, gb), (sa, sb)))


class _SetStorage(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.lin = nn.Linear(4, 4).to(D)
        self.register_buffer("b", torch.randn(n, dtype=D))

    def forward(self, x):
        y = self.lin(x)
        z = y * self.b[:4].clone()
        self.b.set_(self.b.clone() + 1)  # a new storage for the buffer
        return z


@pytest.mark.parametrize("n", [8, 4096])
@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_set_of_a_buffer_in_the_first_watched_forward_is_a_gap_then_declared(n, preserve):
    """``buf.set_(new)`` in the watched first step: the buffer, declared at that write, has its
    storage rebound, which the forward's end sees: that step runs as eager (it was refused as an
    undeclared write, with tips that did not apply), later steps declare it; exact every step."""
    def run(ck):
        torch.manual_seed(0)
        m = _SetStorage(n)
        out = []
        for step in range(3):
            m.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
            ck(m, x).pow(2).sum().backward()
            out.append((m.lin.weight.grad.clone(), m.b.clone()))
        return out

    want = run(lambda m, x: m(x))
    if preserve == "region" and n == 4096:  # a journaled storage set_ to another: refused (R8), then its tip
        from stateremat.torch import ReplayError
        with pytest.raises(ReplayError, match="pass preserve='whole'"):
            run(lambda m, x: checkpoint(m, x, preserve=preserve))
        preserve = "whole"
    got = run(lambda m, x: checkpoint(m, x, preserve=preserve))
    assert all(torch.equal(a, b) for (ga, sa), (gb, sb) in zip(want, got) for a, b in ((ga, gb), (sa, sb)))


class _Rebinds(nn.Module):
    def __init__(self, n: int, how: str):
        super().__init__()
        self.lin, self.how = nn.Linear(4, 4).to(D), how
        self.register_buffer("b", torch.randn(n, dtype=D))

    def forward(self, x):
        y = self.lin(x)
        self.b.mul_(0.5)  # the first write declares it (on_undeclared="declare")
        z = y * self.b[:4].clone()
        new = self.b.clone() + 1
        if self.how == "set_":
            self.b.set_(new)
        else:
            self.b.data = new
        return z


@pytest.mark.parametrize("how", ["set_", "data"])
@pytest.mark.parametrize("n", [8, 4096])
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("wrap", ["function", "module", "nested"])
def test_declare_on_first_write_then_rebinding_its_storage_replays_exactly(how, n, preserve, wrap):
    """``on_undeclared="declare"``: a buffer declared at its first write whose storage the forward then
    rebinds (``set_``, ``.data =``) replays with the storage it had when declared (it was refused as an
    undeclared rebinding of that very tensor); state and gradients equal eager's, step after step."""
    kw = dict(state=None, on_undeclared="declare", preserve=preserve)
    wraps = {"function": lambda m, x: checkpoint(m, x, **kw),
             "module": lambda m, x: StatefulCheckpoint(m, **kw)(x),
             "nested": lambda m, x: checkpoint(lambda t: checkpoint(m, t, **kw) * 1.0, x, **kw)}

    def run(ck):
        torch.manual_seed(0)
        m = _Rebinds(n, how)
        out = []
        for step in range(3):
            m.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
            ck(m, x).pow(2).sum().backward()
            out.append((m.lin.weight.grad.clone(), m.b.clone()))
        return out

    want, got = run(lambda m, x: m(x)), run(wraps[wrap])
    assert all(torch.equal(a, b) for (ga, sa), (gb, sb) in zip(want, got) for a, b in ((ga, gb), (sa, sb)))
