"""Issue 27 item 4: the public torch APIs refuse misuse with stateremat's own error before any work:
nested/sparse/meta/quantized tensors in ``state=``, a ``state=`` that contains itself or nests too
deep, a model that is not a module, a deeply nested plan; and a hypothesis test feeding random
``state=`` structures (each outcome is eager's result or one of the documented errors)."""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from stateremat.torch import StatefulCheckpoint, UnsupportedError, apply_plan, auto_checkpoint, checkpoint, profile



def _quiet(make):
    def f():
        with warnings.catch_warnings():  # beta-layout warnings of torch
            warnings.simplefilter("ignore")
            return make()
    return f


_nested = _quiet(lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]))
_quantized = _quiet(lambda: torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8))


BAD_TENSORS = {
    "nested": (_nested, "a nested tensor"),
    "sparse": (lambda: torch.zeros(3).to_sparse(), "sparse_coo tensor"),
    "csr": (_quiet(lambda: torch.zeros(2, 2).to_sparse_csr()), "sparse_csr tensor"),
    "meta": (lambda: torch.zeros(3, device="meta"), "a meta tensor"),
    "quantized": (_quantized, "a quantized tensor"),
}


def _self_list():
    s = [torch.zeros(1)]
    s.append(s)
    return s


def _deep(n=5000):
    s = [torch.zeros(1)]
    for _ in range(n):
        s = [s]
    return s


def _apis():
    x = torch.randn(3, requires_grad=True)
    return {
        "checkpoint": lambda state: checkpoint(lambda t: t.sin(), x, state=state).sum().backward(),
        "StatefulCheckpoint": lambda state: StatefulCheckpoint(nn.Linear(3, 3), state=state),
        "apply_plan": lambda state: apply_plan(nn.Sequential(nn.Linear(3, 3)),
                                               {"options": ["whole"], "segment_names": ["0"]}, state=state),
    }


_NAMES = {"checkpoint": "stateremat.torch.checkpoint", "StatefulCheckpoint": "stateremat.torch.StatefulCheckpoint",
          "apply_plan": "apply_plan"}


@pytest.mark.parametrize("api", ["checkpoint", "StatefulCheckpoint", "apply_plan"])
@pytest.mark.parametrize("kind", sorted(BAD_TENSORS))
def test_unpreservable_tensor_in_state(api, kind):
    make, words = BAD_TENSORS[kind]
    with pytest.raises(UnsupportedError, match=rf"{_NAMES[api]}: declared state .*{words}.*Tip: "):
        _apis()[api]([torch.zeros(1), make()])


@pytest.mark.parametrize("api", ["checkpoint", "StatefulCheckpoint", "apply_plan"])
@pytest.mark.parametrize("make,words", [(_self_list, "contains itself"), (_deep, "is nested more than 100 levels")])
def test_self_containing_or_deep_state(api, make, words):
    with pytest.raises(ValueError, match=rf"{_NAMES[api]}: state= {words}.*Tip: "):
        _apis()[api](make())


def test_nested_tensor_buffer_of_declared_module():
    m = nn.Linear(3, 3)
    m.register_buffer("nt", _nested())
    with pytest.raises(UnsupportedError, match=r"StatefulCheckpoint: declared state Linear.nt is a nested tensor"):
        StatefulCheckpoint(m, state=[m])


def test_shallow_nesting_still_accepted():
    buf = torch.zeros(3)
    x = torch.randn(3, requires_grad=True)
    checkpoint(lambda t: buf.add_(1) * t, x, state=_deep(50)[0:0] + [[[buf]]]).sum().backward()
    assert torch.equal(buf, torch.ones(3))


@pytest.mark.parametrize("call,api", [
    (lambda f, x: auto_checkpoint(f, "1GiB", sample=(x,)), "stateremat.torch.auto_checkpoint"),
    (lambda f, x: profile(f, None, (x,)), "stateremat.torch.profile"),
    (lambda f, x: apply_plan(f, {"options": ["whole"], "segment_names": ["0"]}), "apply_plan"),
])
@pytest.mark.parametrize("model", [lambda t: t, None, "model"], ids=["lambda", "none", "str"])
def test_non_module_model(call, api, model):
    with pytest.raises(TypeError, match=rf"{api}: model must be an nn.Module .* got \w+\. Tip: "):
        call(model, torch.randn(2, 3))


@pytest.mark.parametrize("field", ["options", "segment_names"])
def test_deeply_nested_plan_fields(field):
    deep = "whole" if field == "options" else "0"
    for _ in range(5000):
        deep = [deep]
    plan = {"options": ["whole"], "segment_names": ["0"], field: [deep]}
    with pytest.raises(TypeError, match=rf"apply_plan: plan {field}\[0\] must be .* got a list\. Tip: "):
        apply_plan(nn.Sequential(nn.Linear(3, 3)), plan)


# ---- random state= structures ---------------------------------------------------------------
_LEAVES = ["dense", "buffer", "module", "generator", "string", "int", "float", "none", *sorted(BAD_TENSORS)]
_DOCUMENTED = (TypeError, ValueError, UnsupportedError)


def _structures():
    leaf = st.sampled_from(_LEAVES)
    return st.recursive(leaf, lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.tuples(kids, kids),
        st.dictionaries(st.sampled_from("ab"), kids, max_size=2),
        st.lists(kids, max_size=2).map(lambda xs: ["self", *xs])), max_leaves=8)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(3, 3)
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        self.count.add_(1)
        return self.l(x) * self.count


def _build(spec, block, made):
    if isinstance(spec, str):
        if spec == "dense":
            t = torch.zeros(2)
            made.append(t)
            return t
        return {"buffer": block.count, "module": block, "generator": torch.Generator().manual_seed(0),
                "string": "buffers", "int": 3, "float": 0.5, "none": None}.get(spec) \
            if spec not in BAD_TENSORS else BAD_TENSORS[spec][0]()
    if isinstance(spec, dict):
        return {k: _build(v, block, made) for k, v in spec.items()}
    items = [_build(v, block, made) for v in spec if v != "self"]
    if isinstance(spec, tuple):
        return tuple(items)
    if spec and spec[0] == "self":
        items.append(items)  # the list contains itself
    return items


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_structures(), deep=st.booleans())
def test_random_state_structures(spec, deep):
    torch.manual_seed(0)
    ref = _Block()
    got = _Block()
    got.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, requires_grad=True)
    made: list = []
    state = _build(spec, got, made)
    if deep:
        for _ in range(200):
            state = [state]
    if state == "buffers" or (isinstance(state, list) and not state):
        pass
    ref(x).sum().backward()
    g_ref, x.grad = x.grad, None
    try:
        out = checkpoint(got, x, state=state, on_undeclared="declare")
    except _DOCUMENTED as e:
        assert type(e).__module__.startswith(("builtins", "stateremat")), type(e)
        assert "stateremat.torch" in str(e) and "Tip:" in str(e), str(e)
        return
    out.sum().backward()
    assert torch.equal(x.grad, g_ref)
    assert torch.equal(got.count, ref.count)


def _deep_names(depth: int = 5000):
    names: list = ["0"]
    for _ in range(depth):
        names = [names]
    return names


def _lin_step(m):
    x = torch.randn(2, 4)
    return lambda mm: mm(x).sum().backward()


@pytest.mark.parametrize("call", ["profile", "auto_checkpoint"])
def test_deep_segments_list_is_refused_without_recursion(call):
    """A 5,000-deep ``segments=`` list: its message was built with repr, a RecursionError."""
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    run = (lambda: profile(m, _deep_names(), _lin_step(m))) if call == "profile" else \
        (lambda: auto_checkpoint(m, "1GiB", sample=torch.randn(2, 4), segments=_deep_names()))
    with pytest.raises(TypeError, match=r"segments must be module paths \(str\), got \[\[\["):
        run()


@pytest.mark.parametrize("optimizers, words", [
    ("one", "got one SGD. Tip: optimizers=\\[opt\\]"), (None, "got NoneType"), ("sgd", "got str"),
    ([3], "optimizers\\[0\\] must be an optimizer .* got int"),
    ("self", "optimizers\\[0\\] must be an optimizer .* got list"),
])
@pytest.mark.parametrize("call", ["profile", "auto_checkpoint"])
def test_optimizers_that_are_not_a_list_of_optimizers(call, optimizers, words):
    """``optimizers=`` is checked before any work (was: 'SGD' object is not iterable, or
    'int' object has no attribute 'state_dict' from deep inside the snapshot)."""
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    if optimizers == "one":
        optimizers = opt
    elif optimizers == "self":
        optimizers = []
        optimizers.append(optimizers)
    before = [p.detach().clone() for p in m.parameters()]
    run = (lambda: profile(m, ["0", "1"], _lin_step(m), optimizers=optimizers, repeats=1)) \
        if call == "profile" else \
        (lambda: auto_checkpoint(m, "1GiB", sample=torch.randn(2, 4), optimizers=optimizers, repeats=1))
    with pytest.raises(TypeError, match=f"stateremat.torch.profile: .*{words}"):
        run()
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert all(p.grad is None for p in m.parameters())  # refused before any step ran


def _self_sample(kind):
    x = torch.randn(2, 4)
    if kind == "list":
        s = [x]
        s.append(s)
    elif kind == "dict":
        s = {"input": x}
        s["again"] = s
    elif kind == "deep":
        s = [x]
        for _ in range(5000):
            s = [s]
    else:  # one list held twice at every level, 60 deep: 2**60 leaves to flatten
        s = [x]
        for _ in range(60):
            s = [s, s]
    return s


@pytest.mark.parametrize("kind, words", [("list", "contains itself"), ("dict", "contains itself"),
                                         ("deep", "nested more than 100 levels deep"),
                                         ("shared", "holds more than 1,000,000 leaves")])
@pytest.mark.parametrize("call", ["profile", "auto_checkpoint"])
def test_self_containing_or_deep_sample_is_refused(call, kind, words):
    """A sample batch that contains itself or nests 5,000 deep: a RecursionError from torch's
    pytree before; now stateremat's ValueError, before any step ran."""
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    sample = _self_sample(kind)
    run = (lambda: profile(m, ["0", "1"], sample)) if call == "profile" else \
        (lambda: auto_checkpoint(m, "1GiB", sample=sample))
    with pytest.raises(ValueError, match=f"stateremat.torch: the sample (is )?{words}"):
        run()
    assert all(p.grad is None for p in m.parameters())


class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0, self.l1 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, a, b):
        return self.l1(self.l0(a[0] + b[0]))


def test_a_shared_sample_is_checked_in_linear_time_and_its_depth_counts_from_every_place():
    import time

    from stateremat.torch import _step

    x = torch.randn(2, 4)
    s = [x]
    for _ in range(19):  # 2**19 leaves with repeats: within the limit, one walk per list
        s = [s, s]
    t0 = time.perf_counter()
    assert _step._check_sample(s, 0, []) == (19 + 1, 2**19)
    assert time.perf_counter() - t0 < 1.0  # walked with repeats it is 2**20 calls
    deep = [x]
    for _ in range(99):  # 100 levels: the limit
        deep = [deep]
    _step._check_sample(deep, 0, [])
    with pytest.raises(ValueError, match="nested more than 100 levels"):  # seen first shallow, then deeper
        _step._check_sample([deep, [deep]], 0, [])


def test_a_sample_holding_one_list_twice_is_not_taken_for_a_cycle():
    inner = [torch.randn(2, 4)]
    card = profile(_Two(), ["l0", "l1"], (inner, inner), repeats=1)
    assert [s.name for s in card.segments] == ["l0", "l1"]
