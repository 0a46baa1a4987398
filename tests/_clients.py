"""Tiny random-weight real clients (transformers, timm) built from configs: no downloads.

timm 1.0.31 imports ``torchvision.ops.misc.FrozenBatchNorm2d`` when it is imported. torchvision
is kept out of this environment (its default wheel is a CUDA build of another torch, which breaks
``import timm``/``transformers`` beside the CPU torch), so :func:`import_timm` registers that one
class, written in plain torch, under ``torchvision.ops.misc`` when torchvision is absent. Nothing
the tests check runs through it (no model here uses frozen BatchNorm).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

import pytest
import torch
from torch import nn


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics and affine parameters (torchvision's semantics)."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        for name, init in (("weight", torch.ones), ("bias", torch.zeros),
                           ("running_mean", torch.zeros), ("running_var", torch.ones)):
            self.register_buffer(name, init(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        bias = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)


class _Absent(type):
    """Metaclass of stand-ins for torchvision names timm only imports (datasets, transforms)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _absent(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"torchvision is not installed: {cls.__qualname__} is a test stand-in. "
                           "Tip: install a torchvision built for this torch to use timm's data tools.")


def _absent(qualname: str) -> type:
    return _Absent(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Creates ``torchvision.*`` modules whose attributes are :func:`_absent` classes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = lambda name: _absent(f"{spec.name}.{name}") if not name.startswith("__") \
            else (_ for _ in ()).throw(AttributeError(name))
        if spec.name == "torchvision":
            mod.__version__ = "0.0.0+stateremat.stand.in"
        if spec.name == "torchvision.ops.misc":
            mod.FrozenBatchNorm2d = FrozenBatchNorm2d
        return mod

    def exec_module(self, module):
        pass


def _register_torchvision_stand_in() -> None:
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return
    sys.meta_path.append(_StandInFinder())


def import_timm():
    """``import timm`` (skips the test when timm is not installed)."""
    _register_torchvision_stand_in()
    return pytest.importorskip("timm")


def import_transformers():
    """``import transformers`` (skips the test when it is not installed)."""
    return pytest.importorskip("transformers")


def train_steps(model: nn.Module, loss_of, steps: int = 2) -> list[dict]:
    """``steps`` SGD-with-momentum steps; after each: loss, every gradient, every parameter and
    buffer (``state_dict``) and the CPU generator state, cloned."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = []
    for step in range(steps):
        torch.manual_seed(1000 + step)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model)
        loss.backward()
        rec = {"loss": loss.detach().clone()}
        rec.update({f"grad:{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        rec.update({f"state:{k}": v.clone() for k, v in model.state_dict().items()})
        rec["rng"] = torch.get_rng_state()
        out.append(rec)
    return out


def assert_bitwise(ours: list[dict], ref: list[dict]) -> None:
    """Every recorded tensor equal bit for bit (same keys, dtype, shape, values)."""
    assert len(ours) == len(ref)
    for step, (a, b) in enumerate(zip(ours, ref)):
        assert a.keys() == b.keys(), (step, sorted(set(a) ^ set(b))[:5])
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (step, k)
            assert torch.equal(a[k], b[k]), (step, k, (a[k].double() - b[k].double()).abs().max().item())
