"""A torch.compile'd block inside a checkpointed segment (issue 24, item 5): it runs uncompiled, and
says so once per segment with a UserWarning naming the compiled part, the effect and the fix;
its results, state and gradients equal the uncompiled eager block bit for bit."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from stateremat.torch import StatefulCheckpoint, checkpoint

D = torch.float64


def _block() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Tanh()).to(D)


def _compiled(how: str, block: nn.Module, backend: str):
    if how == "module":
        return torch.compile(block, backend=backend)
    if how == "method":  # module.compile(): the block itself, compiled in place
        block.compile(backend=backend)
        return block
    if how == "inner":  # a compiled submodule of the segment
        block[0] = torch.compile(block[0], backend=backend)
        return block
    return torch.compile(lambda x: block(x), backend=backend)


def _steps(run, block: nn.Module, steps: int = 3) -> list:
    out = []
    for step in range(steps):
        x = torch.randn(4, 8, dtype=D, generator=torch.Generator().manual_seed(step), requires_grad=True)
        torch.manual_seed(100 + step)
        y = run(x)
        w = block[0].weight if not hasattr(block[0], "_orig_mod") else block[0]._orig_mod.weight
        g = torch.autograd.grad(y.square().sum(), (x, w))
        out.append([y.detach(), *g, block[1].running_mean.clone(), block[1].running_var.clone(),
                    block[1].num_batches_tracked.clone(), torch.get_rng_state()])
    return out


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("how", ["module", "method", "inner", "function"])
def test_a_compiled_block_in_a_segment_warns_once_and_equals_the_uncompiled_block(how, backend):
    torch._dynamo.reset()
    ref_block, block = _block(), _block()
    ref = _steps(ref_block, ref_block)  # the uncompiled block, no checkpoint
    seg = _compiled(how, block, backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = _steps(lambda x: checkpoint(seg, x), block)
    mine = [w for w in caught if "compiled with torch.compile" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]  # once per segment, not once per step
    msg = str(mine[0].message)
    assert mine[0].category is UserWarning
    what = {"module": "torch.compile(module)", "method": "module.compile()", "inner": "module '0'",
            "function": "torch.compile(fn)"}[how]
    assert what in msg and "runs uncompiled" in msg and "random numbers" in msg, msg
    assert "checkpoint(compiled._orig_mod, x)" in msg and "compile the whole model" in msg, msg
    for a, b in zip(ref, ours):  # outputs, gradients, BatchNorm statistics (once per step), generator
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert int(block[1].num_batches_tracked) == 3


def test_the_tip_is_followed_no_warning_and_eager_equality():
    # the tip: checkpoint the uncompiled module; an uncompiled block (StatefulCheckpoint too) warns nothing
    torch._dynamo.reset()
    ref_block, block, other = _block(), _block(), _block()
    ref = _steps(ref_block, ref_block)
    compiled = torch.compile(block, backend="aot_eager")
    wrapped = StatefulCheckpoint(other, state="buffers")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = _steps(lambda x: checkpoint(compiled._orig_mod, x), block)
        theirs = _steps(wrapped, other)
    for a, b, c in zip(ref, ours, theirs):
        assert all(torch.equal(u, v) and torch.equal(u, w) for u, v, w in zip(a, b, c))


def test_a_stateful_checkpoint_of_a_compiled_block_warns():
    torch._dynamo.reset()
    block = _block()
    wrapped = StatefulCheckpoint(torch.compile(block, backend="aot_eager"), state="buffers")
    with pytest.warns(UserWarning, match=r"torch\.compile\(module\).*runs uncompiled"):
        wrapped(torch.randn(4, 8, dtype=D, requires_grad=True)).sum().backward()
    assert int(block[1].num_batches_tracked) == 1


class _Block(nn.Module):  # a plain module class: no __len__ (bool() of its compiled wrapper raised)
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8).to(D)

    def forward(self, x):
        return self.lin(x).tanh()


@pytest.mark.parametrize("form", ["checkpoint", "StatefulCheckpoint", "__call__"])
def test_a_compiled_module_of_a_class_without_len_warns_and_runs(form):
    """``checkpoint(torch.compile(Block()), x)``, the README's own example: it raised ``TypeError:
    Block does not support len()`` at the forward; now it warns once and equals the uncompiled block."""
    torch.manual_seed(0)
    ref = _Block()
    cb = torch.compile(_Block(), backend="aot_eager")
    cb._orig_mod.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8, dtype=D, requires_grad=True)
    run = {"checkpoint": lambda: checkpoint(cb, x), "StatefulCheckpoint": lambda: StatefulCheckpoint(cb)(x),
           "__call__": lambda: checkpoint(cb.__call__, x)}[form]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = run()
    assert sum("compiled with torch.compile" in str(w.message) for w in caught) == 1
    g = torch.autograd.grad(y.sum(), x)[0]
    assert torch.equal(y, ref(x)) and torch.equal(g, torch.autograd.grad(ref(x).sum(), x)[0])
