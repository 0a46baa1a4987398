"""The saved-count refusal names Python's random, and its tip works (issue 25, found by an attack).

A LayerDrop branch on ``random.random()`` takes another way in the replay (the replay reproduces
torch's generators, not Python's), so backward is refused with torch's phrase; the tip said
"depend only on inputs and declared state", which cannot be followed for ``random``. Now it
names ``random`` and says what to do; both ways it offers give eager's gradients bit for bit.
"""
from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from stateremat.torch import ReplayError, checkpoint

D = torch.float64


class _LayerDrop(nn.Module):
    def __init__(self, draw: str):
        super().__init__()
        self.l, self.l2 = nn.Linear(4, 4).to(D), nn.Linear(4, 4).to(D)
        self.draw = draw

    def forward(self, x, r=None):
        h = torch.tanh(self.l(x))
        if self.draw == "python":
            skip = random.random() < 0.5
        elif self.draw == "torch":  # the tip: torch's generator, which the replay reproduces
            skip = bool(torch.rand(()) < 0.5)
        else:  # the tip's other way: drawn outside, passed in
            skip = r < 0.5
        return h if skip else torch.tanh(self.l2(h))


def _steps(draw: str, ck: bool, preserve: str) -> list[torch.Tensor]:
    random.seed(0)
    torch.manual_seed(0)
    m = _LayerDrop(draw)
    x = torch.randn(3, 4, dtype=D, generator=torch.Generator().manual_seed(1))
    out = []
    for step in range(6):
        xi = (x + step).requires_grad_()
        args = (xi,) if draw != "outside" else (xi, random.random())
        y = checkpoint(m, *args, preserve=preserve) if ck else m(*args)
        y.pow(2).sum().backward()
        out += [xi.grad] + [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in m.parameters()]
        m.zero_grad()
    return out


@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_a_branch_on_python_random_is_refused_naming_it(preserve):
    with pytest.raises(ReplayError) as exc:
        _steps("python", True, preserve)
    text = str(exc.value)
    assert "A different number of tensors was saved" in text or "trying to save more tensors" in text
    assert "Python's random" in text and "torch.rand(()) < p" in text


@pytest.mark.parametrize("draw", ["torch", "outside"])
@pytest.mark.parametrize("preserve", ["region", "whole"])
def test_the_random_tip_followed_gives_eager_gradients(draw, preserve):
    eager, ours = _steps(draw, False, preserve), _steps(draw, True, preserve)
    assert all(torch.equal(a, b) for a, b in zip(eager, ours))
