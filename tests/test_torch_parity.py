"""Drop-in parity with torch's non-reentrant checkpoint: PyTorch's own tests, in our words.

Every case runs against three checkpoint functions with exactly torch's signature:
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (``torch``), and ours,
``stateremat.torch.Checkpointer()`` (``region``, the default preserver) and
``Checkpointer(preserve="whole")`` (``whole``). None of these programs mutates pre-existing
state, so ours must behave exactly as torch does: same values, same gradients (bitwise in
float64 where torch's test is exact), same recomputation counts, errors of the same type
(``torch.utils.checkpoint.CheckpointError`` for replay errors; the wording is ours).

Scenarios come from PyTorch's ``test/test_autograd.py`` (``TestAutograd`` checkpoint tests,
``TestNestedCheckpoint``, ``TestSelectiveActivationCheckpoint``) and ``test/test_utils.py``
(``TestCheckpoint``); CUDA-only cases (memory, device RNG, device context) are left out.
An ``xfail(strict=True)`` on ours marks either an intentional difference (the reason starts
with "intentional:") or a known bug (the reason starts with "bug:").
"""
from __future__ import annotations

import collections
import contextlib
import functools
import gc
import warnings
import weakref
from copy import deepcopy

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointError, CheckpointPolicy, create_selective_checkpoint_contexts

from stateremat.torch import Checkpointer

F64 = torch.float64

_IMPLS = {
    "torch": lambda: functools.partial(tuc.checkpoint, use_reentrant=False),
    "region": lambda: Checkpointer(),
    "whole": lambda: Checkpointer(preserve="whole"),
}
OURS = ("region", "whole")


def impls(*, xfail: dict[str, str] | None = None, only: tuple[str, ...] = tuple(_IMPLS)):
    """Parametrize ``ckpt`` over the implementations, marking ours xfail(strict) where given."""
    params = []
    for name in only:
        reason = (xfail or {}).get(name)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(name, marks=marks, id=name))
    return pytest.mark.parametrize("ckpt", params, indirect=True)


def ours_xfail(reason: str) -> dict[str, str]:
    return {name: reason for name in OURS}


@pytest.fixture
def ckpt(request):
    return _IMPLS[request.param]()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def equal(a, b) -> bool:
    return a is None and b is None or (a is not None and b is not None and torch.equal(a, b))


def grads(module: nn.Module) -> list:
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


# =============================================================================================
# 1. Basic gradients, kwargs, structures (TestAutograd, TestCheckpoint)
# =============================================================================================
@impls()
@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_module_by_keyword_matches_eager(ckpt, input_requires_grad):
    # test_checkpointing_without_reentrant (scaled down): a module called with data=...
    class Holder(nn.Module):
        def __init__(self, mod):
            super().__init__()
            self.module = mod

        def forward(self, data):
            return self.module(data)

    module = Holder(nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 10)).to(F64))
    copy = deepcopy(module)
    outs, ref = [], []
    for _ in range(20):
        data = torch.rand(1, 10, dtype=F64).requires_grad_(input_requires_grad)
        outs.append(ckpt(module, data=data))
        ref.append(copy(data))
    torch.stack(outs).mean().backward()
    torch.stack(ref).mean().backward()
    for a, b in zip(module.parameters(), copy.parameters()):
        assert torch.equal(a.grad, b.grad)


@impls()
def test_backward_and_autograd_grad_match_eager(ckpt):
    # test_checkpointing_without_reentrant_correct_grad
    a = torch.randn(2, 2, dtype=F64, requires_grad=True)
    torch.exp(a).sum().backward()
    expected, a.grad = a.grad, None
    ckpt(torch.exp, a).sum().backward()
    assert torch.equal(a.grad, expected)
    (g,) = torch.autograd.grad(ckpt(torch.exp, a).sum(), (a,))
    assert torch.equal(g, expected)


@impls()
def test_kwargs_reach_fn_and_get_gradients(ckpt):
    # TestNestedCheckpoint.test_nested_checkpoint_kwargs
    def fn(a, blah=None):
        out = a.sin().exp()
        if blah is not None:
            out = out * blah
        return out.sin().exp()

    a = torch.tensor(2.0, dtype=F64, requires_grad=True)
    b = torch.tensor(3.0, dtype=F64, requires_grad=True)
    for early_stop in (True, False):
        with tuc.set_checkpoint_early_stop(early_stop):
            got = torch.autograd.grad(ckpt(fn, a, blah=b), (a, b))
        want = torch.autograd.grad(fn(a, blah=b), (a, b))
        assert all(torch.equal(g, w) for g, w in zip(got, want))


@impls()
def test_dict_input_and_output(ckpt):
    # test_checkpointing_without_reentrant_arbitrary_input_output
    class DictModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(5, 5, bias=False).to(F64)

        def forward(self, d):
            return {"result": self.layer(d["tensor"])}

    eager = DictModel()
    model = deepcopy(eager)
    inp = {"tensor": torch.randn(5, 5, dtype=F64)}
    want = eager(inp)["result"].sum()
    got = ckpt(model, inp)["result"].sum()
    assert torch.equal(got, want)
    want.backward()
    got.backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(eager.parameters(), model.parameters()))


@impls()
def test_none_argument(ckpt):
    # TestCheckpoint.test_checkpoint_non_tensor
    def run_fn(t1, t2):
        return t1 if t2 is None else t1 + t2

    x = torch.randn(1, 100, dtype=F64, requires_grad=True)
    ckpt(run_fn, x, None).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


@impls()
def test_non_tensor_inputs_and_outputs(ckpt):
    # TestCheckpoint.test_checkpoint_non_tensor_inputs_outputs
    def foo(t1, t2, scale, t3):
        t4 = t1 + t2 * t3
        t5 = t1 * t2 + t3
        t4 *= scale
        t5 *= scale
        return scale, t4, None, True, t5, "bar", t1

    t1 = torch.rand(10, dtype=F64, requires_grad=True)
    t2 = torch.rand(10, dtype=F64, requires_grad=True)
    t3 = torch.rand(10, dtype=F64)
    scale = 7
    res = ckpt(foo, t1, t2, scale, t3)
    assert res[0] == scale and res[2] is None and res[3] is True and res[5] == "bar"
    assert torch.equal(res[1], (t1 + t2 * t3) * scale)
    assert torch.equal(res[4], (t1 * t2 + t3) * scale)
    assert torch.equal(res[6], t1)
    res[1].sum().backward(retain_graph=True)
    res[4].sum().backward(retain_graph=True)
    res[6].sum().backward()
    g1, g2 = t1.grad, t2.grad
    t1.grad = t2.grad = None
    ref = foo(t1, t2, scale, t3)
    torch.autograd.backward([ref[1].sum(), ref[4].sum(), ref[6].sum()])
    assert torch.equal(t1.grad, g1) and torch.equal(t2.grad, g2)


@impls()
def test_no_tensor_inputs(ckpt):
    # TestCheckpoint.test_checkpoint_no_tensors
    def foo(t1, t2, scale, t3):
        t4 = (t1 + t2 * t3) * scale
        t5 = (t1 * t2 + t3) * scale
        return scale, t4, None, True, t5, "bar", t1

    res = ckpt(foo, 0.25, 0.5, 3, 0.75)
    assert res == (3, (0.25 + 0.5 * 0.75) * 3, None, True, (0.25 * 0.5 + 0.75) * 3, "bar", 0.25)


@impls()
@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_non_tensor_inputs_and_outputs(ckpt, early_stop):
    # TestNestedCheckpoint.test_nested_checkpoint_non_tensor_inputs_and_outputs
    def fn(k, a, b, f):
        return f(k * a * b.exp()), 1, "abcd"

    a = torch.tensor(2.0, dtype=F64, requires_grad=True)
    b = torch.tensor(3.0, dtype=F64, requires_grad=True)
    with tuc.set_checkpoint_early_stop(early_stop):
        out, one, text = ckpt(fn, 3, a, b, torch.sin)
    assert (one, text) == (1, "abcd")
    got = torch.autograd.grad(out, (a, b))
    want = torch.autograd.grad(fn(3, a, b, torch.sin)[0], (a, b))
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@impls()
def test_multiple_outputs_each_differentiated(ckpt):
    def fn(x):
        y = x.sin().cos()
        return y, y.exp(), x * 2

    x = torch.randn(3, dtype=F64, requires_grad=True)
    y, z, w = ckpt(fn, x)
    ey, ez, ew = fn(x)
    assert torch.equal(y, ey) and torch.equal(z, ez) and torch.equal(w, ew)
    for got, want in ((y, ey), (z, ez), (w, ew)):
        assert torch.equal(torch.autograd.grad(got.sum(), x, retain_graph=True)[0],
                           torch.autograd.grad(want.sum(), x, retain_graph=True)[0])
    assert torch.equal(torch.autograd.grad((y * z).sum(), x)[0], torch.autograd.grad((ey * ez).sum(), x)[0])


@impls()
def test_partial_grad_outputs(ckpt):
    # TestCheckpoint.test_checkpoint_partial_grad (non-reentrant semantics)
    x = torch.randn(1, 4, dtype=F64, requires_grad=True)
    other = torch.randn(1, 4, dtype=F64)
    out = ckpt(lambda a, b: (a, b), x, other)
    assert out[0].requires_grad and not out[1].requires_grad
    out[0].sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    # an output that needs no grad: backward through it is autograd's own error, in both
    x2 = torch.randn(1, 4, dtype=F64)
    y2 = torch.randn(1, 4, dtype=F64, requires_grad=True)
    out = ckpt(lambda a, b: a, x2, y2)
    assert not out.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()


@impls()
def test_outputs_not_requiring_grad_inside_no_grad(ckpt):
    # test_checkpointing_without_reentrant_detached_tensor
    class NoGradModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2, bias=False).to(F64)
            self.lin2 = nn.Linear(2, 2, bias=False).to(F64)

        def forward(self, x):
            with torch.no_grad():
                return self.lin2(self.linear(x))

    module = NoGradModule()
    a = torch.randn(2, 2, dtype=F64, requires_grad=True)
    for i in range(3):
        out = ckpt(module, a)
        assert not out.requires_grad
        out += a
        out.sum().backward()
        assert torch.equal(a.grad, torch.full((2, 2), i + 1.0, dtype=F64))


@impls()
def test_under_no_grad_runs_plainly(ckpt):
    calls = []

    def fn(x):
        calls.append(1)
        return x.sin()

    x = torch.randn(3, dtype=F64, requires_grad=True)
    with torch.no_grad():
        y = ckpt(fn, x)
    assert not y.requires_grad and y.grad_fn is None and len(calls) == 1
    assert torch.equal(y, x.detach().sin())


@impls()
def test_saved_non_grad_input_keeps_identity(ckpt):
    # test_checkpointing_without_reentrant_saved_object_identity
    seen = []

    class Test(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(y)
            return x

        @staticmethod
        def backward(ctx, g):
            seen.append(ctx.saved_tensors[0])
            return g, None

    a = torch.tensor(1.0, requires_grad=True)
    b = torch.tensor(1.0)
    ckpt(Test.apply, a, b).backward()
    assert seen[0] is b


@impls()
def test_parameter_used_inside_and_outside_hook_fires_once(ckpt):
    # test_checkpointing_without_reentrant_parameter_used_in_an_out
    w = torch.randn(10, 10, dtype=F64, requires_grad=True)
    count = [0]
    w.register_hook(lambda g: count.__setitem__(0, count[0] + 1))
    x = torch.rand(10, 10, dtype=F64, requires_grad=True)
    h = w * x
    ckpt(lambda t: w * t, h).sum().backward()
    assert count[0] == 1
    assert torch.equal(w.grad, x.detach() * 2 * w.detach())


@impls()
def test_explicit_use_reentrant_false_does_not_warn(ckpt):
    # test_checkpoint_warns_if_use_reentrant_not_passed_explcitly (the explicit half)
    a = torch.randn(1, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt(lambda x: x * 2, a, use_reentrant=False)


@impls(xfail=ours_xfail("intentional: ours supports only the non-reentrant implementation and refuses "
                        "use_reentrant=True with a ValueError (README 'Using it')"))
def test_use_reentrant_true_runs(ckpt):
    a = torch.randn(3, dtype=F64, requires_grad=True)
    ckpt(torch.exp, a, use_reentrant=True).sum().backward()
    assert torch.equal(a.grad, a.detach().exp())


@impls()
def test_checkpointed_segments_of_a_sequence(ckpt):
    # TestCheckpoint.test_checkpoint / test_checkpoint_module_list, segments run by ckpt
    model = nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.ReLU(),
                          nn.Linear(20, 5), nn.ReLU()).to(F64)
    x = torch.randn(1, 100, dtype=F64, requires_grad=True)
    want = model(x)
    want.sum().backward()
    want_grads, want_x = grads(model), x.grad.clone()
    model.zero_grad()
    x.grad = None
    first, second = model[:3], model[3:]
    got = ckpt(second, ckpt(first, x))
    assert torch.equal(got, want)
    got.sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(grads(model), want_grads))
    assert torch.equal(x.grad, want_x)


@impls()
def test_recomputation_runs_once_per_backward(ckpt):
    # TestCheckpoint.test_checkpoint_trigger, with each module checkpointed by ckpt
    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.counter = 0

        def forward(self, x):
            self.counter += 1
            return x * torch.tensor(2.0, dtype=F64)

    mods = [Counted() for _ in range(6)]
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    h = x
    for i, m in enumerate(mods):
        h = ckpt(m, h) if i < 3 else m(h)
    assert [m.counter for m in mods] == [1] * 6
    h.sum().backward()
    assert [m.counter for m in mods] == [2, 2, 2, 1, 1, 1]
    assert torch.equal(x.grad, torch.full_like(x, 64.0))


@impls()
def test_create_graph_gradients_match_eager(ckpt):
    # TestCheckpoint.test_checkpoint_valid (works with use_reentrant=False)
    model = nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.ReLU(),
                          nn.Linear(20, 5), nn.ReLU()).to(F64)
    x = torch.randn(1, 100, dtype=F64, requires_grad=True)
    out = model(x)
    want = torch.autograd.grad([out], [x], grad_outputs=[torch.ones(1, 5, dtype=F64)], create_graph=True)
    got_out = ckpt(model[3:], ckpt(model[:3], x))
    assert torch.equal(got_out, out)
    got = torch.autograd.grad([got_out], [x], grad_outputs=[torch.ones(1, 5, dtype=F64)], create_graph=True)
    assert torch.equal(got[0], want[0])


# =============================================================================================
# 2. Nested checkpoints (TestNestedCheckpoint): depth, siblings, grad of grad, backward inside
#    the checkpointed function (torch's Rule 6), retained graphs, graphs freed afterwards
# =============================================================================================
def _grad(fn):
    def wrapper(x):
        with torch.enable_grad():
            out = fn(x)
            (g,) = torch.autograd.grad(out, inputs=(x,), create_graph=True)
        return g
    return wrapper


def _sum(fn):
    return lambda x: fn(x).sum()


def _wrap(ckpt):
    return lambda fn: (lambda *args, **kwargs: ckpt(fn, *args, **kwargs))


def _nesting_patterns(fn, c):
    """(expected, [equivalent functions with checkpoints nested in them]) as in torch's get_tests."""
    g = _grad
    return [
        (fn, [c(fn), c(c(fn))]),
        (g(fn), [g(c(fn)), g(c(c(fn)))]),
        (g(g(fn)), [g(c(g(fn))), c(g(g(c(fn)))), g(c(g(c(fn))))]),
        (g(g(g(fn))), [g(c(g(g(c(fn))))), g(c(g(c(g(c(fn))))))]),
    ]


def _graph_dies(fn) -> list[str]:
    """Names of autograd nodes of ``fn(a)``'s graph still alive once its output is dropped."""
    class Handle:
        def __init__(self, name):
            self.name = name

    def scope():
        a = torch.randn((), dtype=F64, requires_grad=True)
        out = fn(a)
        refs, seen, queue = [], set(), collections.deque([out.grad_fn])
        while queue:
            node = queue.popleft()
            if node is None or node in seen:
                continue
            seen.add(node)
            handle = Handle(node.name())
            refs.append(weakref.ref(handle))
            node.metadata["handle"] = handle
            queue.extend(n for n, _ in node.next_functions)
        return refs

    refs = scope()
    return [r().name for r in refs if r() is not None]


def _f_plain(x):
    return x.sin().exp().sin()


def _g_inner_backward(x):
    a = x.sin().exp().sin()
    b = x.sin().exp().sin()
    torch.autograd.grad(a, x)  # backward inside the checkpointed function (Rule 6), twice
    torch.autograd.grad(b, x)
    return x.sin()


BUG_RULE6 = (
    "bug: backward inside a segment's own forward with early stop off (torch's Rule 6): the replay "
    "it triggers runs the whole function and saves more tensors than the unfinished forward has "
    "packed; ours raises ReplayError 'saved more tensors during recomputation' where torch ignores "
    "the surplus while the forward is not completed (forward_completed/ignore_saved_mismatch; "
    "_segment.py Segment._recompute_hooks pack and Segment._check)")
BUG_LEAK = (
    "bug: a checkpoint met during a replay (_checkpoint._run_eagerly) saves tensors through identity "
    "saved-tensor hooks without detaching them, so a saved output holds its own grad_fn (C++ cycle "
    "node -> SavedVariable -> tensor -> node, invisible to gc): the replayed graph and the inputs it "
    "references, leaf parameters included, are never freed")


def _nested_params(bugs):
    """(fn, early_stop, impl) params; ``bugs(fn_id, early_stop)`` gives the reason ours fails, or None."""
    params = []
    for fn_id, fn in (("plain", _f_plain), ("inner_backward", _g_inner_backward)):
        for early_stop in (True, False):
            for impl in _IMPLS:
                reason = bugs(fn_id, early_stop) if impl in OURS else None
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                params.append(pytest.param(fn, early_stop, impl, marks=marks, id=f"{fn_id}-{early_stop}-{impl}"))
    return pytest.mark.parametrize("fn,early_stop,ckpt", params, indirect=["ckpt"])


@_nested_params(lambda fn_id, early_stop: None if early_stop else BUG_RULE6)
def test_nested_at_depth_and_grad_of_grad(ckpt, early_stop, fn):
    # TestNestedCheckpoint.test_nested_checkpoint: values of every nesting pattern
    c = _wrap(ckpt)
    with tuc.set_checkpoint_early_stop(early_stop):
        x = torch.randn((), dtype=F64, requires_grad=True)
        for expected_fn, actual_fns in _nesting_patterns(fn, c):
            expected = expected_fn(x)
            for actual_fn in actual_fns:
                assert torch.allclose(actual_fn(x), expected, rtol=1e-12, atol=0)


def _graph_bugs(fn_id, early_stop):
    reasons = [BUG_LEAK] if fn_id == "plain" else []
    if not early_stop:
        reasons.append(BUG_RULE6)
    return "; and ".join(reasons) or None


@_nested_params(_graph_bugs)
def test_nested_graphs_are_freed(ckpt, early_stop, fn):
    # TestNestedCheckpoint.test_nested_checkpoint: check_graph_dies for every nesting pattern
    c = _wrap(ckpt)
    with tuc.set_checkpoint_early_stop(early_stop):
        for _, actual_fns in _nesting_patterns(fn, c):
            for actual_fn in actual_fns:
                assert _graph_dies(actual_fn) == []


@impls(xfail=ours_xfail(BUG_LEAK))
@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_backward_frees_inputs(ckpt, early_stop):
    # check_graph_dies after a backward through a nested checkpoint (a training step)
    refs = []
    for _ in range(3):
        x = torch.randn(100, dtype=F64, requires_grad=True)
        with tuc.set_checkpoint_early_stop(early_stop):
            out = ckpt(lambda t: ckpt(_f_plain, t.cos()).cos(), x)
        out.sum().backward()
        refs.append(weakref.ref(x))
        del x, out
    assert [r() for r in refs] == [None, None, None]


def _two_children(c):
    def f(x):
        return x.sin().exp().sin()

    def h2(x):
        return x.cos().sin().exp()

    def hc(x):
        return c(h2)(c(f)(x))

    def h(x):
        return h2(f(x))
    return h, hc


def _two_children_values(ckpt, early_stop):
    c, g, s = _wrap(ckpt), _grad, _sum
    h, hc = _two_children(c)
    with tuc.set_checkpoint_early_stop(early_stop):
        a = torch.randn(3, 3, dtype=F64, requires_grad=True)
        expected = g(s(g(s(h))))(a)
        assert torch.allclose(g(s(g(s(c(hc)))))(a), expected, rtol=1e-12, atol=0)
        assert torch.allclose(g(s(c(g(s(c(hc))))))(a), expected, rtol=1e-12, atol=0)


@impls()
def test_nested_two_children(ckpt):
    # TestNestedCheckpoint.test_nested_checkpoint_two_children[early_stop=True]: values
    _two_children_values(ckpt, True)


@impls(xfail=ours_xfail(BUG_RULE6))
def test_nested_two_children_no_early_stop(ckpt):
    # TestNestedCheckpoint.test_nested_checkpoint_two_children[early_stop=False]: values
    _two_children_values(ckpt, False)


@impls(xfail=ours_xfail(BUG_LEAK))
def test_nested_two_children_graphs_are_freed(ckpt):
    # TestNestedCheckpoint.test_nested_checkpoint_two_children: check_graph_dies (early stop on)
    c, g, s = _wrap(ckpt), _grad, _sum
    _, hc = _two_children(c)
    assert _graph_dies(g(c(hc))) == []
    assert _graph_dies(g(s(g(s(c(hc)))))) == []
    assert _graph_dies(g(s(c(g(s(c(hc))))))) == []


@impls()
@pytest.mark.parametrize("early_stop", [True, False])
def test_hook_on_original_graph_fires_once(ckpt, early_stop):
    # TestNestedCheckpoint.test_nested_checkpoint_same_graph
    counter = [0]
    a = torch.tensor(1.0, dtype=F64, requires_grad=True)
    with tuc.set_checkpoint_early_stop(early_stop):
        out = ckpt(lambda t: t.sin().cos().sin(), a)
    out.grad_fn.next_functions[0][0].register_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    out.backward()
    assert counter[0] == 1
    assert torch.equal(a.grad, torch.cos(torch.cos(a.detach().sin())) * -torch.sin(a.detach().sin())
                       * torch.cos(a.detach()))


@impls()
@pytest.mark.parametrize("early_stop", [True, False])
def test_backward_from_a_hook_during_backward(ckpt, early_stop):
    # TestNestedCheckpoint.test_nested_checkpoint_reentrant_backwards
    def fn(a):
        x = a.sin().cos()
        return x, x.sin()

    a = torch.tensor(1.0, dtype=F64, requires_grad=True)
    with tuc.set_checkpoint_early_stop(early_stop):
        x, out = ckpt(fn, a)
    out.grad_fn.register_hook(lambda *_: x.backward(retain_graph=True))
    out.backward(retain_graph=True)
    ref = a.detach().requires_grad_()
    rx = ref.sin().cos()
    (want,) = torch.autograd.grad(rx + rx.sin(), ref)
    assert torch.allclose(a.grad, want, rtol=1e-12, atol=0)


def _counting_fn(counter):
    def clone(x):
        counter[0] += 1
        return x.clone()

    def fn(x):
        return clone(x.sin().cos())  # clone saves nothing: not re-run when stopping early
    return fn


@impls()
def test_early_stop_local_global_and_precedence(ckpt):
    # TestNestedCheckpoint.test_nested_checkpoint_set_early_stop
    def run(expected, local=None, ctx=()):
        counter = [0]
        a = torch.tensor(1.0, dtype=F64, requires_grad=True)
        kwargs = {} if local is None else {"early_stop": local}
        with contextlib.ExitStack() as stack:
            for value in ctx:
                stack.enter_context(tuc.set_checkpoint_early_stop(value))
            out = ckpt(_counting_fn(counter), a, **kwargs)
        out.backward()  # the setting is the forward's, though the context has exited
        assert counter[0] == expected, (local, ctx)

    run(1)                              # default: early stop on
    run(2, local=False)
    run(1, local=True)
    run(2, ctx=(False,))
    run(1, ctx=(True,))
    run(1, local=False, ctx=(False, True))  # innermost context wins over the argument
    run(2, local=True, ctx=(False,))        # the context wins over the argument
    run(1, local=False, ctx=(True,))


class _SinCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.sin.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@impls()
@pytest.mark.parametrize("early_stop", [True, False])
def test_early_stop_when_no_recomputation_is_needed(ckpt, early_stop):
    # TestNestedCheckpoint.test_nested_checkpoint_set_early_stop_no_recompution_needed
    counter = [0]

    def fn(x):
        counter[0] += 1
        return x.sin()  # saves only its input

    a = torch.tensor(1.0, dtype=F64, requires_grad=True)
    with _SinCounter() as mode:
        with tuc.set_checkpoint_early_stop(early_stop):
            out = ckpt(fn, a)
        out.backward()
    assert counter[0] == 2
    assert mode.count == (1 if early_stop else 2)  # early stop happens before the kernel runs

    counter = [0]

    def fn2(x):
        counter[0] += 1
        return x.clone()  # saves nothing: never unpacked, never recomputed

    with tuc.set_checkpoint_early_stop(early_stop):
        out = ckpt(fn2, torch.tensor(1.0, dtype=F64, requires_grad=True))
    out.backward()
    assert counter[0] == 1


@impls()
def test_mixed_nesting_with_torch_checkpoint(ckpt):
    # ours inside torch's checkpoint and torch's inside ours, no state: plain nesting
    torch_ckpt = _IMPLS["torch"]()
    x = torch.randn(4, dtype=F64, requires_grad=True)
    want = torch.autograd.grad(_f_plain(_f_plain(x)).sum(), x)[0]
    for outer, inner in ((torch_ckpt, ckpt), (ckpt, torch_ckpt)):
        out = outer(lambda t: inner(_f_plain, _f_plain(t)), x)
        assert torch.allclose(torch.autograd.grad(out.sum(), x)[0], want, rtol=1e-12, atol=0)
