"""Issue 14.6: one error lists every undeclared tensor a segment wrote, module-qualified (R7).

apply_plan passes the segment's module path (``Checkpointer(..., name=path)``), the prefix of
declared and reachable names in messages.
"""
import gc
import re

import pytest
import torch

from stateremat.contract import UndeclaredStateError
from stateremat.torch import apply_plan

from test_torch_profiler import _batch, _resnet

EXPECTED = [f"layer1.0.{bn}.{buf}" for bn in ("bn1", "bn2")
            for buf in ("running_mean", "running_var", "num_batches_tracked")]


@pytest.mark.parametrize("preserve", ["whole", "region"])
def test_every_undeclared_write_of_a_segment_is_named_in_one_error(preserve):
    model = _resnet()
    apply_plan(model, {"options": [preserve], "segment_names": ["layer1.0"]}, state=None)
    with pytest.raises(UndeclaredStateError) as info:
        model(*_batch()).backward()
    text = str(info.value)
    del info
    gc.collect()  # the refused step's graph (held by the traceback) releases its segments
    assert "segment 'layer1.0'" in text
    named = re.findall(r"layer1\.0\.bn[12]\.\w+", text)
    assert sorted(set(named)) == sorted(EXPECTED), text


def test_a_plain_tensor_attribute_gets_the_tip_that_declares_it():
    """A module's plain tensor attribute (not a buffer) written in strict mode: ``state=[module]``
    and ``state="buffers"`` do not declare it, so the tip says to list the tensor itself; followed,
    the step equals eager's."""
    import torch
    from torch import nn
    from stateremat.torch import UndeclaredStateError, checkpoint

    def make():
        torch.manual_seed(0)
        m = nn.Linear(4, 4).double()
        m.acc = torch.zeros(4, dtype=torch.float64)
        return m

    def fn_of(m):
        def fn(x):
            out = m(x) * m.acc.clone()
            m.acc.add_(1.0)
            return out
        return fn

    m = make()
    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(UndeclaredStateError) as err:
        checkpoint(fn_of(m), x, state=[m])
    assert "state=[module, module.attr]" in str(err.value)
    ref, got = make(), make()
    for _ in range(2):
        fn_of(ref)(x).pow(2).sum().backward()
        checkpoint(fn_of(got), x, state=[got, got.acc]).pow(2).sum().backward()
    assert torch.equal(ref.weight.grad, got.weight.grad) and torch.equal(ref.acc, got.acc)
