"""Issue 25: a module slot that holds a non-tensor as the forward starts (``self.v = 0.0``, ``None``,
an int, a buffer registered as ``None``) and a tensor after is replayed with its start value and
reinstated after: gradients and final values equal eager bit for bit over three steps, under both
preservers, declared (``state="buffers"``, ``state=[module]``) or not, and nested."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from stateremat.torch import checkpoint

STARTS = [0.0, None, 1]


class LIF(nn.Module):
    """A leaky integrate-and-fire neuron: the membrane potential starts as a Python value."""

    def __init__(self, start) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.start = start
        self.v = start

    def forward(self, x):
        # the replay must see the start value: a tensor here takes the other branch and saves more
        v = 0.0 if self.v is None else self.v
        if isinstance(v, torch.Tensor):
            self.v = torch.tanh(v) * 0.5 + self.l(x)
        else:
            self.v = self.l(x) * (v + 1.0)
        return self.v.sum(-1)


class BufferNone(nn.Module):
    """A buffer registered as ``None`` and filled by the first forward."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.register_buffer("h", None)

    def forward(self, x):
        y = self.l(x)
        self.h = y.detach() if self.h is None else self.h * 0.5 + y.detach()
        return (y * (self.h + 1.0)).sum(-1)


class Net(nn.Module):
    def __init__(self, make, nested: bool, **kw) -> None:
        super().__init__()
        self.a, self.b = make(), make()
        self.nested, self.kw = nested, kw

    def forward(self, x):
        for layer in (self.a, self.b):
            x = x.unsqueeze(-1).expand(-1, 4) if x.dim() == 1 else x
            x = checkpoint(layer, x, **self.kw) if self.nested else layer(x)
        return x


def _steps(model, run, carry: bool, reset):
    torch.manual_seed(1)
    xs = [torch.randn(3, 4) for _ in range(3)]
    grads = []
    for x in xs:
        if not carry:
            reset(model)
        for m in model.modules():  # a carried potential starts the next step without its graph
            if isinstance(m, LIF) and isinstance(m.v, torch.Tensor):
                m.v = m.v.detach()
        model.zero_grad()
        run(model, x).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads


def _states(model):
    return [getattr(m, k) for m in model.modules() for k in ("v", "h") if k in m.__dict__ or k in m._buffers]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b and type(a) is type(b)


def _reset(model):
    for m in model.modules():
        if isinstance(m, LIF):
            m.v = m.start
        if isinstance(m, BufferNone):
            m.h = None


def _compare(make, run, carry: bool):
    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(0)
    got = make()
    g_ref = _steps(ref, lambda m, x: m(x), carry, _reset)
    g_got = _steps(got, run, carry, _reset)
    for a, b in zip(g_ref, g_got):
        assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert all(_same(a, b) for a, b in zip(_states(ref), _states(got)))


@pytest.mark.parametrize("preserve", ["whole", "region"])
@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("state", [None, "buffers", "module"])
def test_attribute_started_as_non_tensor(preserve, start, state):
    def run(m, x):
        kw = {} if state is None else {"state": "buffers" if state == "buffers" else [m]}
        return checkpoint(m, x, preserve=preserve, **kw)

    # undeclared: reset every step (a tensor carried in would be an undeclared rebinding)
    _compare(lambda: LIF(start), run, carry=state is not None)
    _compare(lambda: LIF(start), run, carry=False)


@pytest.mark.parametrize("preserve", ["whole", "region"])
@pytest.mark.parametrize("state", [None, "buffers"])
def test_buffer_registered_as_none(preserve, state):
    def run(m, x):
        return checkpoint(m, x, preserve=preserve, **({} if state is None else {"state": state}))

    _compare(BufferNone, run, carry=False)
    if state is not None:
        _compare(BufferNone, run, carry=True)


@pytest.mark.parametrize("preserve", ["whole", "region"])
@pytest.mark.parametrize("declared", [False, True])
@pytest.mark.parametrize("make", [lambda: LIF(0.0), lambda: LIF(None), BufferNone], ids=["float", "none", "buffer"])
def test_nested_checkpoints(preserve, declared, make):
    kw = {"preserve": preserve, **({"state": "buffers"} if declared else {})}

    def build():
        return Net(make, nested=True, **kw)

    def run(m, x):
        return checkpoint(m, x, **kw)

    torch.manual_seed(0)
    ref = Net(make, nested=False)
    torch.manual_seed(0)
    got = build()
    g_ref = _steps(ref, lambda m, x: m(x), False, _reset)
    g_got = _steps(got, run, False, _reset)
    for a, b in zip(g_ref, g_got):
        assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert all(_same(a, b) for a, b in zip(_states(ref), _states(got)))


@pytest.mark.parametrize("state", [None, "buffers"])
def test_reset_between_forward_and_backward_is_kept(state):
    # the value bound after the forward (a reset to 0.0) is reinstated after the replay, not deleted
    m = LIF(0.0)
    x = torch.randn(3, 4)
    y = checkpoint(m, x, state=state)
    out = m.v
    m.v = 0.0
    y.sum().backward()
    assert m.v == 0.0 and type(m.v) is float
    ref = LIF(0.0)
    ref.load_state_dict(m.state_dict())
    ref(x).sum().backward()
    assert torch.equal(ref.l.weight.grad, m.l.weight.grad) and out is not None
