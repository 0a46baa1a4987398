"""stateremat checkpointing for timm models: the blocks timm checkpoints, state-aware.

timm's ``set_grad_checkpointing()`` makes a model call ``torch.utils.checkpoint.checkpoint`` on
its blocks (``checkpoint_seq`` over a ResNet's stages, ``checkpoint(blk, x)`` over a ViT's
blocks). torch's replay runs each block's BatchNorm a second time, so running statistics are
updated twice per step. Rather than patching torch, :func:`enable` turns timm's own switch off
and checkpoints the same blocks in place with :func:`stateremat.torch.apply_plan` (each block's
buffers declared; BatchNorm updated once per step; dropout and drop-path masks replayed).
While :func:`enable` is in force, timm's own ``model.set_grad_checkpointing(True)`` is refused at
that call (it would wrap stateremat's blocks in torch's checkpoint, whose replay writes their
state a second time); ``set_grad_checkpointing(False)`` is accepted, and :func:`disable` hands the
switch back to timm. :func:`checkpoint_seq` is timm's helper with the same signature, for forwards written by hand.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

from stateremat.contract import OPTIONS
from stateremat.torch import Checkpointer, apply_plan, resolve_segments

_API = "stateremat.integrations.timm"


def enable(model: nn.Module, segments: Any = None, *, preserve: str = "region", state: Any = "auto",
           granularity_bytes: int | None = None, on_undeclared: str = "raise", verify: bool = False) -> nn.Module:
    """Checkpoint ``model``'s blocks with stateremat instead of timm's ``set_grad_checkpointing``.

    Args:
        model: a timm model (any ``nn.Module`` works).
        segments: the blocks: ``None`` (the model's repeated block — a ResNet's ``layer{1..4}.{j}``,
            a ViT's ``blocks.{i}``), a pattern such as ``"stages.*.blocks.*"``, or module paths.
        preserve: an option that replays: ``"region"`` or ``"whole"``.
        state: ``"auto"`` (default: the state each block writes, found), ``"buffers"`` (each
            block's buffers) or tensors/modules.
        granularity_bytes: region journal chunk size in bytes; ``None`` (the default, as in
            :func:`stateremat.torch.checkpoint`) keeps exactly the written bytes.
        on_undeclared: ``"raise"``, ``"warn"`` or ``"declare"``.
        verify: compare recomputed saved tensors bit for bit (debugging).

    Returns:
        ``model``, its blocks checkpointed in place (names and ``state_dict`` keys unchanged) and
        timm's own checkpointing switched off (it would replay the blocks under torch's checkpoint).

    Raises:
        ValueError: no blocks found or bad segment paths (see
            :func:`stateremat.torch.resolve_segments`), a bad option (``preserve="eager"``
            included). Every argument is checked before the model changes: a refused call leaves
            timm's own checkpointing as it was.
        TypeError: a bad ``state`` entry.

    References:
        Paper §3.1 (BatchNorm statistics updated once per forward), §5.
    """
    names = resolve_segments(model, segments)
    # every option checked before the model changes (Checkpointer refuses "eager" and bad values)
    Checkpointer(state=None if state == "buffers" else state, preserve=preserve,
                 granularity_bytes=granularity_bytes, on_undeclared=on_undeclared, verify=verify)
    if hasattr(model, "set_grad_checkpointing"):
        model.__dict__.pop("set_grad_checkpointing", None)
        model.set_grad_checkpointing(False)
        # a partial, not types.MethodType (which pickles as getattr(model, '_refuse_timm_switch'), a
        # name the model lacks: pickle / torch.save of an enabled model could not be loaded)
        model.set_grad_checkpointing = functools.partial(_refuse_timm_switch, model)
    apply_plan(model, {"options": [preserve] * len(names), "segment_names": names}, state=state,
               granularity_bytes=granularity_bytes, on_undeclared=on_undeclared, verify=verify)
    return model


def _refuse_timm_switch(self: nn.Module, enable: bool = True, *args: Any, **kwargs: Any) -> None:
    """``set_grad_checkpointing`` of a model :func:`enable` checkpoints (see the module doc)."""
    if enable:
        raise ValueError(
            f"{_API}: {type(self).__name__}'s blocks are checkpointed by stateremat ({_API}.enable); timm's "
            "set_grad_checkpointing(True) would checkpoint them a second time with torch.utils.checkpoint, whose "
            "replay updates their BatchNorm statistics again (expected timm's switch to stay off, got "
            "set_grad_checkpointing(True)). Tip: leave timm's switch off (stateremat already checkpoints the "
            f"blocks), or call {_API}.disable(model) first to use timm's own checkpointing.")
    type(self).set_grad_checkpointing(self, False, *args, **kwargs)


def disable(model: nn.Module, segments: Any = None) -> nn.Module:
    """Undo :func:`enable` for the same ``segments`` and hand timm's ``set_grad_checkpointing``
    back; returns ``model``."""
    names = resolve_segments(model, segments)
    model.__dict__.pop("set_grad_checkpointing", None)
    return apply_plan(model, {"options": [OPTIONS.baseline] * len(names), "segment_names": names})


def _run(functions: list, start: int, end: int) -> Callable[[Any], Any]:
    def forward(x: Any) -> Any:
        for j in range(start, end + 1):
            x = functions[j](x)
        return x
    return forward


def checkpoint_seq(functions: Any, x: torch.Tensor, every: int = 1, flatten: bool = False, skip_last: bool = False,
                   use_reentrant: bool | None = None, *, preserve: str = "region", state: Any = "auto",
                   granularity_bytes: int | None = None, on_undeclared: str = "raise", verify: bool = False) -> Any:
    """timm's ``checkpoint_seq`` with a state transaction per chunk of ``every`` functions.

    Args:
        functions: an ``nn.Sequential`` or a list of modules/functions run in order.
        x: the input tensor.
        every: functions per checkpointed chunk (int ≥ 1).
        flatten: flatten an ``nn.Sequential`` of ``nn.Sequential`` s (timm's ResNet stages).
        skip_last: run the last function without checkpointing.
        use_reentrant: ``None``/``False`` only.
        preserve, state, granularity_bytes, on_undeclared, verify: as in :func:`enable`;
            ``state="buffers"`` declares the buffers of the modules in each chunk.

    Returns:
        The output of the last function.

    Raises:
        ValueError: ``every < 1``, ``use_reentrant=True`` or a bad option.
    """
    if use_reentrant:
        raise ValueError(f"{_API}.checkpoint_seq: use_reentrant must be False or None, got True. "
                         "Tip: drop the argument.")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"{_API}.checkpoint_seq: every must be a positive int, got {every!r}. Tip: every=1.")
    if isinstance(functions, nn.Sequential):
        functions = functions.children()
    if flatten:
        functions = [f for seq in functions for f in seq]
    functions = list(functions)
    n = len(functions) - 1 if skip_last else len(functions)
    end = -1
    for start in range(0, n, every):
        end = min(start + every - 1, n - 1)
        chunk = functions[start:end + 1]
        declared = [f for f in chunk if isinstance(f, nn.Module)] or None if state == "buffers" else state
        x = Checkpointer(state=declared, preserve=preserve, granularity_bytes=granularity_bytes,
                         on_undeclared=on_undeclared, verify=verify)(_run(functions, start, end), x)
    if skip_last:
        return _run(functions, end + 1, len(functions) - 1)(x)
    return x
