"""Argument checks shared by the public torch entry points, run before any work.

Each refuses misuse with stateremat's own error (``TypeError``, ``ValueError`` or
:class:`~._errors.UnsupportedError`) naming the API, what was expected and what was got, with
one tip, instead of a torch internal error or a ``RecursionError`` from deep inside.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._errors import UnsupportedError

#: Nesting levels of lists and tuples accepted in ``state=`` (and in a plan's fields).
MAX_STATE_DEPTH = 100


def require_module(model: Any, api: str) -> None:
    """Refuse a ``model`` that is not an ``nn.Module`` (a function, a lambda, None)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{api}: model must be an nn.Module (it names the segments by module path), got "
                        f"{type(model).__name__}. Tip: wrap the function in a module, or checkpoint it "
                        "with stateremat.torch.checkpoint(fn, ...).")


def state_tensor_kind(t: torch.Tensor) -> str | None:
    """Why a declared tensor cannot be preserved (nested, sparse, meta, quantized, ...), or None."""
    if t.is_nested:
        return "a nested tensor"
    if t.layout != torch.strided:
        return f"a {t.layout} tensor"
    if t.is_meta:
        return "a meta tensor (no bytes)"
    if t.is_quantized:
        return "a quantized tensor"
    return None


def check_state_tensor(t: torch.Tensor, where: str, api: str) -> None:
    """Refuse a declared tensor whose bytes cannot be snapshotted or journaled."""
    kind = state_tensor_kind(t)
    if kind is not None:
        raise UnsupportedError(
            f"{api}: declared state {where} is {kind}; expected a dense strided tensor with storage "
            "(the replay restores its bytes). Tip: declare the dense buffers that hold the state.")


def check_nesting(obj: Any, depth: int, path: list[int], api: str, what: str) -> None:
    """Refuse a list/tuple that contains itself or nests deeper than :data:`MAX_STATE_DEPTH`
    (``path``: ids of the containers above ``obj``)."""
    if id(obj) in path:
        raise ValueError(f"{api}: {what} contains itself (expected a finite list of tensors, modules and "
                         "generators, got a self-referencing one). Tip: pass a flat list.")
    if depth > MAX_STATE_DEPTH:
        raise ValueError(f"{api}: {what} is nested more than {MAX_STATE_DEPTH} levels deep (expected a flat "
                         "or shallow list). Tip: pass a flat list, e.g. state=[model.queue, model.bn].")


def check_plan_fields(options: Any, names: Any, api: str = "apply_plan") -> None:
    """Refuse plan fields that are not flat sequences of option names/Options and strings."""
    for what, seq in (("options", options), ("segment_names", names)):
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
            raise TypeError(f"{api}: plan {what} must be a list, got {type(seq).__name__}. "
                            "Tip: pass a PlanResult or its PLAN.json dict.")
        for i, x in enumerate(seq):
            if isinstance(x, (list, tuple, dict, set)):
                raise TypeError(f"{api}: plan {what}[{i}] must be {'a string' if what == 'segment_names' else 'an option name'}"
                                f", got a {type(x).__name__}. Tip: pass a PlanResult or its PLAN.json dict.")


def check_optimizers(optimizers: Any, api: str) -> list:
    """``optimizers`` as a list of optimizers (objects with ``state`` and ``state_dict``, as
    ``torch.optim.Optimizer``); a single optimizer, None, a string or a list of anything else is
    refused naming what was got."""
    if isinstance(optimizers, torch.optim.Optimizer):
        raise TypeError(f"{api}: optimizers must be a list of optimizers, got one "
                        f"{type(optimizers).__name__}. Tip: optimizers=[opt].")
    if isinstance(optimizers, (str, bytes)) or not hasattr(optimizers, "__iter__"):
        raise TypeError(f"{api}: optimizers must be a list of optimizers, got "
                        f"{type(optimizers).__name__}. Tip: optimizers=[opt], or () for none.")
    out = list(optimizers)
    for i, o in enumerate(out):
        if not (hasattr(o, "state_dict") and isinstance(getattr(o, "state", None), dict)):
            raise TypeError(f"{api}: optimizers[{i}] must be an optimizer (a torch.optim.Optimizer: "
                            f"its state counts in P and is put back after), got "
                            f"{type(o).__name__}. Tip: optimizers=[opt] with the optimizers step_fn "
                            "steps.")
    return out
