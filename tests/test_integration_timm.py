"""stateremat on timm models (random weights, float64): ResNet BatchNorm once per step, ViT drop-path."""
import pytest
import torch

from _clients import assert_bitwise, import_timm, train_steps
from stateremat.torch import PeakMemory, auto_checkpoint, expected_peak_bytes

timm = import_timm()
from stateremat.integrations.timm import checkpoint_seq, disable, enable  # noqa: E402


def resnet():
    torch.manual_seed(0)
    return timm.create_model("resnet18", pretrained=False, num_classes=10).double().train()


def vit():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=3,
                             embed_dim=48, num_heads=3, num_classes=10, drop_rate=0.1, proj_drop_rate=0.1,
                             attn_drop_rate=0.1, drop_path_rate=0.2).double().train()


def images(n=4):
    g = torch.Generator().manual_seed(2)
    return torch.randn(n, 3, 32, 32, generator=g, dtype=torch.float64), torch.randint(0, 10, (n,), generator=g)


def loss_of(model):
    x, y = images()
    return torch.nn.functional.cross_entropy(model(x), y)


@pytest.mark.parametrize("make", [resnet, vit], ids=["resnet18", "vit"])
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_enable_matches_eager_bitwise_over_two_optimizer_steps(make, preserve):
    ref = train_steps(make(), loss_of)
    model = make()
    keys = list(model.state_dict())
    enable(model, preserve=preserve)
    assert list(model.state_dict()) == keys
    assert_bitwise(train_steps(model, loss_of), ref)  # BatchNorm statistics, drop-path/dropout masks, RNG


def test_timms_own_checkpointing_updates_batchnorm_twice_and_enable_once():
    theirs, ours = resnet(), resnet()
    theirs.set_grad_checkpointing(True)
    ours.set_grad_checkpointing(True)
    enable(ours)  # switches timm's own off and checkpoints the same blocks
    assert not ours.grad_checkpointing
    assert sorted(n for n, m in ours.named_modules() if "forward" in vars(m)) == \
        [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    for m in (theirs, ours):
        loss_of(m).backward()
    assert int(theirs.layer1[0].bn1.num_batches_tracked) == 2
    assert int(ours.layer1[0].bn1.num_batches_tracked) == 1
    disable(ours)
    assert not any("forward" in vars(m) for m in ours.modules())


def test_checkpoint_seq_is_a_state_aware_drop_in():
    from timm.models._manipulate import checkpoint_seq as timm_checkpoint_seq

    ref, ours, theirs = resnet(), resnet(), resnet()
    x = torch.randn(2, 64, 8, 8, dtype=torch.float64)
    stages = lambda m: [m.layer1, m.layer2]
    ref_y = torch.nn.Sequential(*stages(ref))(x)
    y = checkpoint_seq(stages(ours), x, flatten=True, every=2, preserve="whole")
    theirs_y = timm_checkpoint_seq(stages(theirs), x, flatten=True, every=2)
    for out in (ref_y, y, theirs_y):
        out.pow(2).mean().backward()
    assert torch.equal(y, ref_y)
    for (n, a), b, c in zip(ref.state_dict().items(), ours.state_dict().values(), theirs.state_dict().values()):
        assert torch.equal(a, b), n
    assert int(theirs.layer1[0].bn1.num_batches_tracked) == 2 and int(ours.layer1[0].bn1.num_batches_tracked) == 1
    for (n, a), b in zip(ref.named_parameters(), ours.parameters()):
        assert (a.grad is None) == (b.grad is None) and (a.grad is None or torch.equal(a.grad, b.grad)), n
    with pytest.raises(ValueError, match="every must be a positive int"):
        checkpoint_seq(stages(ours), x, every=0)


def test_auto_checkpoint_on_a_timm_vit_fits_its_prediction():
    from stateremat.planner import plan
    from stateremat.torch import profile

    sample = images(8)
    lowest = plan(profile(vit(), "blocks.*", (sample[0],), repeats=1), 0, peak="chain").min_feasible_peak_bytes
    model = vit()
    res = auto_checkpoint(model, int(lowest * 1.05), sample=(sample[0],), segments="blocks.*", repeats=1)
    assert set(res.options) != {"eager"}
    model(sample[0]).mean().backward()
    roots = [*model.parameters(), *(p.grad for p in model.parameters()), *model.buffers(), sample[0]]
    with PeakMemory("cpu", roots=roots) as pm:
        model(sample[0]).mean().backward()
    expected = expected_peak_bytes(res.card, res.options)
    assert abs(pm.peak_bytes - expected) <= 0.05 * expected, (pm.peak_bytes, expected, res.options)
    assert pm.peak_bytes <= 1.05 * res.budget_bytes


def test_profile_refuses_a_model_whose_own_grad_checkpointing_is_on():
    from stateremat.torch import profile

    model = resnet()
    model.set_grad_checkpointing(True)
    with pytest.raises(ValueError, match=r"own timm checkpointing is on \(grad_checkpointing=True.*"
                                         r"set_grad_checkpointing\(False\)"):
        profile(model, "layer?.*", images(2)[:1], repeats=1)
    model.set_grad_checkpointing(False)
    assert len(profile(model, "layer1.*", images(2)[:1], repeats=1).segments) == 2


class _QueueBlock(torch.nn.Module):
    """A block that writes one 64-byte row of a 64 KiB queue buffer per forward."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8).double()
        self.register_buffer("queue", torch.zeros(1024, 8, dtype=torch.float64))

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        self.queue[0] = h[0].detach()
        return h + self.queue[1:3].sum()


def test_enable_and_checkpoint_seq_journal_exactly_the_written_bytes_by_default():
    from stateremat.torch import preservation_stats

    x = torch.randn(4, 8, dtype=torch.float64)
    model = torch.nn.Sequential(_QueueBlock(), _QueueBlock())
    before = preservation_stats().journal_bytes
    enable(model, ["0"])
    out = model(x)
    assert preservation_stats().journal_bytes - before == 64  # one row, not a 4096-byte chunk
    out.sum().backward()
    out = checkpoint_seq(model, x)
    assert preservation_stats().journal_bytes - before == 2 * 64
    out.sum().backward()


def test_enable_checks_every_argument_before_switching_timms_checkpointing_off():
    for bad, error in [({"preserve": "eager"}, "preserve must be one of"), ({"preserve": "bogus"}, "preserve must be"),
                       ({"granularity_bytes": 0}, "granularity_bytes must be"),
                       ({"on_undeclared": "ignore"}, "on_undeclared must be"),
                       ({"state": "everything"}, "state must be 'auto', 'buffers'")]:
        model = resnet()
        model.set_grad_checkpointing(True)
        with pytest.raises(ValueError, match=error):
            enable(model, **bad)
        assert model.grad_checkpointing is True  # timm's own checkpointing untouched
        assert not any("forward" in vars(m) for m in model.modules())
