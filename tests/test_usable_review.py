"""A user review's findings (profile/auto_checkpoint/apply_plan/integrations/CLI), each as a kind."""
import re

import pytest
import torch
from torch import nn

from stateremat.planner import plan
from stateremat.torch import apply_plan, auto_checkpoint, expected_peak_bytes, profile


def _bn_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), *[nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32), nn.Dropout(0.3),
                                                           nn.Tanh()) for _ in range(3)], nn.Linear(32, 2))


def _eq3(card, options):
    """P + Σ r + max q on the card's measured costs (preservation included)."""
    costs = [s.options[o] for s, o in zip(card.segments, options)]
    return card.persistent_bytes + sum(c.retained_bytes for c in costs) + max(c.temp_bytes for c in costs)


def test_auto_checkpoint_refuses_a_plan_over_budget_that_the_planners_own_model_admitted():
    x = torch.randn(64, 8)
    model = _bn_mlp()
    card = profile(model, None, x, options=["eager", "whole", "region", "recompute_only"], repeats=1)
    # a budget the state-agnostic planner believes (preservation omitted) but its policy does not fit
    least = plan(card, plan(card, 0, planner="state_agnostic").min_feasible_peak_bytes, planner="state_agnostic")
    assert least.model_peak_bytes < least.predicted_peak_bytes  # preservation costs bytes here
    budget = (least.model_peak_bytes + least.predicted_peak_bytes) // 2
    r = plan(card, budget, planner="state_agnostic")
    assert r.feasible and not r.fits_budget  # the planner's own model admits it: the check below can fail
    with pytest.raises(ValueError, match="exceeds the budget") as info:
        auto_checkpoint(model, budget, sample=x, planner="state_agnostic", peak="eq3", repeats=1)
    res = info.value.plan
    assert res.feasible and not res.fits_budget and res.options is not None
    true_peak = _eq3(res.card, res.options)
    assert true_peak == res.predicted_peak_bytes > budget
    msg = str(info.value)
    assert f"({true_peak} B" in msg and f"({expected_peak_bytes(res.card, res.options)} B" in msg
    assert f"({res.model_peak_bytes} B" not in msg  # never the planner's internal (preservation-free) peak
    assert all("forward" not in vars(m) for m in model.modules())  # nothing applied
    # the reviewer's case
    with pytest.raises(ValueError, match="exceeds the budget"):
        auto_checkpoint(_bn_mlp(), 99000, sample=x, planner="state_agnostic", peak="eq3", repeats=1)


class _Counter(nn.Module):
    """Writes a plain tensor attribute (not a buffer, so not declared by state='buffers')."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.t = torch.zeros(32)

    def forward(self, x):
        self.t.add_(1)
        return self.lin(x)


def test_an_error_inside_a_segment_while_profiling_propagates_unmasked():
    from stateremat import UndeclaredStateError

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), _Counter(), _Counter(), _Counter())
    with pytest.raises(UndeclaredStateError, match="tensor attribute '1.t'|'t'") as info:
        profile(model, None, torch.randn(4, 8), repeats=1, state="buffers")  # strict: t is no buffer
    assert "did not run" not in str(info.value)
    with pytest.raises(UndeclaredStateError):
        auto_checkpoint(model, "1GiB", sample=torch.randn(4, 8), repeats=1, state="buffers")
    assert all("forward" not in vars(m) for m in model.modules())

    class Boom(Exception):
        pass

    calls = []

    def step(m):  # raises inside the third step (the first step the profiler probes), mid-forward
        calls.append(1)
        h = m[1](m[0](torch.randn(4, 8)))
        if len(calls) == 3:
            raise Boom("user bug after segment 1")
        m[3](m[2](h)).sum().backward()

    model = nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32))
    with pytest.raises(Boom, match="user bug after segment 1"):
        profile(model, ["1", "2", "3"], step, repeats=1)
    assert len(calls) == 3


def test_one_module_object_at_two_segment_paths_is_refused_naming_both():
    torch.manual_seed(0)
    shared = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    model = nn.Sequential(shared, nn.Tanh(), shared, nn.Linear(8, 2))
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"apply_plan: segments '0' and '2' are the same module object"):
        apply_plan(model, {"segment_names": ["0", "2"], "options": ["eager", "whole"]})
    assert "forward" not in vars(shared)  # refused before anything was wrapped
    with pytest.raises(ValueError, match=r"segments '0' and '2' are the same module object"):
        profile(model, ["0", "2"], x, repeats=1)
    with pytest.raises(ValueError, match=r"segments '0' and '2' are the same module object"):
        profile(model, "?", x, repeats=1)  # a pattern that selects both paths
    with pytest.raises(ValueError, match=r"segment names must be unique, got \['0'\]"):
        apply_plan(model, {"segment_names": ["0", "0"], "options": ["whole", "eager"]})
    # a segment reached again inside another segment through a second path
    outer = nn.Sequential(nn.Linear(8, 8), shared)
    model = nn.Sequential(outer, shared, nn.Linear(8, 2))
    with pytest.raises(ValueError, match=r"segment '1' is also inside segment '0' \(as '0.1'"):
        profile(model, ["0", "1"], x, repeats=1)
    # one path of a shared module is fine for apply_plan: every call is that segment
    model = nn.Sequential(shared, nn.Tanh(), shared, nn.Linear(8, 2))
    apply_plan(model, {"segment_names": ["0"], "options": ["whole"]})
    model(x).sum().backward()


class _Reversed(nn.Module):
    """Blocks registered in one order and called in the reverse one; widths differ per block."""

    def __init__(self):
        super().__init__()
        widths = [24, 192, 96, 48, 12]  # in forward order
        run = [nn.Sequential(nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU(), nn.Dropout(0.1))
               for a, b in zip(widths, widths[1:])]
        self.blocks = nn.ModuleList(run[::-1])  # registration order: the last block first
        self.stem = nn.Linear(8, widths[0])
        self.head = nn.Linear(widths[-1], 3)

    def forward(self, x, y):
        h = self.stem(x)
        for blk in reversed(self.blocks):
            h = blk(h)
        return nn.functional.cross_entropy(self.head(h), y)


def _peak_of_step(model, step, opt):
    from stateremat.torch import PeakMemory

    step(model)
    state = (t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    grads = (p.grad for p in model.parameters() if p.grad is not None)
    with PeakMemory("cpu", roots=[*model.parameters(), *grads, *model.buffers(), *state]) as pm:
        step(model)
    return pm.peak_bytes


@pytest.mark.parametrize("between", [0.0, 0.5])
def test_card_orders_segments_as_the_forward_runs_them_and_predicts_the_measured_peak(between):
    from stateremat.planner import all_eager

    torch.manual_seed(0)
    model = _Reversed().double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (256,), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(m):
        opt.zero_grad(set_to_none=True)
        m(x, y).backward()
        opt.step()

    card = profile(model, "blocks.*", step, repeats=1, optimizers=[opt])
    assert card.segment_names == ["blocks.3", "blocks.2", "blocks.1", "blocks.0"]  # as the forward runs them
    lo, hi = plan(card, 0).min_feasible_peak_bytes, all_eager(card, 1).predicted_peak_bytes
    res = plan(card, int(lo + between * (hi - lo)), planner="joint")
    assert res.feasible and set(res.options) != {"eager"}
    apply_plan(model, res)
    measured = _peak_of_step(model, step, opt)
    expected = expected_peak_bytes(card, res.options)
    assert abs(measured - expected) <= 0.05 * expected, (measured, expected, res.options)
    assert measured <= 1.05 * res.budget_bytes


def test_profile_refuses_segments_whose_order_changes_between_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8))
    calls = []

    def step(m):
        calls.append(1)
        h = torch.randn(4, 8)
        for i in ([1, 2] if len(calls) % 2 else [2, 1]):
            h = m[i](h)
        h.sum().backward()

    with pytest.raises(ValueError, match="segment '1' started before segment '2'.*cannot be known"):
        profile(model, ["1", "2"], step, repeats=1)


def test_apply_plan_and_profile_refuse_bad_segment_options_before_wrapping_anything():
    model = _bn_mlp()
    plan_ = {"segment_names": ["1", "2"], "options": ["whole", "region"]}
    for bad, error in [({"state": "everything"}, ValueError), ({"state": ["not a tensor"]}, TypeError),
                       ({"granularity_bytes": 0}, ValueError), ({"on_undeclared": "ignore"}, ValueError)]:
        with pytest.raises(error, match="state must be|state=|granularity_bytes must be|on_undeclared must be"):
            apply_plan(model, plan_, **bad)
        assert all("forward" not in vars(m) for m in model.modules())  # refused at apply time, nothing wrapped
    calls = []
    with pytest.raises(ValueError, match="state must be 'auto', 'buffers'"):
        profile(model, None, lambda m: calls.append(1), state="everything", repeats=1)
    assert calls == []  # refused before any step ran
    apply_plan(model, plan_, state="buffers", granularity_bytes=64)
    model(torch.randn(8, 8)).sum().backward()


@pytest.mark.parametrize("verify", [False, True])
def test_an_in_place_write_to_a_tracked_segment_input_gets_the_out_of_place_tip(verify):
    from stateremat import UndeclaredStateError

    def model(inplace):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(inplace=inplace), nn.Linear(8, 8)),
                             nn.Linear(8, 2))

    x = torch.randn(4, 8)
    m = apply_plan(model(True), {"segment_names": ["1"], "options": ["region"]}, verify=verify)
    with pytest.raises(UndeclaredStateError, match=r"argument 0 is an input of the segment.*"
                                                    r"out-of-place, e.g. nn.ReLU\(inplace=False\)") as info:
        m(x).sum().backward()
    assert "or pass on_undeclared='declare'" not in str(info.value)
    # the tip is right: declaring does not help, the out-of-place op does
    m = apply_plan(model(True), {"segment_names": ["1"], "options": ["region"]}, on_undeclared="declare")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        m(x).sum().backward()
    ref = model(False)
    ref(x).sum().backward()
    m = apply_plan(model(False), {"segment_names": ["1"], "options": ["region"]}, verify=verify)
    m(x).sum().backward()
    assert torch.equal(m[0].weight.grad, ref[0].weight.grad)


def test_an_in_place_write_to_an_untracked_input_gets_the_out_of_place_tip_and_state_the_declare_tip():
    from stateremat import UndeclaredStateError
    from stateremat.torch import checkpoint

    lin = nn.Linear(8, 8)

    def fn(x):
        x.mul_(0.5)  # the raw batch, which autograd does not track
        return lin(x)

    with pytest.raises(UndeclaredStateError, match=r"argument 0 is an input of the segment.*out-of-place") as info:
        checkpoint(fn, torch.randn(4, 8)).sum().backward()
    assert "or pass on_undeclared='declare'" not in str(info.value)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # the tip is right
        checkpoint(fn, torch.randn(4, 8), on_undeclared="declare").sum().backward()
    # module state (not an input) keeps the declare tip, and declaring works there
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), _Counter())
    m = apply_plan(model, {"segment_names": ["1"], "options": ["region"]}, state="buffers")  # strict
    with pytest.raises(UndeclaredStateError, match="or pass on_undeclared='declare'") as info:
        m(torch.randn(4, 8)).sum().backward()
    assert "out-of-place" not in str(info.value)
    apply_plan(model, {"segment_names": ["1"], "options": ["region"]}, state="buffers", on_undeclared="declare")
    t0 = model[1].t.clone()
    model(torch.randn(4, 8)).sum().backward()
    assert torch.equal(model[1].t, t0 + 1)  # written once per step, as in eager
