"""``stateremat.integrations.timm.checkpoint_seq`` without timm installed: which functions run
checkpointed (twice per step: forward and replay) and which run plainly (once), ``skip_last``
and ``every`` included, with gradients equal to eager's."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from stateremat.integrations.timm import checkpoint_seq

D = torch.float64


class _Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.runs = []  # forward calls, replays included (a list's appends are made again by a replay)

    def forward(self, x):
        self.runs.append(1)
        return torch.tanh(self.lin(x))


def _blocks(n: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[_Counted() for _ in range(n)]).to(D)


@pytest.mark.parametrize("every", [1, 2, 3])
@pytest.mark.parametrize("skip_last", [False, True])
@pytest.mark.parametrize("n", [1, 4, 5])
def test_checkpoint_seq_checkpoints_all_but_a_skipped_last_function(n, skip_last, every):
    x = torch.randn(3, 6, dtype=D, generator=torch.Generator().manual_seed(1), requires_grad=True)
    ref = _blocks(n)
    ref(x).square().sum().backward()
    want = [p.grad.clone() for p in ref.parameters()], x.grad.clone()
    x.grad = None

    model = _blocks(n)
    checkpoint_seq(model, x, every=every, skip_last=skip_last, preserve="whole").square().sum().backward()
    got = [p.grad for p in model.parameters()], x.grad
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0])) and torch.equal(got[1], want[1])
    runs = [len(b.runs) for b in model]
    plain = n - 1 if skip_last else None  # the skipped last function is not checkpointed: one run
    assert runs == [1 if i == plain else 2 for i in range(n)], runs
