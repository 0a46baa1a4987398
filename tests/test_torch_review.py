"""Regression tests for silent wrong results a review found (R7, R8: recover exactly or raise).

Each reproducer ran to completion with a wrong gradient or a doubled state update before the
fix; ``torch.utils.checkpoint`` is run on the same program where it shows the divergence.
"""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch import nn

from stateremat.torch import ReplayError, StatefulCheckpoint, UndeclaredStateError, checkpoint
from stateremat.torch._txn import SMALL_STORAGE_BYTES

DTYPES = [torch.float32, torch.float64]


# ---- 1. preserve="whole" covers only the declared byte range (R2, R8) -----------------------
def _out_of_range_segment(base):
    def seg(w):
        y = (w * base[4:]).exp()
        base[4:].add_(1)
        return y
    return seg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_write_outside_the_declared_view_is_recovered_exactly(dtype, preserve):
    base = torch.ones(8, dtype=dtype)
    w = torch.ones(4, dtype=dtype, requires_grad=True)
    y = checkpoint(_out_of_range_segment(base), w, state=[base[:4]], preserve=preserve)
    y.sum().backward()
    assert torch.allclose(w.grad, torch.full((4,), math.e, dtype=dtype))  # d/dw exp(w * 1)
    assert torch.equal(base, torch.tensor([1, 1, 1, 1, 2, 2, 2, 2], dtype=dtype))  # written once

    # torch.utils.checkpoint replays on the mutated bytes: 2 e**2 instead of e.
    base = torch.ones(8, dtype=dtype)
    w = torch.ones(4, dtype=dtype, requires_grad=True)
    tuc.checkpoint(_out_of_range_segment(base), w, use_reentrant=False).sum().backward()
    assert torch.allclose(w.grad, torch.full((4,), 2 * math.exp(2), dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_input_alias_of_declared_storage_changed_before_backward(dtype):
    # The whole snapshot holds every byte of the storage, so an input outside the declared
    # view is restored too: exact gradient.
    base = torch.ones(8, dtype=dtype)
    w = torch.ones(4, dtype=dtype, requires_grad=True)
    y = checkpoint(lambda w, x: (w * x).exp(), w, base[4:], state=[base[:4]], preserve="whole")
    base.add_(1)
    y.sum().backward()
    assert torch.allclose(w.grad, torch.full((4,), math.e, dtype=dtype))
    assert torch.equal(base, torch.full((8,), 2, dtype=dtype))  # visible bytes reinstated

    # An unjournaled outside write under a region journal is refused (R8).
    n = SMALL_STORAGE_BYTES // base.element_size() + 8  # journaled, not kept whole
    base = torch.ones(n, dtype=dtype)
    y = checkpoint(lambda w, x: (w * x).exp(), w, base[4:8], state=[base[:4]], preserve="region")
    base.add_(1)
    with pytest.raises(ReplayError, match="written outside any checkpointed segment"):
        y.sum().backward()

    # A small storage is kept whole under region too: exact, as whole.
    w.grad = None
    base = torch.ones(8, dtype=dtype)
    y = checkpoint(lambda w, x: (w * x).exp(), w, base[4:], state=[base[:4]], preserve="region")
    base.add_(1)
    y.sum().backward()
    assert torch.allclose(w.grad, torch.full((4,), math.e, dtype=dtype))

    # Not declared at all: torch's saved-tensor version check still applies.
    base = torch.ones(8, dtype=dtype)
    y = checkpoint(lambda w, x: (w * x).exp(), w, base[4:])
    base.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# ---- 2. batch-norm's hidden running-stat writes on captured tensors (R7) --------------------
def _bn_fn(rm, rv):
    return lambda x: F.batch_norm(x, rm, rv, training=True, momentum=0.5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("other_state", [False, True])
def test_batch_norm_on_undeclared_captured_stats_is_refused_not_doubled(dtype, other_state):
    x = torch.randn(5, 3, dtype=dtype, generator=torch.Generator().manual_seed(0), requires_grad=True)
    ref_rm = torch.zeros(3, dtype=dtype)
    F.batch_norm(x, ref_rm, torch.ones(3, dtype=dtype), training=True, momentum=0.5)

    rm, rv = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    # Nothing declared, or something else declared with a whole snapshot (no forward mode).
    opts = {"state": [torch.zeros(2)], "preserve": "whole"} if other_state else {"state": None}
    # native_batch_norm bumps no version: the stats are compared byte for byte after the forward.
    with pytest.raises(UndeclaredStateError, match=r"captured variable 'r[mv]'.*after the forward.*state="):
        checkpoint(_bn_fn(rm, rv), x, **opts)
    assert torch.equal(rm, ref_rm)  # the forward's update, once

    rm, rv = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    tuc.checkpoint(_bn_fn(rm, rv), x, use_reentrant=False).pow(2).sum().backward()
    assert not torch.allclose(rm, ref_rm)  # torch updates twice


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_batch_norm_on_declared_captured_stats_updates_once(dtype, preserve):
    x = torch.randn(5, 3, dtype=dtype, generator=torch.Generator().manual_seed(0), requires_grad=True)
    ref_rm, ref_rv = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    F.batch_norm(x, ref_rm, ref_rv, training=True, momentum=0.5).pow(2).sum().backward()
    ref_grad, x.grad = x.grad, None
    rm, rv = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
    checkpoint(_bn_fn(rm, rv), x, state=[rm, rv], preserve=preserve).pow(2).sum().backward()
    assert torch.equal(rm, ref_rm) and torch.equal(rv, ref_rv)
    assert torch.allclose(x.grad, ref_grad)


# ---- 3. tensors the forward scan did not reach (R7) ------------------------------------------
class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.count = torch.zeros(1)  # plain attribute, not a registered buffer

    def forward(self, x):
        self.count += 1
        return x.sin()


def test_unregistered_module_tensor_attribute_is_named():
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(UndeclaredStateError, match=r"tensor attribute 'count' \(not a registered buffer\)"):
        checkpoint(_Counter(), x, state=None)
    m = _Counter()
    checkpoint(m, x, state=[m.count]).sum().backward()
    assert m.count.item() == 1.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_in_captured_list_and_plain_object(dtype):
    x = torch.ones(2, dtype=dtype, requires_grad=True)
    held = [torch.zeros(1, dtype=dtype)]
    with pytest.raises(UndeclaredStateError, match=r"captured variable 'held'\[0\]"):
        checkpoint(lambda t: held[0].add_(1) * t, x, state=None)

    class Box:
        pass

    box = Box()
    box.t = torch.zeros(1, dtype=dtype)
    with pytest.raises(UndeclaredStateError, match=r"captured variable 'box'\.t"):
        checkpoint(lambda t: box.t.add_(1) * t, x, state=None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_deeply_hidden_tensor_write_is_refused(dtype):
    x = torch.ones(2, dtype=dtype, requires_grad=True)
    deep = {"a": [{"b": torch.zeros(2, dtype=dtype)}]}  # three levels into a captured value
    with pytest.raises(UndeclaredStateError, match=r"captured variable 'deep'\['a'\]\[0\]\['b'\].*after the forward"):
        checkpoint(lambda t: (t * deep["a"][0]["b"].add_(1)).exp(), x, state=None)
    assert torch.equal(deep["a"][0]["b"], torch.ones(2, dtype=dtype))  # once

    # Deeper than the scan reaches: in strict mode refused at recomputation when every op is watched
    # (verify); under the default the watched forward saw the write and kept its activations
    # (no replay: written once, the gradient exact)
    deeper = {"a": [{"b": [[torch.zeros(2, dtype=dtype)]]}]}
    y = checkpoint(lambda t: (t * deeper["a"][0]["b"][0][0].add_(1)).exp(), x, state=None, verify=True)
    with pytest.raises(UndeclaredStateError, match=r"shape \(2,\).*at recomputation by aten\.add_.*cannot help"):
        y.sum().backward()
    assert torch.equal(deeper["a"][0]["b"][0][0], torch.ones(2, dtype=dtype))  # once
    x.grad = None
    y = checkpoint(lambda t: (t * deeper["a"][0]["b"][0][0].add_(1)).exp(), x, verify=True)
    y.sum().backward()
    assert torch.equal(deeper["a"][0]["b"][0][0], torch.full((2,), 2, dtype=dtype))  # once more
    assert torch.equal(x.grad, (x.detach() * 2).exp() * 2)

    deep = {"a": [{"b": torch.zeros(2, dtype=dtype)}]}
    tuc.checkpoint(lambda t: (t * deep["a"][0]["b"].add_(1)).exp(), x, use_reentrant=False).sum().backward()
    assert torch.equal(deep["a"][0]["b"], torch.full((2,), 2, dtype=dtype))  # torch: twice, silently


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensors_made_inside_the_replay_may_be_written(dtype):
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(inplace=True)).to(dtype)
    ref = StatefulCheckpoint(block, state="buffers", preserve="whole")

    def seg(t):
        c = torch.tensor([2.0], dtype=dtype)  # from Python data (aten.lift_fresh)
        c.mul_(t.sum())
        buf = torch.empty_like(t)
        with torch.no_grad():
            torch.mul(t, 3, out=buf)
        return ref(t * buf + c)

    x = torch.randn(6, 4, dtype=dtype, requires_grad=True)
    checkpoint(seg, x).sum().backward()
    assert x.grad is not None and int(block[1].num_batches_tracked) == 1


# ---- 4. torch.utils.checkpoint keywords are not forwarded to fn ------------------------------
def test_drop_in_keywords():
    calls = []

    @contextlib.contextmanager
    def ctx(tag):
        calls.append(tag)
        yield

    x = torch.ones(3, requires_grad=True)
    y = checkpoint(torch.sin, x, determinism_check="default", debug=False,
                   context_fn=lambda: (ctx("forward"), ctx("recompute")), use_reentrant=False)
    assert calls == ["forward"]
    y.sum().backward()
    assert calls == ["forward", "recompute"] and torch.allclose(x.grad, torch.cos(x.detach()))
    checkpoint(torch.sin, x, determinism_check="none").sum().backward()
    with pytest.raises(ValueError, match="determinism_check must be one of"):
        checkpoint(torch.sin, x, determinism_check="strict")


# ---- 6. option validation ----------------------------------------------------------------
def test_state_buffers_and_bool_granularity():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3)
    ref = nn.BatchNorm1d(3)
    x = torch.randn(4, 3, requires_grad=True)
    ref(x)
    checkpoint(bn, x, state="buffers").sum().backward()
    assert torch.equal(bn.running_mean, ref.running_mean) and int(bn.num_batches_tracked) == 1
    with pytest.raises(ValueError, match="state='buffers' needs fn to be an nn.Module"):
        checkpoint(torch.sin, x, state="buffers")
    with pytest.raises(ValueError, match="granularity_bytes must be a positive int"):
        checkpoint(torch.sin, x, granularity_bytes=True)
    with pytest.raises(TypeError, match=r"state= expects tensors.*Tip"):
        checkpoint(torch.sin, x, state={"a": 1})


@pytest.mark.parametrize("dtype", DTYPES)
def test_unannotated_alias_of_pre_existing_storage_is_not_taken_as_new(dtype):
    # aten._unsafe_view returns an alias its schema does not annotate (and with its own version
    # counter); writing through it still writes the pre-existing (deeply hidden) tensor and must
    # be refused at replay when every op is watched (verify=True).
    deep = {"a": [{"b": [[torch.zeros(2, 2, dtype=dtype)]]}]}
    x = torch.ones(4, dtype=dtype, requires_grad=True)

    def seg(t):
        flat = torch.ops.aten._unsafe_view(deep["a"][0]["b"][0][0], [4])
        flat.add_(1)
        return (t * flat).exp()

    y = checkpoint(seg, x, state=None, verify=True)  # strict mode: refused at the replay
    with pytest.raises(UndeclaredStateError, match="at recomputation by aten.add_"):
        y.sum().backward()
    assert torch.equal(deep["a"][0]["b"][0][0], torch.ones(2, 2, dtype=dtype))
    # the default: the watched forward saw a pre-existing storage written (the alias is no new
    # tensor) and kept its activations: no replay, written once
    checkpoint(seg, x, verify=True).sum().backward()
    assert torch.equal(deep["a"][0]["b"][0][0], torch.full((2, 2), 2, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_region_input_with_its_own_version_counter_is_witnessed(dtype):
    # Same storage as the declared tensor but a separate version counter (set_). As an input the
    # segment reaches, it is marked with the declared storage: an outside write through it is
    # journaled and the replay is exact (R6).
    base = torch.ones(8, dtype=dtype)
    other = torch.empty(0, dtype=dtype).set_(base.untyped_storage(), 4, (4,), (1,))
    w = torch.ones(4, dtype=dtype, requires_grad=True)
    y = checkpoint(lambda w, x: (w * x).exp(), w, other, state=[base[:4]], preserve="region")
    other.add_(1)
    y.sum().backward()
    assert torch.allclose(w.grad, torch.full((4,), math.e, dtype=dtype))
    assert torch.equal(base, torch.tensor([1, 1, 1, 1, 2, 2, 2, 2], dtype=dtype))

