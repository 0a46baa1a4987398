"""stateremat through transformers' own checkpointing hook, on tiny random-weight models (float64)."""
import gc

import pytest
import torch

from _clients import assert_bitwise, import_transformers, train_steps
from stateremat.contract import UnsupportedError
from stateremat.torch import PeakMemory, auto_checkpoint, expected_peak_bytes

transformers = import_transformers()
from stateremat.integrations.transformers import StateAwareCheckpoint, disable, enable  # noqa: E402

VOCAB = 96


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=32, attention_dropout=0.2))


def gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2))


def bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB,
        max_position_embeddings=32, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2))


MODELS = {"llama": llama, "gpt2": gpt2, "bert": bert}
LAYERS = {"llama": "model.layers.*", "gpt2": "transformer.h.*", "bert": "bert.encoder.layer.*"}


def build(name):
    torch.manual_seed(0)
    return MODELS[name]().double().train()


def batch(use_cache=False, name="llama"):
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(5))
    kw = {} if name == "bert" else {"use_cache": use_cache}
    return {"input_ids": ids, "labels": ids, **kw}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_enable_matches_eager_bitwise_over_two_optimizer_steps_with_dropout(name, preserve):
    ref = train_steps(build(name), lambda m: m(**batch(name=name)).loss)
    model = enable(build(name), preserve=preserve)
    funcs = {type(m._gradient_checkpointing_func) for m in model.modules() if getattr(m, "gradient_checkpointing", False)}
    assert funcs == {StateAwareCheckpoint}
    replays = []
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False) and isinstance(m, transformers.modeling_layers.GradientCheckpointingLayer):
            m.register_forward_pre_hook(lambda *a: replays.append(1))
    ours = train_steps(model, lambda m: m(**batch(name=name)).loss)
    assert_bitwise(ours, ref)  # loss, gradients, parameters, buffers, RNG: dropout masks were replayed
    assert len(replays) == 2 * transformers_layers(model)  # hooks outside the checkpoint: once per step


def transformers_layers(model):
    return sum(isinstance(m, transformers.modeling_layers.GradientCheckpointingLayer) for m in model.modules())


def test_transformers_own_kwargs_path_is_plain_torch_and_enable_differs_from_it():
    # transformers' gradient_checkpointing_kwargs go to torch.utils.checkpoint; ours installs its own function
    model = build("llama")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert not isinstance(model.model.layers[0]._gradient_checkpointing_func, StateAwareCheckpoint)
    enable(model, every_n_layers=2)
    flags = [layer.gradient_checkpointing for layer in model.model.layers]
    assert flags == [True, False]
    disable(model)
    assert not any(layer.gradient_checkpointing for layer in model.model.layers)


def test_use_cache_true_under_enable_trains_like_eager():
    ref = train_steps(build("llama"), lambda m: m(**batch(use_cache=True)).loss)
    ours = train_steps(enable(build("llama")), lambda m: m(**batch(use_cache=True)).loss)
    assert_bitwise(ours, ref)


def test_a_layer_that_updates_its_kv_cache_is_refused_at_the_first_forward():
    model = enable(build("llama"))
    model.model.layers[1]._can_checkpoint_with_cache = True  # claims to only read the cache: it appends
    # (with use_cache=True transformers creates no cache under checkpointing; a user's cache still arrives)
    cache = transformers.DynamicCache()
    with pytest.raises(UnsupportedError, match=r"segment 'model.layers.1' updated a transformers DynamicCache as "
                                               r"its keyword argument 'past_key_values'.*use_cache=False"):
        model(**batch(), past_key_values=cache)
    cache.layers.clear()  # its keys hold the refused step's graph, which holds them: free both
    gc.collect()
    model(**batch(use_cache=False)).loss.backward()  # and without a cache it trains


def test_enable_fails_clearly_without_the_hook():
    with pytest.raises(TypeError, match=r"does not offer transformers' activation-checkpointing hook.*"
                                        r"Tip: checkpoint its layers with stateremat.torch.auto_checkpoint"):
        enable(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="every_n_layers must be a positive int"):
        enable(build("gpt2"), every_n_layers=0)


@pytest.mark.parametrize("name", list(MODELS))
def test_auto_checkpoint_on_transformers_layers_matches_eager_and_its_prediction(name):
    from stateremat.planner import plan
    from stateremat.torch import profile

    ref = train_steps(build(name), lambda m: m(**batch(name=name)).loss)
    lowest = plan(profile(build(name), LAYERS[name], batch(name=name), repeats=1), 0,
                  peak="chain").min_feasible_peak_bytes
    model = build(name)
    names = [n for n, _ in model.named_parameters()]
    res = auto_checkpoint(model, int(lowest * 1.02), sample=batch(name=name), segments=LAYERS[name], repeats=1)
    assert [n for n, _ in model.named_parameters()] == names
    assert set(res.options) != {"eager"}
    ours = train_steps(model, lambda m: m(**batch(name=name)).loss)
    assert_bitwise(ours, ref)
    sample = batch(name=name)
    roots = [*model.parameters(), *(p.grad for p in model.parameters()), *model.buffers(), sample["input_ids"]]
    with PeakMemory("cpu", roots=roots) as pm:
        model(**sample).loss.backward()
    expected = expected_peak_bytes(res.card, res.options)
    assert abs(pm.peak_bytes - expected) <= 0.05 * expected, (pm.peak_bytes, expected, res.options)
    assert pm.peak_bytes <= 1.05 * res.budget_bytes


@pytest.mark.parametrize("form", ["module", "checkpointer"])
def test_a_kv_cache_updated_inside_any_checkpoint_form_is_refused(form):
    # the library's own forms refuse a cache the segment updates, like apply_plan and enable()
    from stateremat.torch import Checkpointer, StatefulCheckpoint

    torch.manual_seed(0)
    cache = transformers.DynamicCache()
    x = torch.randn(1, 1, 2, 4, requires_grad=True)
    if form == "module":
        model = llama().train()
        model.model.layers[0] = StatefulCheckpoint(model.model.layers[0])
        with pytest.raises(UnsupportedError, match=r"DynamicCache.*use_cache=False"):
            model(input_ids=torch.randint(0, VOCAB, (1, 8)), past_key_values=cache, use_cache=True)
    else:
        with pytest.raises(UnsupportedError, match=r"DynamicCache.*'past_key_values'.*use_cache=False"):
            Checkpointer()(lambda x, past_key_values: past_key_values.update(x, x, 0)[0].sum(), x,
                           past_key_values=cache)
    gc.collect()


def test_profile_with_a_kv_cache_propagates_the_refusal_not_a_did_not_run_error():
    from stateremat.torch import profile

    with pytest.raises(UnsupportedError, match=r"use_cache=False") as info:
        profile(build("llama"), LAYERS["llama"], batch(use_cache=True), repeats=1)
    assert "did not run" not in str(info.value)


def test_profile_refuses_a_model_whose_own_gradient_checkpointing_is_on():
    from stateremat.torch import profile

    model = build("llama")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    with pytest.raises(ValueError, match=r"own transformers checkpointing is on \(gradient_checkpointing=True on "
                                         r"\[.*'model.layers.0'.*activation_checkpointing_disable\(\)"):
        profile(model, LAYERS["llama"], batch(), repeats=1)
    with pytest.raises(ValueError, match="activation_checkpointing_disable"):
        auto_checkpoint(model, "1GiB", sample=batch(), segments=LAYERS["llama"], repeats=1)
    enable(model)  # stateremat's own hook is a framework checkpoint too
    with pytest.raises(ValueError, match="gradient_checkpointing=True"):
        profile(model, LAYERS["llama"], batch(), repeats=1)
    model.activation_checkpointing_disable()
    card = profile(model, LAYERS["llama"], batch(), repeats=1)
    assert card.segment_names == ["model.layers.0", "model.layers.1"]


def test_enable_journals_exactly_the_written_bytes_and_checks_arguments_before_changing_the_model():
    from stateremat.torch import preservation_stats
    from transformers.modeling_layers import GradientCheckpointingLayer

    class Cfg(transformers.PretrainedConfig):
        model_type = "stateremat_queue_toy"

    class Layer(GradientCheckpointingLayer):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("queue", torch.zeros(1024, 8))  # 32 KiB; one 32-byte row written per forward

        def forward(self, h):
            h = torch.tanh(self.lin(h))
            self.queue[0] = h[0].detach()
            return h + self.queue[1:3].sum()

    class Toy(transformers.PreTrainedModel):
        config_class = Cfg
        supports_gradient_checkpointing = True

        def __init__(self, cfg):
            super().__init__(cfg)
            self.layers = torch.nn.ModuleList([Layer(), Layer()])
            self.post_init()

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    model = Toy(Cfg()).train()
    for bad, error in [({"preserve": "eager"}, "preserve must be one of"), ({"granularity_bytes": -1}, "granularity"),
                       ({"on_undeclared": "ignore"}, "on_undeclared"), ({"state": "everything"}, "state must be"),
                       ({"every_n_layers": 0}, "every_n_layers")]:
        with pytest.raises(ValueError, match=error):
            enable(model, **bad)
        assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())  # unchanged
    enable(model)
    before = preservation_stats().journal_bytes
    out = model(torch.randn(4, 8))
    assert preservation_stats().journal_bytes - before == 2 * 32  # one row per layer, not 4096-byte chunks
    out.sum().backward()
