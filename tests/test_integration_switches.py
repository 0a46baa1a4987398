"""The frameworks' own checkpointing switches after stateremat's integrations (issue 24, item 6):
transformers' ``gradient_checkpointing_enable``/``activation_checkpointing_enable`` and ``Trainer``
keep stateremat's checkpoint (or refuse at that call), timm's ``set_grad_checkpointing(True)`` is
refused at that call, and a Lightning ``Trainer`` runs stateremat through a callback — each
bitwise equal to training without checkpointing (float64)."""
import copy
import functools

import pytest
import torch
from torch import nn

from _clients import assert_bitwise, import_timm, import_transformers, train_steps
from stateremat.torch import preservation_stats, reset_preservation_stats

transformers = import_transformers()
from stateremat.integrations import transformers as hf  # noqa: E402

VOCAB = 96


def llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=32, attention_dropout=0.2)).double().train()


def lm_loss(m):
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(5))
    return m(input_ids=ids, labels=ids, use_cache=False).loss


def layer_funcs(model):
    return [m._gradient_checkpointing_func for m in model.model.layers]


def is_ours(f):
    return isinstance(f.func if isinstance(f, functools.partial) else f, hf.StateAwareCheckpoint)


SWITCHES = {
    "activation_checkpointing_enable": lambda m: m.activation_checkpointing_enable(),
    "with_torch_kwargs": lambda m: m.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": False, "preserve_rng_state": True}),
    "gradient_checkpointing_enable": lambda m: m.gradient_checkpointing_enable(),
    "disable_then_enable": lambda m: (m.gradient_checkpointing_disable(), m.activation_checkpointing_enable()),
}


@pytest.mark.parametrize("switch", list(SWITCHES))
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_(enable|disable)` is deprecated:FutureWarning")
def test_transformers_own_switch_after_enable_keeps_stateremats_checkpoint(switch):
    ref = train_steps(llama(), lm_loss)
    model = hf.enable(llama(), preserve="region")
    SWITCHES[switch](model)
    assert all(is_ours(f) for f in layer_funcs(model)), layer_funcs(model)
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    reset_preservation_stats()
    ours = train_steps(model, lm_loss)
    assert preservation_stats().recompute_count == 2 * len(model.model.layers)  # stateremat replayed each layer
    assert_bitwise(ours, ref)  # dropout masks replayed, nothing differs


def test_transformers_switch_with_another_function_is_refused_at_that_call_and_disable_hands_it_back():
    model = hf.enable(llama())
    with pytest.raises(ValueError, match=r"checkpointed by stateremat.*use_reentrant=True.*disable\(model\)"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    with pytest.raises(ValueError, match=r"another function.*offload"):
        model.activation_checkpointing_enable(offload=True)
    assert all(is_ours(f) for f in layer_funcs(model))  # the refused calls changed nothing
    hf.disable(model)
    model.activation_checkpointing_enable()  # the tip: after disable, transformers' own checkpoint
    assert not any(is_ours(f) for f in layer_funcs(model))
    clone = copy.deepcopy(hf.enable(model))
    clone.activation_checkpointing_enable()  # the copy's switch keeps the copy's stateremat checkpoint
    assert all(is_ours(f) for f in layer_funcs(clone))


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_(enable|disable)` is deprecated:FutureWarning")
def test_transformers_switch_without_rng_replay_is_refused_at_that_call_and_the_tip_gets_eagers_result():
    # preserve_rng_state=False would replay other dropout masks (attention_dropout=0.2): gradients unlike eager
    ref = train_steps(llama(), lm_loss)
    model = hf.enable(llama())
    for call in (lambda: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"preserve_rng_state": False}),
                 lambda: model.activation_checkpointing_enable(
                     activation_checkpointing_kwargs={"use_reentrant": False, "preserve_rng_state": False})):
        with pytest.raises(ValueError, match=r"preserve_rng_state=False.*dropout masks.*Tip: drop preserve_rng_state"
                                             r".*disable\(model\)"):
            call()
    assert all(is_ours(f) for f in layer_funcs(model))  # the refused calls changed nothing
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={})  # the tip: preserve_rng_state dropped
    reset_preservation_stats()
    ours = train_steps(model, lm_loss)
    assert preservation_stats().recompute_count == 2 * len(model.model.layers)
    assert_bitwise(ours, ref)


def test_transformers_trainer_with_gradient_checkpointing_keeps_stateremats_checkpoint(tmp_path):
    ids = torch.randint(0, VOCAB, (8, 12), generator=torch.Generator().manual_seed(7))
    data = [{"input_ids": x, "labels": x} for x in ids]

    def train(model, out):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / out), max_steps=2, per_device_train_batch_size=2, learning_rate=0.05,
            report_to="none", use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True,
            activation_checkpointing=model is not None and out == "ours", dataloader_num_workers=0, seed=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
        return {k: v.clone() for k, v in model.state_dict().items()}

    ref = train(llama(), "ref")
    model = hf.enable(llama())
    reset_preservation_stats()
    ours = train(model, "ours")
    assert all(is_ours(f) for f in layer_funcs(model))
    assert preservation_stats().recompute_count == 2 * len(model.model.layers)
    assert ref.keys() == ours.keys()
    for k in ref:
        assert torch.equal(ref[k], ours[k]), k


# --------------------------------------------------------------------------- timm
def test_timms_own_switch_after_enable_is_refused_at_that_call_and_disable_hands_it_back():
    timm = import_timm()
    from stateremat.integrations import timm as st_timm

    def resnet():
        torch.manual_seed(0)
        return timm.create_model("resnet18", pretrained=False, num_classes=3).double().train()

    model = st_timm.enable(resnet())
    with pytest.raises(ValueError, match=r"set_grad_checkpointing\(True\).*Tip: leave timm's switch off.*disable"):
        model.set_grad_checkpointing(True)
    assert not model.grad_checkpointing
    model.set_grad_checkpointing(False)  # harmless: timm's own stays off
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    model(x).sum().backward()
    assert int(model.layer1[0].bn1.num_batches_tracked) == 1  # stateremat replayed, BatchNorm once
    st_timm.disable(model)
    model.set_grad_checkpointing(True)  # the tip: after disable, timm's own switch works again
    assert model.grad_checkpointing


# --------------------------------------------------------------------------- Lightning
class _Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv, self.bn, self.drop = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.Dropout(0.3)

    def forward(self, x):
        return x + self.drop(torch.relu(self.bn(self.conv(x))))


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # Lightning's own use of torch's pytree
@pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning")
@pytest.mark.filterwarnings("ignore:.*(smaller than the logging interval|log_every_n_steps).*:UserWarning")
def test_lightning_callback_trains_bitwise_like_no_checkpointing():
    pl = pytest.importorskip("pytorch_lightning")
    from stateremat.integrations.lightning import StateAwareCheckpointing

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3, padding=1)
            self.blocks = nn.Sequential(*[_Block(4) for _ in range(3)])
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.blocks(self.stem(x)).mean((2, 3)))

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 3, 6, 6, dtype=torch.float64, generator=g),
                                          torch.randint(0, 2, (8,), generator=g))

    def fit(callbacks):
        torch.manual_seed(0)
        net = Net().double()
        trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
        trainer.fit(net, torch.utils.data.DataLoader(data, batch_size=2))
        return net

    ref = fit([])
    cb = StateAwareCheckpointing(preserve="region")
    reset_preservation_stats()
    ours = fit([cb])
    assert preservation_stats().recompute_count == 3 * 3  # three blocks replayed in each of three steps
    assert not any("forward" in vars(m) for m in ours.modules())  # teardown put the blocks back
    for (k, a), b in zip(ref.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), k  # weights and BatchNorm statistics (updated once per step)
    assert int(ours.blocks[0].bn.num_batches_tracked) == 3
    with pytest.raises(ValueError, match="preserve must be one of"):
        StateAwareCheckpointing(preserve="eager")
