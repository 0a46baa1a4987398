"""Every form of in-place write and in-place view change to declared state, replayed exactly.

A region journal records what a write *will* change before the kernel runs; a write form whose
extent it misjudges (an ``out=`` tensor the kernel resizes, a 0-dim bool index, a 0-dim view)
would replay wrong bytes silently. A declared tensor whose *view* of its storage changes
(``t_()``, ``as_strided_()``) would replay through the wrong geometry. Each form runs inside a
checkpointed segment whose gradient depends on every byte of the declared storage, against eager,
bitwise: under ``whole``, under ``region`` on a storage kept whole (at most
``SMALL_STORAGE_BYTES``) and on a journaled one, alone and nested.
"""
from __future__ import annotations

import pytest
import torch

from stateremat.torch import ReplayError, checkpoint
from stateremat.torch._txn import SMALL_STORAGE_BYTES

D = torch.float64
SIZES = {"small": 64, "journaled": SMALL_STORAGE_BYTES // 8 + 64}  # float64 elements


def _writes(n: int) -> dict:
    i = torch.tensor([3, 1, 7])
    return {
        "add_": lambda q: q[:8].add_(1.5),
        "copy_slice": lambda q: q[10:20].copy_(torch.arange(10, dtype=D)),
        "strided": lambda q: q[::7].mul_(0.5),
        "index_put_int": lambda q: q.index_put_((i,), torch.tensor(2.0, dtype=D)),
        "index_put_mask": lambda q: q.index_put_((torch.arange(n) % 5 == 0,), torch.tensor(-1.0, dtype=D)),
        "index_put_bool_0dim": lambda q: q.index_put_((torch.tensor(True),), torch.tensor(5.0, dtype=D)),
        "index_put_accumulate": lambda q: q.index_put_((torch.tensor([2, 2, 4]),), torch.ones(3, dtype=D),
                                                       accumulate=True),
        "index_copy_": lambda q: q.index_copy_(0, i, torch.ones(3, dtype=D)),
        "index_fill_0dim_view": lambda q: q[5].index_fill_(0, torch.tensor([0]), 2.5),
        "index_add_0dim_view": lambda q: q[6].index_add_(0, torch.tensor([0]), torch.tensor(1.0, dtype=D)),
        "scatter_": lambda q: q.view(-1, 8).scatter_(1, torch.tensor([[1], [3]]), 9.0),
        "masked_fill_": lambda q: q.masked_fill_(torch.arange(n) % 3 == 1, 0.25),
        "fill_diagonal_": lambda q: q[: 64].view(8, 8).fill_diagonal_(4.0),
        "put_": lambda q: q.put_(torch.tensor([0, n - 1]), torch.tensor([1.0, 2.0], dtype=D)),
        "index_reduce_": lambda q: q.index_reduce_(0, i, torch.full((3,), 2.0, dtype=D), "prod"),
        "out_same_shape": lambda q: torch.add(q[:4].clone(), 1.0, out=q[4:8]),
        "setitem_tensor": lambda q: q.__setitem__(torch.tensor([9, 11]), 7.0),
    }


FORMS = sorted(_writes(64))


def _run(form: str, size: str, mode: str, nested: bool):
    n = SIZES[size]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(n, dtype=D, generator=g)
    coef = torch.randn(n, dtype=D, generator=g)
    x = torch.randn(3, dtype=D, generator=g, requires_grad=True)
    write = _writes(n)[form]

    def seg(x):
        y = (x * (q * coef).sum()).sin()  # the gradient reads every byte of q
        with torch.no_grad():
            write(q)
        return y

    if mode == "eager":
        y = seg(x)
    elif nested:
        other = "whole" if mode == "region" else "region"
        y = checkpoint(lambda x: checkpoint(seg, x, state=[q], preserve=mode) * 1.0, x, state=[q], preserve=other)
    else:
        y = checkpoint(seg, x, state=[q], preserve=mode)
    q.mul_(1.25)  # a write between forward and backward: the replay must not see it
    (gx,) = torch.autograd.grad(y.sum(), x)
    return gx, q


@pytest.mark.filterwarnings("ignore:index_reduce:UserWarning")
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("mode", ["whole", "region"])
@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("form", FORMS)
def test_every_write_form_replays_exactly(form, size, mode, nested):
    want = _run(form, size, "eager", False)
    got = _run(form, size, mode, nested)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), form


def _resize_out(size: str, mode: str):
    n = SIZES[size]
    q = torch.randn(n, dtype=D, generator=torch.Generator().manual_seed(1))
    x = torch.randn(8, dtype=D, generator=torch.Generator().manual_seed(2), requires_grad=True)

    def seg(x):
        y = (x * q[:8].clone()).sin()
        with pytest.warns(UserWarning, match="resized"):  # torch deprecates resizing a non-empty out=
            torch.add(y.detach(), 1.0, out=q[0:2])  # the kernel resizes the view to 8: writes q[0:8]
        return y

    y = seg(x) if mode == "eager" else checkpoint(seg, x, state=[q], preserve=mode)
    return torch.autograd.grad(y.sum(), x)[0], q


@pytest.mark.parametrize("size,mode", [("small", "region"), ("small", "whole"), ("journaled", "whole")])
def test_an_out_argument_resized_by_the_kernel_replays_exactly_when_snapshotted(size, mode):
    want = _resize_out(size, "eager")
    assert all(torch.equal(a, b) for a, b in zip(_resize_out(size, mode), want))


def test_an_out_argument_resized_past_its_journaled_bytes_is_refused_not_wrong():
    with pytest.raises(ReplayError, match=r"written past the bytes journaled.*out= argument of shape \(2,\) "
                                          r"resized to \(8,\).*preserve='whole'"):
        _resize_out("journaled", "region")


_VIEW_CHANGES = {
    "t_": lambda w: w.t_(),
    "transpose_": lambda w: w.transpose_(0, 1),
    "as_strided_": lambda w: w.as_strided_((4, 4), (1, 4)),
    "unsqueeze_": lambda w: w.unsqueeze_(0),
    "slide_window": lambda w: w.as_strided_((4, 4), (4, 1), w.storage_offset() + 4),
}


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("mode", ["whole", "region"])
@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("when", ["in_forward", "before_backward"])
@pytest.mark.parametrize("change", sorted(_VIEW_CHANGES))
def test_a_declared_view_changed_in_place_is_replayed_through_the_forwards_view(change, when, size, mode, nested):
    """``buf.t_()`` in the forward or between forward and backward: eager's backward used the
    forward's values; the replay must read the buffer through the view the forward started with
    (it was silently transposed before)."""
    def run(ckpt):
        n = SIZES[size]
        g = torch.Generator().manual_seed(3)
        base = torch.randn(n, dtype=D, generator=g)
        w = base[:16].view(4, 4)
        x = torch.randn(4, 4, dtype=D, generator=g, requires_grad=True)

        def seg(x):
            y = (x * w.clone()).sin()
            if when == "in_forward":
                _VIEW_CHANGES[change](w)
            return y

        if ckpt is None:
            y = seg(x)
        elif nested:
            other = "whole" if ckpt == "region" else "region"
            y = checkpoint(lambda x: checkpoint(seg, x, state=[w], preserve=ckpt) * 1.0, x, state=[w],
                           preserve=other)
        else:
            y = checkpoint(seg, x, state=[w], preserve=ckpt)
        if when == "before_backward":
            _VIEW_CHANGES[change](w)
        (gx,) = torch.autograd.grad(y.sum(), x)
        return gx, w.shape, w.stride(), w.storage_offset(), base

    want, got = run(None), run(mode)
    assert torch.equal(got[0], want[0]) and got[1:4] == want[1:4] and torch.equal(got[4], want[4])


@pytest.mark.parametrize("wrapper", ["checkpoint", "StatefulCheckpoint"])
@pytest.mark.parametrize("mode", ["whole", "region"])
@pytest.mark.parametrize("toggle", ["eval", "train"])
def test_training_flags_changed_before_the_backward_do_not_reach_the_replay(toggle, mode, wrapper):
    """``model.eval()`` between forward and backward: eager's backward used the training forward's
    batch statistics and dropout mask; the replay must run in the forward's mode too."""
    from stateremat.torch import StatefulCheckpoint

    def run(ckpt):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Dropout(0.3)).to(D)
        m.train(toggle == "eval")
        x = torch.randn(5, 4, dtype=D, requires_grad=True)
        if ckpt is None:
            y = m(x)
        elif wrapper == "checkpoint":
            y = checkpoint(m, x, state=[m], preserve=ckpt)
        else:
            y = StatefulCheckpoint(m, state="buffers", preserve=ckpt)(x)
        m.train(toggle != "eval")
        grads = torch.autograd.grad(y.square().sum(), [x, *m.parameters()])
        return [*grads, *m.state_dict().values(), torch.tensor([mod.training for mod in m.modules()])]

    want, got = run(None), run(mode)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def _aminmax_into_one_storage(size: str, mode: str):
    q = torch.randn(SIZES[size], dtype=D, generator=torch.Generator().manual_seed(4))
    x = torch.randn(2, dtype=D, generator=torch.Generator().manual_seed(5), requires_grad=True)

    def f(x):
        y = x * q[40:42].clone()
        torch.aminmax(x.detach().view(1, 2), dim=0, out=(q[0:2], q[40:40]))  # the empty view is resized
        return y.sum()

    out = f(x) if mode == "eager" else checkpoint(f, x, state=[q], preserve=mode)
    out.backward()
    return x.grad, q


def test_an_empty_out_argument_beside_another_on_one_storage_is_seen():
    """Two out= tensors on one journaled storage, one empty (skipped as a write) and resized by the
    kernel: the other's journaled write must not hide it."""
    for size, mode in [("journaled", "whole"), ("small", "region"), ("small", "whole")]:
        want = _aminmax_into_one_storage(size, "eager")
        assert all(torch.equal(a, b) for a, b in zip(_aminmax_into_one_storage(size, mode), want))
    with pytest.raises(ReplayError, match=r"aminmax.*out= argument of shape \(0,\) resized to \(2,\)"):
        _aminmax_into_one_storage("journaled", "region")


class _EMA(torch.nn.Module):
    def __init__(self, n: int, change: str):
        super().__init__()
        self.register_buffer("m", torch.randn(n, dtype=D, generator=torch.Generator().manual_seed(6))[:16].view(4, 4))
        self.change = change

    def forward(self, x):
        out = x @ self.m.clone()
        if self.change == "rebind":
            self.m = self.m * 0.5 + 1.0
        elif self.change == "t_":
            self.m.t_()
        return out


@pytest.mark.parametrize("outer_declares", [False, True])
@pytest.mark.parametrize("mode", ["whole", "region"])
@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("change", ["rebind", "t_", "t_between", "dtype_view_between"])
def test_an_inner_segments_bindings_and_views_are_replayed_by_the_outer_one(change, size, mode, outer_declares):
    """A nested segment's forward rebinds or re-views its declared buffer (or the view changes
    before the backward): the outer segment's replay runs the inner forward again and must start
    from the inner segment's bindings and views, and leave the current ones afterwards."""
    from stateremat.torch import StatefulCheckpoint

    def run(ckpt):
        e = _EMA(SIZES[size], change if change in ("rebind", "t_") else "")
        inner = StatefulCheckpoint(e, state="buffers", preserve=ckpt) if ckpt else e
        x = torch.randn(2, 4, dtype=D, generator=torch.Generator().manual_seed(7), requires_grad=True)
        z = torch.randn(2, 4, dtype=D, generator=torch.Generator().manual_seed(8), requires_grad=True)

        def f(x, z):
            return (inner(x) * z).sum()

        out = f(x, z) if ckpt is None else checkpoint(f, x, z, state=[e] if outer_declares else [], preserve=ckpt)
        if change == "t_between":
            e.m.t_()
        elif change == "dtype_view_between":
            e.m.data = e.m.data.view(torch.int64)
        out.backward()
        m = e.m if e.m.dtype == D else e.m.view(D)
        return x.grad, z.grad, m.clone(), m.stride()

    want, got = run(None), run(mode)
    assert all(torch.equal(a, b) for a, b in zip(got[:3], want[:3])) and got[3] == want[3]


@pytest.mark.parametrize("mode", ["whole", "region"])
def test_a_training_flag_the_forward_flips_is_left_as_eager_leaves_it(mode):
    """A forward that flips a dropout's flag: the replay flips it again; afterwards every flag is
    as eager leaves it, so the next step matches too."""
    class Alt(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            y = self.drop(x)
            self.drop.train(not self.drop.training)
            return torch.tanh(y) * 2

    def run(ckpt):
        torch.manual_seed(0)
        m = Alt()
        x = torch.randn(8, dtype=D, requires_grad=True)
        seg = (lambda h: checkpoint(m, h, state=[], preserve=ckpt)) if ckpt else m
        seg(seg(x)).sum().backward()
        return x.grad, torch.tensor(m.drop.training), m(x.detach())

    assert all(torch.equal(a, b) for a, b in zip(run(mode), run(None)))


@pytest.mark.parametrize("mode", ["whole", "region"])
def test_an_undeclared_view_changed_before_the_backward_is_replayed_through_the_forwards_view(mode):
    def run(ckpt):
        g = torch.Generator().manual_seed(9)
        holder = {"v": torch.randn(4, 4, dtype=D, generator=g)}  # reached by the scan, not declared
        x = torch.randn(2, 4, dtype=D, generator=g, requires_grad=True)

        def f(x):
            return (x @ holder["v"].clone()).sin().sum()

        out = f(x) if ckpt is None else checkpoint(f, x, preserve=ckpt)
        holder["v"].t_()
        out.backward()
        return x.grad, holder["v"].stride()

    want, got = run(None), run(mode)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
