"""In-place segment wrapping (apply_plan), checkpoint_sequential and the KV-cache refusal."""
import copy
import pickle

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

from stateremat.contract import UnsupportedError
from stateremat.torch import apply_plan, checkpoint_sequential


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), *[nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.3),
                                                        nn.Tanh()) for _ in range(3)], nn.Linear(8, 2)).double()


def _step(model, x, seed):
    torch.manual_seed(seed)
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach()


def _snapshot(model):
    return {**{k: v.clone() for k, v in model.state_dict().items()},
            **{f"{n}.grad": p.grad.clone() for n, p in model.named_parameters()},
            "rng": torch.get_rng_state()}


def _assert_bitwise(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("options", [["whole", "region", "eager"], ["region"] * 3, ["whole"] * 3])
def test_apply_plan_matches_eager_bitwise_and_keeps_names(options):
    x = torch.randn(5, 6, dtype=torch.float64)
    ref, model = _net(), _net()
    names, keys = [n for n, _ in model.named_parameters()], list(model.state_dict())
    apply_plan(model, {"options": options, "segment_names": ["1", "2", "3"]})
    assert [n for n, _ in model.named_parameters()] == names and list(model.state_dict()) == keys
    for step in range(2):  # two steps: running statistics and dropout RNG carry over
        assert torch.equal(_step(model, x, step), _step(ref, x, step))
        _assert_bitwise(_snapshot(model), _snapshot(ref))
    assert int(model[1][1].num_batches_tracked) == 2  # updated once per step, not once more per replay


def test_wrapped_model_deepcopies_pickles_and_unwraps():
    model = apply_plan(_net(), {"options": ["whole", "region", "whole"], "segment_names": ["1", "2", "3"]})
    twin = copy.deepcopy(model)
    assert twin[2].forward.module is twin[2] and twin[2].forward.option == "region"
    again = pickle.loads(pickle.dumps(model))
    assert again[1].forward.module is again[1]
    x = torch.randn(5, 6, dtype=torch.float64)
    for m in (model, twin, again):
        _step(m, x, 0)
    _assert_bitwise(_snapshot(model), _snapshot(twin))
    apply_plan(model, {"options": ["eager"] * 3, "segment_names": ["1", "2", "3"]})
    assert all("forward" not in vars(model[i]) for i in (1, 2, 3))


def test_hooks_stay_outside_the_checkpoint_and_fire_once():
    model = apply_plan(_net(), {"options": ["whole"] * 3, "segment_names": ["1", "2", "3"]})
    calls = []
    model[2].register_forward_hook(lambda m, a, o: calls.append("fwd"))
    model[2][0].register_forward_hook(lambda m, a, o: calls.append("inner"))  # inside: replays
    _step(model, torch.randn(5, 6, dtype=torch.float64), 0)
    assert calls.count("fwd") == 1 and calls.count("inner") == 2


def test_apply_plan_replaces_an_older_wrapper_module_by_its_block():
    from stateremat.torch import StatefulCheckpoint

    model = _net()
    keys = list(model.state_dict())
    model[1] = StatefulCheckpoint(model[1], preserve="whole")
    apply_plan(model, {"options": ["region"], "segment_names": ["1"]})
    assert isinstance(model[1], nn.Sequential) and model[1].forward.option == "region"
    assert list(model.state_dict()) == keys


def test_apply_plan_refuses_infeasible_plans_and_the_whole_model():
    with pytest.raises(ValueError, match="infeasible"):
        apply_plan(_net(), {"options": None, "segment_names": ["1"]})
    with pytest.raises(ValueError, match="whole model"):
        apply_plan(_net(), {"options": ["whole"], "segment_names": [""]})
    with pytest.raises(TypeError, match="unknown segment option"):
        apply_plan(_net(), {"options": ["whole"], "segment_names": ["1"]}, granularity=64)


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_checkpoint_sequential_matches_eager_where_torch_does_not(preserve):
    x = torch.randn(5, 6, dtype=torch.float64)
    ref, ours, theirs = _net(), _net(), _net()
    for step in range(2):
        _step(ref, x, step)
        torch.manual_seed(step)
        checkpoint_sequential(ours, 3, x, preserve=preserve).pow(2).mean().backward()
        torch.manual_seed(step)
        tuc.checkpoint_sequential(theirs, 3, x, use_reentrant=False).pow(2).mean().backward()
        _assert_bitwise(_snapshot(ours), _snapshot(ref))
    # torch's replay updates BatchNorm statistics a second time
    assert int(theirs[1][1].num_batches_tracked) == 4 and int(ours[1][1].num_batches_tracked) == 2


def _tied(seed=0):
    """A Sequential that applies the same blocks at several positions (weight tying: a shared
    block run twice, a BatchNorm'd block three times)."""
    torch.manual_seed(seed)
    shared = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Tanh())
    lin = nn.Linear(8, 8)
    return nn.Sequential(nn.Linear(6, 8), shared, lin, shared, nn.Dropout(0.2), lin, shared, nn.Linear(8, 2)).double()


@pytest.mark.parametrize("segments", [1, 2, 3, 8])
@pytest.mark.parametrize("preserve", ["whole", "region"])
@pytest.mark.parametrize("container", ["sequential", "list", "modulelist"])
def test_checkpoint_sequential_runs_a_repeated_module_at_every_position(preserve, segments, container):
    """A module at several positions of the Sequential runs at each (before, it ran once: its
    children() list it once, as torch's checkpoint_sequential does): outputs, gradients, BatchNorm
    statistics and RNG bit for bit with eager over 3 steps."""
    x = torch.randn(5, 6, dtype=torch.float64)
    ref, ours = _tied(), _tied()
    fns = {"sequential": ours, "list": list(ours), "modulelist": nn.ModuleList(list(ours))}[container]
    for step in range(3):
        want = _step(ref, x, step)
        torch.manual_seed(step)
        got = checkpoint_sequential(fns, segments, x, preserve=preserve).pow(2).mean()
        got.backward()
        assert torch.equal(got.detach(), want)
        _assert_bitwise(_snapshot(ours), _snapshot(ref))
    assert int(ours[1][1].num_batches_tracked) == 9  # 3 positions x 3 steps, as eager


def test_checkpoint_sequential_argument_errors():
    x = torch.randn(2, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="segments must be a positive int"):
        checkpoint_sequential(_net(), 0, x)
    with pytest.raises(ValueError, match="use_reentrant"):
        checkpoint_sequential(_net(), 2, x, use_reentrant=True)
    with pytest.raises(ValueError, match="preserve must name an option that replays"):
        checkpoint_sequential(_net(), 2, x, preserve="eager")
    with pytest.raises(TypeError, match="unexpected keyword"):
        checkpoint_sequential(_net(), 2, x, granularity=4)


def test_a_kv_cache_reaching_a_checkpointed_segment_is_refused_at_the_first_forward():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    apply_plan(model, {"options": ["whole", "region"], "segment_names": ["model.layers.0", "model.layers.1"]})
    ids = torch.randint(0, 64, (2, 8))
    with pytest.raises(UnsupportedError, match=r"segment 'model.layers.0' received a transformers DynamicCache "
                                               r"as its keyword argument 'past_key_values'.*use_cache=False"):
        model(input_ids=ids, labels=ids, use_cache=True)
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    with torch.no_grad():  # nothing replays without a graph: caching for generation still works
        assert model(input_ids=ids, use_cache=True).past_key_values.get_seq_length() == 8
