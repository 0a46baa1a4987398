"""torch.compile over models with stateful checkpointed blocks (issues 13.7 and 15).

The library's bookkeeping runs eagerly (one graph break at the segment); the rest of the model
compiles once. After one warm-up step nothing recompiles and no new graph break appears, and
every step matches eager (bitwise for eager/aot_eager, to rounding for inductor).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from stateremat.torch import StatefulCheckpoint, checkpoint

D = torch.float64


def _models(preserve: str, wrap: str):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.2)),
                        nn.Tanh()).double()
    net = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.2)),
                        nn.Tanh()).double()
    net.load_state_dict(ref.state_dict())
    block = net[1]
    if wrap == "module":
        net[1] = StatefulCheckpoint(block, state="buffers", preserve=preserve)
        return ref, net, block

    class Fn(nn.Module):
        def forward(self, x):
            return checkpoint(block, x, state=[block], preserve=preserve)

    net[1] = Fn()
    return ref, net, block


def _frames() -> tuple:
    from torch._dynamo.utils import counters

    return (dict(counters["frames"]), dict(counters["graph_break"]),
            sum(counters["recompiles"].values()) if "recompiles" in counters else 0)


# torch's own noise under filterwarnings=error: dynamo reads .grad of a non-leaf while restoring
# the stack at a graph break (any disabled function shows it); inductor imports torch.jit.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("preserve", ["region", "whole"])
@pytest.mark.parametrize("wrap", ["module", "function"])
def test_compiled_model_with_a_stateful_block_compiles_once_and_matches_eager(backend, preserve, wrap):
    if backend == "inductor":  # the segment's dropout draws torch's random numbers: inductor must too
        import torch._inductor.config as inductor_config

        with inductor_config.patch(fallback_random=True):
            return _compiles_once_and_matches_eager(backend, preserve, wrap)
    return _compiles_once_and_matches_eager(backend, preserve, wrap)


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductor_drawing_its_own_random_numbers_refuses_a_segment_with_dropout():
    # eagerly (at the graph break) the segment would draw torch's masks where the model compiled
    # without the checkpoint draws inductor's: refused at the first forward, naming the fix
    from stateremat.torch import UnsupportedError

    torch._dynamo.reset()
    _, net, block = _models("region", "function")
    compiled = torch.compile(net, backend="inductor")
    x = torch.randn(4, 8, dtype=D)
    with pytest.raises(UnsupportedError, match=r"backend='inductor'.*fallback_random = True"):
        compiled(x)
    assert int(block[1].num_batches_tracked) == 1  # refused after that forward, before any backward


def _compiles_once_and_matches_eager(backend, preserve, wrap):
    torch._dynamo.reset()
    ref, net, block = _models(preserve, wrap)
    compiled = torch.compile(net, backend=backend)
    exact = backend != "inductor"
    warm = None
    for step in range(4):
        if step == 1:
            warm = _frames()
        x = torch.randn(4, 8, dtype=D, generator=torch.Generator().manual_seed(step), requires_grad=True)
        torch.manual_seed(100 + step)
        g_ref = torch.autograd.grad(ref(x).pow(2).sum(), (x, ref[1][0].weight))
        torch.manual_seed(100 + step)
        g = torch.autograd.grad(compiled(x).pow(2).sum(), (x, block[0].weight))
        for a, b in zip(g, g_ref):
            assert torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-10, atol=1e-12)
        assert torch.equal(block[1].running_mean, ref[1][1].running_mean) if exact else \
            torch.allclose(block[1].running_mean, ref[1][1].running_mean, rtol=1e-10, atol=1e-12)
        assert int(block[1].num_batches_tracked) == step + 1
    assert _frames() == warm  # nothing compiled, broken or recompiled after the warm-up step
