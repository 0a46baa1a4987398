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
