"""Non-reentrant semantics with state: shared buffers, backward order, retain_graph, nesting,
kwargs, version gaps (R6, R8), undeclared writes (R7), verify (R4), apply_plan."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

from _journal import JournalSpy, journal_every_storage
from stateremat.torch import (
    ReplayDivergenceError,
    ReplayError,
    StatefulCheckpoint,
    UndeclaredStateError,
    UndeclaredStateWarning,
    apply_plan,
    checkpoint,
    preservation_stats,
    reset_preservation_stats,
)


def _segments(queue):
    """Two segments sharing ``queue``: each reads it, then writes a different region."""
    def seg1(x):
        y = (x @ queue.clone().T).sin().sum()
        queue[0:2] += 1.0
        return y

    def seg2(x):
        y = (x @ queue.clone().T).pow(2).sum()
        queue[2:4] *= 2.0
        return y

    return seg1, seg2


def _shared_run(method, order, preserve="region"):
    torch.manual_seed(0)
    queue = torch.randn(6, 3, dtype=torch.float64)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    seg1, seg2 = _segments(queue)
    if method == "eager":
        y1, y2 = seg1(x), seg2(x)
    elif method == "torch":
        y1, y2 = tuc.checkpoint(seg1, x, use_reentrant=False), tuc.checkpoint(seg2, x, use_reentrant=False)
    else:
        p1, p2 = {"region_then_whole": ("region", "whole"),
                  "whole_then_region": ("whole", "region")}.get(preserve, (preserve, preserve))
        y1 = checkpoint(seg1, x, state=[queue], preserve=p1)
        y2 = checkpoint(seg2, x, state=[queue], preserve=p2)
    for y in ((y1, y2) if order == "forward" else (y2, y1)):
        y.backward()
    return x.grad, queue


@pytest.mark.parametrize("journaled", [False, True])
@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("preserve", ["region", "whole", "region_then_whole", "whole_then_region"])
def test_segments_sharing_one_buffer_backward_in_any_order(order, preserve, journaled):
    """``journaled``: the whole-snapshot threshold lowered to 0, so region journals the (tiny)
    queue instead of keeping it whole, and the journal is asserted built."""
    g_ref, q_ref = _shared_run("eager", order)
    reset_preservation_stats()
    with journal_every_storage() if journaled else contextlib.nullcontext(), JournalSpy() as spy:
        g, q = _shared_run("ours", order, preserve)
    assert preservation_stats().recompute_count == 2
    if journaled and preserve != "whole":
        assert spy.journals > 0 and spy.entries > 0
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(q, q_ref)
    g_t, q_t = _shared_run("torch", order)
    assert not torch.allclose(g_t, g_ref)  # seg1's replay reads seg2's write (and its own)


def test_retain_graph_repeated_backward_replays_each_time():
    bn_ref = nn.BatchNorm1d(4).double()
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    out_ref = bn_ref(x).pow(3).sum()
    g_ref, = torch.autograd.grad(out_ref, x)

    bn = StatefulCheckpoint(nn.BatchNorm1d(4).double())
    x2 = x.detach().clone().requires_grad_(True)
    out = bn(x2).pow(3).sum()
    out.backward(retain_graph=True)
    out.backward(retain_graph=True)
    out.backward()
    assert bn.recompute_count == 3  # exactly once per backward
    torch.testing.assert_close(x2.grad, 3 * g_ref)
    torch.testing.assert_close(bn.block.running_mean, bn_ref.running_mean)
    assert int(bn.block.num_batches_tracked) == 1


def test_nested_checkpoints_with_state_only_in_the_inner_one():
    torch.manual_seed(0)
    lin, bn = nn.Linear(4, 4).double(), nn.BatchNorm1d(4).double()
    ref_lin, ref_bn = nn.Linear(4, 4).double(), nn.BatchNorm1d(4).double()
    ref_lin.load_state_dict(lin.state_dict())
    x = torch.randn(8, 4, dtype=torch.float64)

    ref_out = ref_bn(ref_lin(x).tanh()).sin().sum()
    ref_out.backward()

    def outer(x):
        h = lin(x).tanh()
        return checkpoint(bn, h, state=[bn]).sin().sum()

    reset_preservation_stats()
    checkpoint(outer, x).backward()
    torch.testing.assert_close(lin.weight.grad, ref_lin.weight.grad)
    torch.testing.assert_close(bn.running_var, ref_bn.running_var)
    assert int(bn.num_batches_tracked) == 1
    assert preservation_stats().recompute_count == 2  # outer once, inner once


def test_kwargs_and_non_tensor_arguments():
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, dtype=torch.float64, requires_grad=True)

    def fn(x, scale, *, bias, square=False):
        y = x * scale + bias
        return (y.square() if square else y).sin().sum()

    ref = fn(x, 2.0, bias=bias, square=True)
    gx_ref, gb_ref = torch.autograd.grad(ref, (x, bias))
    out = checkpoint(fn, x, 2.0, bias=bias, square=True)
    gx, gb = torch.autograd.grad(out, (x, bias))
    torch.testing.assert_close(gx, gx_ref)
    torch.testing.assert_close(gb, gb_ref)


def test_no_grad_runs_plainly():
    buf = torch.zeros(3)
    live = preservation_stats().live_segments  # other tests' graphs may still be alive
    with torch.no_grad():
        checkpoint(lambda t: buf.add_(t), torch.ones(3), state=[buf])
    assert torch.equal(buf, torch.ones(3)) and preservation_stats().live_segments == live


# ---- R8: a declared tensor changed outside any checkpointed segment ------------------------
def _outside_write(preserve):
    queue = torch.arange(6.0, dtype=torch.float64).reshape(3, 2)
    x = torch.randn(2, dtype=torch.float64, requires_grad=True)

    def seg(x):
        y = (queue.clone() @ x).exp().sum()
        queue[0].mul_(3.0)
        return y

    y = checkpoint(seg, x, state=[queue], preserve=preserve)
    queue[1].add_(5.0)  # outside any checkpointed segment, between forward and replay
    return x, y, queue


def test_write_through_an_unmarked_alias_is_refused_by_a_region_journal():
    # A view taken before the journal existed is not marked: the write bypasses the journal but
    # bumps the shared version counter, so the replay is refused instead of wrong (R8).
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    queue = torch.arange(2048.0, dtype=torch.float64).reshape(1024, 2)  # 16 KiB + 1 row: journaled
    queue = torch.cat([queue, queue[:1]])
    row = queue[1]  # aliased before the segment declared the queue
    y = checkpoint(lambda t: (queue.clone() @ t).exp().sum(), x, state=[queue], preserve="region")
    row.add_(5.0)
    with pytest.raises(ReplayError, match=r"through an alias the region journal does not see.*preserve='whole'"):
        y.backward()


@pytest.mark.parametrize("journaled", [False, True])
@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_outside_write_is_recovered(preserve, journaled):
    # region: the declared tensor is marked while its journal lives, so the later outside
    # write is journaled (R6); whole: the snapshot holds B0 whatever happens later.
    # journaled: the whole-snapshot threshold lowered to 0 (the queue is tiny), journal asserted built
    with journal_every_storage() if journaled else contextlib.nullcontext(), JournalSpy() as spy:
        x, y, queue = _outside_write(preserve)
        y.backward()
    if journaled and preserve == "region":
        assert spy.entries >= 2  # the segment's own write and the outside one
    q0 = torch.arange(6.0, dtype=torch.float64).reshape(3, 2)
    torch.testing.assert_close(x.grad, ((q0 @ x).exp()[:, None] * q0).sum(0).detach())
    expected = q0.clone()
    expected[0] *= 3.0
    expected[1] += 5.0
    torch.testing.assert_close(queue, expected)  # the visible state is reinstated (R5)


# ---- R7: undeclared state ----------------------------------------------------------------
class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("hits", torch.zeros(3))

    def forward(self, x):
        self.hits.add_(x.detach().mean(0))
        return self.lin(x).tanh()


def test_undeclared_buffer_write_raises_naming_it():
    m = Counter()
    with pytest.raises(UndeclaredStateError, match=r"buffer 'hits'.*Tip: leave state= at its default.*or declare it"):
        checkpoint(m, torch.randn(4, 3, requires_grad=True), state=None)


def test_undeclared_write_is_refused_after_the_forward_made_it_once():
    # No dispatch mode watches ops that touch no declared state: the write is seen by its version
    # counter when the forward ends (made once, as eager would), and refused before any replay.
    from stateremat.torch._runtime import runtime
    from stateremat.torch._storage import storage_key

    m, queue = Counter(), torch.zeros(5)
    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(UndeclaredStateError, match=r"buffer 'hits'.*after the forward"):
        checkpoint(m, x, state=[queue])
    assert torch.equal(m.hits, x.detach().mean(0))  # written exactly once
    assert storage_key(queue) not in runtime().storages  # the refused segment holds nothing


def test_undeclared_warn_and_declare():
    x = torch.randn(4, 3, requires_grad=True)
    m = Counter()
    with pytest.warns(UndeclaredStateWarning, match="hits"):
        checkpoint(m, x, on_undeclared="warn").sum().backward()

    m1, m2 = Counter(), Counter()
    m2.load_state_dict(m1.state_dict())
    m1(x).sum().backward()
    checkpoint(m2, x, on_undeclared="declare").sum().backward()  # promoted to a whole snapshot
    torch.testing.assert_close(m2.hits, m1.hits)
    torch.testing.assert_close(m2.lin.weight.grad, m1.lin.weight.grad)


def test_undeclared_input_and_captured_tensor_writes():
    a = torch.randn(3)
    with pytest.raises(UndeclaredStateError, match="argument 0"):
        checkpoint(lambda t, w: t.mul_(2) * w, a, torch.ones(3, requires_grad=True))
    cap = torch.zeros(3)
    with pytest.raises(UndeclaredStateError, match="captured variable 'cap'"):
        checkpoint(lambda w: cap.add_(1) * w, torch.ones(3, requires_grad=True), state=None)


def test_tensors_created_inside_the_segment_may_be_mutated():
    def fn(x):
        h = x * 2
        h.add_(1)
        t = torch.zeros(3)
        t.fill_(2)
        return (h * t).sum()

    x = torch.randn(3, requires_grad=True)
    checkpoint(fn, x).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 4.0))


# ---- R4: verify ---------------------------------------------------------------------------
def test_verify_passes_on_a_faithful_replay_and_catches_divergence():
    x = torch.randn(5, requires_grad=True)
    checkpoint(lambda t: (t * torch.rand(5)).sin().sum(), x, verify=True).backward()
    with pytest.raises(ReplayDivergenceError, match=r"saved tensor #\d+ .*max \|difference\|"):
        checkpoint(lambda t: (t * torch.rand(5)).sin().sum(), x, verify=True,
                   preserve_rng_state=False).backward()


def test_bad_options_are_clear():
    with pytest.raises(ValueError, match="preserve must be one of"):
        checkpoint(torch.sin, torch.ones(1), preserve="bogus")
    with pytest.raises(ValueError, match="on_undeclared must be one of"):
        checkpoint(torch.sin, torch.ones(1), on_undeclared="ignore")
    with pytest.raises(TypeError, match="state= expects tensors"):
        checkpoint(torch.sin, torch.ones(1, requires_grad=True), state=[3])


# ---- apply_plan ----------------------------------------------------------------------------
def _model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU()) for _ in range(3)])


def test_apply_plan_wraps_named_segments_and_stays_exact():
    ref, model = _model(), _model()
    names = [n for n, _ in model.named_parameters()]
    keys = list(model.state_dict())
    plan = {"options": ["eager", "whole", "region"], "segment_names": ["0", "1", "2"]}
    assert apply_plan(model, plan) is model
    assert [n for n, _ in model.named_parameters()] == names  # wrapped in place: no .block infix
    assert list(model.state_dict()) == keys
    assert "forward" not in vars(model[0])
    assert (model[1].forward.option, model[2].forward.option) == ("whole", "region")
    x = torch.randn(8, 4)
    ref(x).sum().backward()
    model(x).sum().backward()
    torch.testing.assert_close(model[2][0].weight.grad, ref[2][0].weight.grad)
    torch.testing.assert_close(model[1][1].running_mean, ref[1][1].running_mean)

    class Plan:
        options, segment_names = ["eager"], ["1"]

    assert "forward" not in vars(apply_plan(model, Plan())[1])  # re-planned to eager: unwrapped


def test_apply_plan_errors():
    with pytest.raises(ValueError, match="segment 'nope' is not a submodule"):
        apply_plan(_model(), {"options": ["whole"], "segment_names": ["nope"]})
    with pytest.raises(ValueError, match="2 options but 1 segment names"):
        apply_plan(_model(), {"options": ["whole", "eager"], "segment_names": ["0"]})
    with pytest.raises(ValueError, match="options must be in"):
        apply_plan(_model(), {"options": ["functional"], "segment_names": ["0"]})


def test_batchnorm_called_again_outside_checkpoint_is_recovered():
    # native_batch_norm writes running stats without bumping their version counters; the marked
    # running stats route the eager call's writes to the journal anyway (R6).
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    for preserve in ("region", "whole"):
        bn = nn.BatchNorm1d(4).double()
        ref = nn.BatchNorm1d(4).double()
        y = checkpoint(bn, x, state=[bn], preserve=preserve).pow(3).sum()
        ref_y = ref(x).pow(3).sum()
        with torch.no_grad():
            bn(x * 2)  # eager use between forward and backward
            ref(x * 2)
        g_ref, = torch.autograd.grad(ref_y, x)
        g, = torch.autograd.grad(y, x)
        torch.testing.assert_close(g, g_ref)
        torch.testing.assert_close(bn.running_mean, ref.running_mean)


def test_wrapper_keeps_state_dict_keys_and_attribute_access():
    inner = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    keys = list(inner.state_dict())
    model = nn.Sequential(StatefulCheckpoint(inner), nn.Linear(2, 1))
    assert [k for k in model.state_dict() if k.startswith("0.")] == [f"0.{k}" for k in keys]
    model.load_state_dict(model.state_dict())
    assert model[0][1] is inner[1] and model.get_submodule("0.1") is inner[1]


def test_stats_track_peak_and_reset(fresh_runtime):
    queue = torch.zeros(1024)  # 4 KiB
    x = torch.randn(3, requires_grad=True)
    reset_preservation_stats()
    y = checkpoint(lambda t: (queue.add_(1)[:3] * t).sum(), x, state=[queue], preserve="whole")
    s = preservation_stats()
    assert (s.snapshot_bytes, s.journal_bytes, s.live_segments) == (4096, 0, 1)
    y.backward()
    del y
    s = preservation_stats()
    assert (s.retained_state_bytes, s.peak_retained_state_bytes, s.recompute_count) == (0, 4096, 1)
    # the visible bytes held while replaying + the copy of mul's saved alias queue[:3]
    assert s.peak_temporary_bytes == 4096 + 3 * 4
    reset_preservation_stats()
    assert preservation_stats().peak_retained_state_bytes == 0
    from stateremat.torch._runtime import runtime
    from stateremat.torch._storage import storage_key

    assert storage_key(queue) not in runtime().storages  # nothing kept once no segment can replay


def test_saved_aliases_of_read_only_region_state_are_not_copied():
    queue = torch.randn(512, 16)  # 32 KiB (journaled under region), read but never written
    x = torch.randn(4, 16, requires_grad=True)
    for preserve, temporary in [("region", 0), ("whole", 2 * 32768)]:
        x.grad = None
        reset_preservation_stats()
        checkpoint(lambda t: (t @ queue.T).sum(), x, state=[queue], preserve=preserve).backward()
        # region: matmul's saved queue aliases bytes that nothing changes, so no copy is made;
        # whole: the visible bytes are set aside and the alias is copied.
        assert preservation_stats().peak_temporary_bytes == temporary
        torch.testing.assert_close(x.grad, queue.sum(0).expand(4, 16))


def test_journal_writes_covers_a_later_eager_writer():
    # A region segment reads the queue; an *unwrapped* (eager) enqueue follows. The eager write
    # is journaled (the declared queue is marked), so the replay reconstructs B0 (R6) — with or
    # without the journal_writes() context kept for older code.
    from stateremat.torch import journal_writes

    def run(wrap):
        queue = torch.arange(8.0, dtype=torch.float64).reshape(4, 2)
        x = torch.ones(2, dtype=torch.float64, requires_grad=True)
        with wrap():
            y = checkpoint(lambda t: (queue.clone() @ t).exp().sum(), x, state=[queue])
            queue[1:3] = 0.0  # eager enqueue, outside any checkpointed segment
        return x, y, queue

    x, y, queue = run(journal_writes)
    y.backward()
    q0 = torch.arange(8.0, dtype=torch.float64).reshape(4, 2)
    torch.testing.assert_close(x.grad, ((q0 @ torch.ones(2, dtype=torch.float64)).exp()[:, None] * q0).sum(0))
    assert torch.equal(queue[1:3], torch.zeros(2, 2))
    import contextlib

    x, y, queue = run(contextlib.nullcontext)
    y.backward()
    torch.testing.assert_close(x.grad, ((q0 @ torch.ones(2, dtype=torch.float64)).exp()[:, None] * q0).sum(0))


def test_inner_declaration_is_not_an_undeclared_write_of_a_journaling_outer_segment():
    torch.manual_seed(0)
    bn, ref_bn = nn.BatchNorm1d(4).double(), nn.BatchNorm1d(4).double()
    queue = torch.zeros(4, dtype=torch.float64)  # the outer segment's own region state
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)

    def outer(x):
        queue.add_(1.0)
        return checkpoint(bn, x * 2, state=[bn]).sin().sum()  # bn reachable from outer too

    ref = ref_bn(x * 2).sin().sum()
    g_ref, = torch.autograd.grad(ref, x)
    g, = torch.autograd.grad(checkpoint(outer, x, state=[queue]), x)
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(bn.running_mean, ref_bn.running_mean)
    assert torch.equal(queue, torch.ones(4, dtype=torch.float64))


def test_drop_in_use_reentrant_argument():
    x = torch.randn(3, requires_grad=True)
    checkpoint(torch.sin, x, use_reentrant=False).sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos())
    with pytest.raises(ValueError, match="use_reentrant must be False"):
        checkpoint(torch.sin, x, use_reentrant=True)


def test_public_surface():
    import stateremat.contract as contract
    import stateremat.torch as st

    names = {"checkpoint", "StatefulCheckpoint", "apply_plan", "journal_writes", "preservation_stats",
             "reset_preservation_stats", "PreservationStats", "ReplayError", "UndeclaredStateError",
             "ReplayDivergenceError", "UnsupportedError", "UndeclaredStateWarning"}
    assert names <= set(dir(st))
    import torch.utils.checkpoint as tuc

    assert issubclass(st.ReplayError, contract.ReplayError) and issubclass(st.ReplayError, tuc.CheckpointError)
    assert issubclass(st.UndeclaredStateError, contract.UndeclaredStateError) and issubclass(st.UndeclaredStateError, st.ReplayError)


def test_replay_runs_under_the_forward_autocast_state():
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = lin(x).float().square().sum()
    g_ref = torch.autograd.grad(ref, (x, lin.weight))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = checkpoint(lin, x).float().square().sum()
    g = torch.autograd.grad(out, (x, lin.weight))  # backward outside autocast: replay re-enters it
    for a, b in zip(g, g_ref):
        assert torch.equal(a, b)
