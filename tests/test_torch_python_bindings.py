"""Python bindings a forward rebinds are replayed as of the forward (issue 25 item 2, review round).

The kind: a slot outside a tensor's bytes that the forward rebinds — a Python scalar module
attribute (``self.t = self.t + 1``), a scalar or tensor in a dict (a Megatron-style RNG tracker's
``states[name] = torch.get_rng_state()``) or on a plain object (``ctx.key = k``). Before, the
replay read the new value (silently wrong gradients, the update made twice) or refused the
rebinding with a tip that did not help. Every case is compared bit for bit with eager, over both
preservers, nesting, ``StatefulCheckpoint`` and two forwards before one backward.
"""
from __future__ import annotations

import contextlib
import types

import pytest
import torch
from torch import nn

from stateremat.torch import ReplayError, StatefulCheckpoint, checkpoint, is_replaying

D = torch.float64
PRESERVERS = ["whole", "region"]


class Counter(nn.Module):
    """A step counter in a Python scalar, rebound before (or after) the computation uses it."""

    def __init__(self, t0, after: bool = False, holder: str = "module"):
        super().__init__()
        self.l, self.after, self.holder = nn.Linear(4, 4).double(), after, holder
        self.box = {"t": t0} if holder == "dict" else types.SimpleNamespace(t=t0) if holder == "object" else None
        if holder == "module":
            self.t = t0

    def get(self):
        return self.t if self.holder == "module" else self.box["t"] if self.holder == "dict" else self.box.t

    def put(self, v):
        if self.holder == "module":
            self.t = v
        elif self.holder == "dict":
            self.box["t"] = v
        else:
            self.box.t = v

    def forward(self, x):
        if not self.after:
            self.put(self.get() + 1)
        y = (self.l(x) * self.get()).tanh()
        if self.after:
            self.put(self.get() + 1)
        return y


def _run(mode, make, xs, preserve):
    torch.manual_seed(0)
    m = make()
    wrapped = StatefulCheckpoint(m, preserve=preserve) if mode == "stateful" else None
    outs = []
    for x in xs:  # forwards of several micro-batches, then one backward
        if mode == "eager":
            outs.append(m(x))
        elif mode == "stateful":
            outs.append(wrapped(x))
        elif mode == "nested":
            outs.append(checkpoint(lambda z: checkpoint(m, z, preserve=preserve) * 1.0, x, preserve=preserve))
        else:
            outs.append(checkpoint(m, x, preserve=preserve))
    sum(o.sum() for o in outs).backward()
    return m


@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("mode", ["plain", "nested", "stateful"])
@pytest.mark.parametrize("holder", ["module", "dict", "object"])
@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("micro", [1, 2])
def test_a_rebound_scalar_replays_with_its_start_value(preserve, mode, holder, after, micro):
    xs = [torch.randn(2, 4, dtype=D, generator=torch.Generator().manual_seed(i)) for i in range(micro)]
    make = lambda: Counter(0.5, after, holder)  # noqa: E731
    want = _run("eager", make, xs, preserve)
    got = _run(mode, make, xs, preserve)
    assert got.get() == want.get() == 0.5 + micro and type(got.get()) is float
    assert torch.equal(got.l.weight.grad, want.l.weight.grad)
    assert torch.equal(got.l.bias.grad, want.l.bias.grad)


class Tracker:
    """A Megatron-style RNG tracker: named CPU generator states, forked around a region."""

    def __init__(self):
        self.states = {"tp": torch.Generator().manual_seed(7).get_state()}

    @contextlib.contextmanager
    def fork(self, name="tp"):
        orig = torch.get_rng_state()
        torch.set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()  # rebinds the dict entry to a new tensor
            torch.set_rng_state(orig)


class TrackedDropout(nn.Module):
    def __init__(self, tracker):
        super().__init__()
        self.l, self.tracker = nn.Linear(8, 8).double(), tracker

    def forward(self, x):
        h = self.l(x)
        with self.tracker.fork():
            h = nn.functional.dropout(h, 0.5, training=True)
        return h * torch.rand_like(h)  # the default stream too


@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("nested", [False, True])
def test_an_rng_tracker_rebinding_its_states_replays_exactly(preserve, nested):
    """The tracker's advanced state is bound in a dict: the replay draws the forward's mask, the
    tracker and the global RNG end as in eager, and no UndeclaredStateError is raised."""
    x = torch.randn(4, 8, dtype=D, generator=torch.Generator().manual_seed(1))
    got = []
    for ck in (False, True):
        torch.manual_seed(0)
        tr = Tracker()
        m = TrackedDropout(tr)
        if not ck:
            y = m(x)
        elif nested:
            y = checkpoint(lambda z: checkpoint(m, z, preserve=preserve) + 0.0, x, preserve=preserve)
        else:
            y = checkpoint(m, x, preserve=preserve)
        torch.rand(3)  # draws between forward and backward
        before_bwd = torch.get_rng_state()
        y.sum().backward()
        assert torch.equal(torch.get_rng_state(), before_bwd)
        got.append((m.l.weight.grad.clone(), tr.states["tp"].clone(), before_bwd))
    assert all(torch.equal(a, b) for a, b in zip(*got))


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_context_object_key_rebound_each_step_replays_as_of_the_forward(preserve):
    """``ctx.key = k`` on a shared plain object across steps: the replay reads the step's key."""
    ctx = types.SimpleNamespace(key=torch.zeros(4, dtype=D))

    def seg(w, x):
        y = (w * x * ctx.key.exp()).sum()
        ctx.key = ctx.key + x.detach()
        return y

    xs = [torch.randn(4, dtype=D, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    results = []
    for ck in (False, True):
        ctx.key = torch.zeros(4, dtype=D)
        w = torch.ones(4, dtype=D, requires_grad=True)
        for x in xs:
            (checkpoint(seg, w, x, preserve=preserve) if ck else seg(w, x)).backward()
        results.append((w.grad.clone(), ctx.key.clone()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


class Guarded(nn.Module):
    """The forward guards its update itself; ``extra``: a second scalar it forgets to guard."""

    def __init__(self, extra: bool):
        super().__init__()
        self.l, self.t, self.n, self.extra = nn.Linear(4, 4).double(), 0, 0, extra

    def forward(self, x):
        if not is_replaying():
            self.t = self.t + 1
        if self.extra:
            self.n = self.n + 1
        return (self.l(x) * self.t).tanh()


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_a_guarded_update_replays_with_the_value_the_forward_left(preserve):
    x = torch.randn(2, 4, dtype=D)
    grads = []
    for ck in (False, True):
        torch.manual_seed(0)
        m = Guarded(extra=False)
        y1 = checkpoint(m, x, preserve=preserve) if ck else m(x)
        y2 = checkpoint(m, x, preserve=preserve) if ck else m(x)  # t moves on before the backward
        (y1.sum() + y2.sum()).backward()
        assert m.t == 2
        grads.append(m.l.weight.grad)
    assert torch.equal(*grads)


@pytest.mark.parametrize("preserve", PRESERVERS)
def test_an_unguarded_update_in_a_guarded_forward_is_refused_and_the_tip_works(preserve):
    """A forward that asks is_replaying() but rebinds another scalar unguarded: the replay would
    rebind it a second time. Refused in backward, the value put back; following the tip (guard it
    too) gives eager's result."""
    x = torch.randn(2, 4, dtype=D)
    torch.manual_seed(0)
    m = Guarded(extra=True)
    y = checkpoint(m, x, preserve=preserve)
    with pytest.raises(ReplayError, match=r"rebound 'n'.*Tip: guard this update with 'if not "
                                          r"stateremat.torch.is_replaying\(\):' too"):
        y.sum().backward()
    assert (m.t, m.n) == (1, 1)

    class Fixed(Guarded):  # the tip: guard the second update too
        def forward(self, x):
            if not is_replaying():
                self.t, self.n = self.t + 1, self.n + 1
            return (self.l(x) * self.t).tanh()

    grads = []
    for ck in (False, True):
        torch.manual_seed(0)
        f = Fixed(extra=True)
        (checkpoint(f, x, preserve=preserve) if ck else f(x)).sum().backward()
        assert (f.t, f.n) == (1, 1)
        grads.append(f.l.weight.grad)
    assert torch.equal(*grads)


def test_an_idempotent_rebinding_is_no_update():
    """Rebinding to an equal value (a shape, a flag) changes nothing and is not replayed or refused,
    even in a guarded forward."""
    class Shape(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.last = nn.Linear(4, 4).double(), None

        def forward(self, x):
            is_replaying()
            self.last = int(x.shape[0])
            return self.l(x).sum()

    m = Shape()
    checkpoint(m, torch.randn(3, 4, dtype=D)).backward()  # first forward: None -> 3 (guarded, replay sets 3 again)
    assert m.last == 3
    checkpoint(m, torch.randn(3, 4, dtype=D)).backward()
    assert m.last == 3


def _closure_model(how: str):
    """A captured tensor rebound through ``nonlocal``: in the segment itself, or in a helper it calls."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 4).to(D)
    acc = torch.zeros(4, dtype=D)

    def helper(y):
        nonlocal acc
        out = y * acc
        acc = acc + 1.0
        return out

    def direct(x):
        nonlocal acc
        y = lin(x)
        out = y * acc
        acc = acc + 1.0
        return out

    fn = direct if how == "direct" else (lambda x: helper(lin(x)))
    return lin, fn, lambda: acc


@pytest.mark.parametrize("how", ["direct", "helper"])
@pytest.mark.parametrize("preserve", PRESERVERS)
@pytest.mark.parametrize("state", ["auto", None])
def test_a_nonlocal_tensor_rebinding_replays_as_of_the_forward(how, preserve, state):
    """``nonlocal acc; acc = acc + 1`` rebinds a closure cell: the replay reads the cell as the
    forward did (it read the advanced tensor: wrong gradients from the second step), then the
    cell holds the forward's result again; bit for bit as eager over 4 steps."""
    def run(ck):
        lin, fn, acc = _closure_model(how)
        out = []
        for step in range(4):
            lin.zero_grad()
            x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(step))
            ck(fn, x).pow(2).sum().backward()
            out.append((lin.weight.grad.clone(), acc().clone()))
        return out

    want = run(lambda fn, x: fn(x))
    got = run(lambda fn, x: checkpoint(fn, x, state=state, preserve=preserve))
    assert all(torch.equal(a, b) for (ga, sa), (gb, sb) in zip(want, got) for a, b in ((ga, gb), (sa, sb)))
