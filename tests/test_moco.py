"""MoCo model pieces: ResNet-18, strict in-forward queue, deferred control, functional segments."""
from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from stateremat.paper.moco._methods import FunctionalSegment, apply_method, unwrap
from stateremat.paper.workloads._moco import SEGMENTS, MoCo, QueueHead, two_views
from stateremat.paper.workloads._resnet import ResNet18


def test_resnet18_matches_the_standard_cifar_parameter_count():
    # torchvision-style CIFAR ResNet-18 with a 512->10 classifier has 11,173,962 parameters;
    # without the classifier (5,130) that is 11,168,832 (3-channel, width 64).
    assert sum(p.numel() for p in ResNet18(64, 3).parameters()) == 11_168_832
    net = ResNet18(4, 1)
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 32)
    assert net.layer4(net.layer3(net.layer2(net.layer1(net.stem(torch.randn(2, 1, 28, 28)))))).shape \
        == (2, 32, 4, 4)  # no max-pool: 28 -> 28 -> 14 -> 7 -> 4
    with pytest.raises(ValueError, match="width >= 1"):
        ResNet18(0)


def test_strict_queue_reads_the_old_version_and_enqueues_during_forward():
    g = torch.Generator().manual_seed(0)
    head = QueueHead(8, 3, temperature=0.5, generator=g)
    old = head.queue.clone()
    q = torch.randn(4, 3, requires_grad=True)
    k = torch.randn(4, 3)
    logits = head(q, k)
    # independent reference: logits against the queue before the write
    ref = torch.cat([(q * k).sum(1, keepdim=True), q @ old.t()], 1) / 0.5
    torch.testing.assert_close(logits, ref, rtol=0, atol=0)
    torch.testing.assert_close(head.queue[:4], k, rtol=0, atol=0)
    torch.testing.assert_close(head.queue[4:], old[4:], rtol=0, atol=0)
    assert int(head.ptr) == 4
    logits.sum().backward()  # the read version is retained, so backward does not see the write
    torch.testing.assert_close(q.grad, (k + torch.ones(4, 8) @ old) / 0.5)
    with pytest.raises(ValueError, match="not a multiple of the batch"):
        head.enqueue(torch.randn(3, 3))


def _step(model: MoCo, x: torch.Tensor, seed: int, deferred: bool = False):
    xq, xk = two_views(x, torch.Generator().manual_seed(seed))
    model.momentum_update()
    logits, k = model(xq, xk)
    loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long))
    loss.backward()
    if deferred:
        model.queue.enqueue(k)
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    return [loss.detach(), grads]


def _with_buffers(result, model):
    # read after unwrap, so names are the plain module paths
    return (*result, {n: b.clone() for n, b in model.named_buffers()})


def _model(mode: str = "strict") -> MoCo:
    torch.manual_seed(3)
    return MoCo(4, 1, 8, 16, 32, 0.2, 0.9, generator=torch.Generator().manual_seed(3), mode=mode)


def _assert_same(a, b):
    assert torch.equal(a[0], b[0])
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1]))
    assert a[2].keys() == b[2].keys()
    assert all(torch.equal(a[2][n], b[2][n]) for n in a[2])


def test_deferred_and_functional_equal_strict_eager_bit_for_bit():
    x = torch.randn(16, 1, 12, 12)
    m0 = _model()
    ref = _with_buffers(_step(m0, x, 1), m0)
    m1 = _model("deferred")
    _assert_same(ref, _with_buffers(_step(m1, x, 1, deferred=True), m1))
    m = _model()
    originals, policy = apply_method(m, "functional")
    assert policy == ["functional"] * 7
    assert isinstance(m.queue, FunctionalSegment) and isinstance(m.encoder_q.layer2, FunctionalSegment)
    old_queue = m.queue.module.queue
    old_queue_bytes = old_queue.clone()
    got = _step(m, x, 1)
    # out-of-place: the old queue tensor was not written, the module now holds a new one
    assert torch.equal(old_queue, old_queue_bytes)
    assert m.queue.module.queue is not old_queue
    unwrap(m, originals)
    _assert_same(ref, _with_buffers(got, m))
    assert [n for n, _ in m.named_modules() if n in SEGMENTS] == list(SEGMENTS)


def test_whole_and_region_checkpoints_equal_strict_eager_bit_for_bit():
    x = torch.randn(16, 1, 12, 12)
    m0 = _model()
    ref = _with_buffers(_step(m0, x, 1), m0)
    for method in ("whole", "regions"):
        m = _model()
        originals, _ = apply_method(m, method)
        got = _step(m, x, 1)
        unwrap(m, originals)
        _assert_same(ref, _with_buffers(got, m))


def test_plain_torch_checkpoint_double_writes_the_queue_and_batchnorm_stats():
    """Why the app needs preservation (rule R1): torch.utils.checkpoint replays the queue segment
    against the already-written queue (wrong gradients) and replays BatchNorm's update."""
    x = torch.randn(16, 1, 12, 12)
    m0 = _model()
    ref = _with_buffers(_step(m0, x, 1), m0)
    m = _model()
    originals = {p: m.get_submodule(p) for p in SEGMENTS}
    for path in SEGMENTS:
        owner, _, leaf = path.rpartition(".")
        parent = m.get_submodule(owner) if owner else m
        inner = getattr(parent, leaf)

        class Plain(torch.nn.Module):
            def __init__(self, mod):
                super().__init__()
                self.mod = mod

            def forward(self, *a):
                return torch_checkpoint(self.mod, *a, use_reentrant=False)
        setattr(parent, leaf, Plain(inner))
    got = _step(m, x, 1)
    unwrap(m, originals)
    got = _with_buffers(got, m)
    assert torch.equal(ref[0], got[0])  # the forward itself is unchanged
    assert not all(torch.equal(a, b) for a, b in zip(ref[1], got[1]))  # gradients diverge
    rm = [n for n in got[2] if n.endswith("stem.1.running_mean")][0]
    assert not torch.equal(ref[2][rm], got[2][rm])


def _augment_loop(x, oy, ox, flip, scale, pad):
    out = []
    padded = torch.nn.functional.pad(x, (pad,) * 4)
    for i in range(len(x)):
        crop = padded[i, :, oy[i]:oy[i] + x.shape[2], ox[i]:ox[i] + x.shape[3]]
        out.append((crop.flip(-1) if flip[i] else crop) * scale[i])
    return torch.stack(out)


def test_two_views_are_seeded_crops_flips_and_contrast():
    x = torch.randn(6, 2, 9, 9)
    a1, b1 = two_views(x, torch.Generator().manual_seed(5))
    a2, b2 = two_views(x, torch.Generator().manual_seed(5))
    assert torch.equal(a1, a2) and torch.equal(b1, b2) and not torch.equal(a1, b1)
    # replay the draws in the same order and compare with a per-image loop
    g = torch.Generator().manual_seed(5)
    oy = torch.randint(0, 5, (6,), generator=g)
    ox = torch.randint(0, 5, (6,), generator=g)
    flip = torch.rand(6, generator=g) < 0.5
    scale = 1.0 + 0.2 * (2.0 * torch.rand(6, generator=g) - 1.0)
    torch.testing.assert_close(a1, _augment_loop(x, oy, ox, flip, scale, 2), rtol=0, atol=0)


@pytest.mark.parametrize("channels", [1, 3])
def test_two_views_have_nchw_strides(channels):
    # One channel: strides (h*w, 1, w, 1) would also read as channels_last, where torch 2.13's CPU
    # backward of the ResNet's 4->8 1x1 stride-2 conv corrupts the heap (the moco run aborted).
    x = torch.randn(4, channels, 28, 28)
    for v in two_views(x, torch.Generator().manual_seed(0)):
        assert v.stride() == (channels * 784, 784, 28, 1)
        assert torch.empty_like(v).stride() == v.stride()  # what conv/BN outputs inherit


def test_measured_card_matches_known_queue_segment_bytes():
    """The card's tracker against allocations known in closed form (queue segment, tiny preset)."""
    from stateremat.paper.moco._app import PRESETS
    from stateremat.paper.moco._card import measure_card
    from stateremat.paper.moco._probe import make_split
    from stateremat.paper.workloads._datasets import load_dataset

    pr = PRESETS["tiny"]
    split = make_split(load_dataset(pr.dataset), pr.n_validation, pr.fit_images,
                       pr.validation_images, pr.test_images)
    card = measure_card(pr, split, 2701, torch.device("cpu"))
    assert card.segment_names == list(SEGMENTS)
    queue = {o: c.retained_bytes for o, c in card.segments[-1].options.items()}
    logits = 4 * pr.batch_size * (1 + pr.queue_size)      # float32 (batch, 1 + K), kept for the loss
    queue_bytes = 4 * pr.queue_size * pr.dim              # float32 (K, d)
    assert queue["eager"] == logits + queue_bytes          # + the retained read version (clone)
    assert queue["recompute_only"] == logits               # replay keeps nothing of the state
    assert queue["whole"] == logits + queue_bytes + 8      # + snapshot of queue and int64 pointer
    for seg in card.segments[:5]:  # trunk: replay retains far less than eager activations
        assert seg.options["whole"].retained_bytes < seg.options["eager"].retained_bytes / 1.5
