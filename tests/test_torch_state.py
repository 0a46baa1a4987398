"""Transactional checkpoint on real stateful modules: BatchNorm, a MoCo-style queue, dropout.

Each test compares against the unchecked model (or a functional reference) and shows what
``torch.utils.checkpoint`` does on the same program (R2–R5).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch import nn

from stateremat.torch import StatefulCheckpoint, checkpoint, preservation_stats, reset_preservation_stats

DTYPES = [torch.float32, torch.float64]


def _bn_block(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 8),
                         nn.BatchNorm1d(8)).to(dtype).train()


def _step(model, x):
    out = model(x)
    out.square().mean().backward()
    return out.detach()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_batchnorm_running_stats_updated_exactly_once(dtype, preserve):
    ref = _bn_block(dtype)
    x = torch.randn(32, 8, dtype=dtype, generator=torch.Generator().manual_seed(1))
    _step(ref, x)

    ours = StatefulCheckpoint(_bn_block(dtype), state="buffers", preserve=preserve)
    _step(ours, x)
    assert ours.recompute_count == 1
    for (name, b_ref), (_, b) in zip(ref.named_buffers(), ours.block.named_buffers()):
        torch.testing.assert_close(b, b_ref, msg=name)
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), ours.block.named_parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, msg=name)

    # torch.utils.checkpoint replays BatchNorm in train mode: statistics updated twice.
    theirs = _bn_block(dtype)
    out = tuc.checkpoint(theirs, x, use_reentrant=False)
    out.square().mean().backward()
    assert int(theirs[1].num_batches_tracked) == 2 != int(ref[1].num_batches_tracked)
    assert not torch.allclose(theirs[1].running_mean, ref[1].running_mean)


def test_batchnorm_undeclared_is_refused_with_a_tip():
    block = _bn_block(torch.float32)
    x = torch.randn(16, 8)
    with pytest.raises(Exception, match=r"num_batches_tracked.*state="):
        StatefulCheckpoint(block, state=None)(x)


# ---- MoCo-style queue: logits against the queue, then enqueue inside the segment ------------
class MoCoHead(nn.Module):
    def __init__(self, dim=8, K=32, T=0.2, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.encoder = nn.Linear(dim, dim).to(dtype)
        self.register_buffer("queue", F.normalize(torch.randn(K, dim, generator=g, dtype=dtype), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.K, self.T = K, T

    def forward(self, x, k):
        q = F.normalize(self.encoder(x), dim=1)
        l_pos = (q * k).sum(1, keepdim=True)
        l_neg = q @ self.queue.clone().T  # clone: the eager model must be valid autograd too
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        loss = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long))
        p = int(self.ptr)
        self.queue[p : p + len(k)] = k  # enqueue (in place)
        self.ptr.fill_((p + len(k)) % self.K)
        return loss


def _moco_functional(head, x, k, queue, ptr):
    q = F.normalize(F.linear(x, head.encoder.weight, head.encoder.bias), dim=1)
    logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / head.T
    loss = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long))
    new_queue = torch.cat([queue[:ptr], k, queue[ptr + len(k):]])
    return loss, new_queue


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_moco_queue_gradients_and_final_queue(dtype, preserve):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 8, generator=g, dtype=dtype)
    k = F.normalize(torch.randn(4, 8, generator=g, dtype=dtype), dim=1)

    ref = MoCoHead(dtype=dtype)
    ref.ptr.fill_(8)
    queue0 = ref.queue.clone()
    loss_ref, queue_ref = _moco_functional(ref, x, k, queue0, 8)
    grads_ref = torch.autograd.grad(loss_ref, list(ref.encoder.parameters()))

    eager = copy.deepcopy(ref)
    eager(x, k).backward()
    for p, gr in zip(eager.encoder.parameters(), grads_ref):
        torch.testing.assert_close(p.grad, gr)
    torch.testing.assert_close(eager.queue, queue_ref)

    ours = StatefulCheckpoint(copy.deepcopy(ref), state="buffers", preserve=preserve)
    loss = ours(x, k)
    loss.backward()
    torch.testing.assert_close(loss.detach(), loss_ref.detach())
    for p, gr in zip(ours.block.encoder.parameters(), grads_ref):
        torch.testing.assert_close(p.grad, gr)
    torch.testing.assert_close(ours.block.queue, queue_ref)
    assert int(ours.block.ptr) == 12 and ours.recompute_count == 1

    theirs = copy.deepcopy(ref)
    tuc.checkpoint(theirs, x, k, use_reentrant=False).backward()
    # The replay sees the enqueued queue and the advanced pointer: the logits differ.
    assert not all(torch.allclose(p.grad, gr) for p, gr in zip(theirs.encoder.parameters(), grads_ref))


def test_region_journal_retains_only_written_chunks(fresh_runtime):
    head = MoCoHead(dim=256, K=1024)  # 1 MiB queue, 4 rows of 1 KiB written per step
    x, k = torch.randn(4, 256), F.normalize(torch.randn(4, 256), dim=1)
    for preserve, expect in [("whole", 1024 * 256 * 4 + 8), ("region", 4 * 1024 + 8)]:
        wrapped = StatefulCheckpoint(head, state="buffers", preserve=preserve)
        loss = wrapped(x, k)
        assert wrapped.retained_state_bytes == expect  # ptr (8 bytes, one write) + queue part
        assert preservation_stats().retained_state_bytes == expect
        loss.backward()
        del loss
        assert preservation_stats().retained_state_bytes == 0  # freed with the graph


@pytest.mark.parametrize("preserve, expect", [
    ("whole", {"whole": 1024 * 256 * 4 + 8}),
    ("region", {"whole": 8, "region": 4 * 1024}),  # the 8-byte ptr is small: kept whole (R6)
])
def test_segment_counters_are_keyed_by_option(fresh_runtime, preserve, expect):
    # A segment's retained bytes are counted per option, like the runtime's, and agree with it.
    head = MoCoHead(dim=256, K=1024)
    x, k = torch.randn(4, 256), F.normalize(torch.randn(4, 256), dim=1)
    wrapped = StatefulCheckpoint(head, state="buffers", preserve=preserve)
    loss = wrapped(x, k)
    assert wrapped.retained_by_option == expect == preservation_stats().retained_by_option
    assert wrapped.journal_bytes == expect.get("region", 0) == preservation_stats().journal_bytes
    assert wrapped.snapshot_bytes == expect["whole"] == preservation_stats().snapshot_bytes
    loss.backward()


# ---- RNG (R3) ----------------------------------------------------------------------------
def _dropout_net():
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.Tanh(), nn.Linear(32, 4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_rng_preserved_and_not(dtype):
    x = torch.randn(16, 8, dtype=dtype, generator=torch.Generator().manual_seed(2))
    ref = _dropout_net().to(dtype)
    torch.manual_seed(100)
    out = ref(x).sum()
    torch.rand(7)  # something draws between forward and backward
    out.backward()
    rng_after_ref = torch.get_rng_state()
    grads_ref = [p.grad for p in ref.parameters()]

    def grads_with(run, preserves_rng=True):
        net = _dropout_net().to(dtype)
        torch.manual_seed(100)
        out = run(net)(x).sum()
        torch.rand(7)  # as in the reference: the replay must not start from (or leave) this state
        before_backward = torch.get_rng_state()
        out.backward()
        after = torch.get_rng_state()
        if preserves_rng:  # (without RNG preservation the replay draws from the caller's generator)
            assert torch.equal(after, before_backward)  # the replay's draws are not visible
        return [p.grad for p in net.parameters()], after

    ours, rng_ours = grads_with(lambda n: (lambda x: checkpoint(n, x)))
    for a, b in zip(ours, grads_ref):
        torch.testing.assert_close(a, b)
    assert torch.equal(rng_ours, rng_after_ref)  # visible generator state reinstated (R5)

    theirs, _ = grads_with(lambda n: (lambda x: tuc.checkpoint(n, x, use_reentrant=False)))
    for a, b in zip(theirs, grads_ref):
        torch.testing.assert_close(a, b)

    # Negative control: without RNG preservation the replay draws a new mask, in both.
    ours_nr, _ = grads_with(lambda n: (lambda x: checkpoint(n, x, preserve_rng_state=False)), False)
    theirs_nr, _ = grads_with(lambda n: (lambda x: tuc.checkpoint(n, x, use_reentrant=False,
                                                                  preserve_rng_state=False)), False)
    assert not torch.allclose(ours_nr[0], grads_ref[0])
    assert not torch.allclose(theirs_nr[0], grads_ref[0])
