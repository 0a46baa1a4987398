"""``checkpoint_sequential``: torch's helper with a state transaction per chunk (§3.1)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


from ._preserve import PRESERVERS
from ._wrap import SEGMENT_OPTIONS, segment_call


def _run(chunk: list) -> Any:
    def forward(x: Any) -> Any:
        for f in chunk:
            x = f(x)
        return x
    return forward


def checkpoint_sequential(functions: Any, segments: int, input: Any, use_reentrant: bool | None = None,
                          **kwargs: Any) -> Any:
    """Run ``functions`` in ``segments`` chunks, each but the last checkpointed transactionally.

    Same signature and chunking as ``torch.utils.checkpoint.checkpoint_sequential``; each
    checkpointed chunk declares the buffers of the modules in it (BatchNorm statistics are then
    updated once per step, not once more by the replay) and replays with the forward's RNG.

    Args:
        functions: an ``nn.Sequential`` or a list of modules/functions run in order.
        segments: number of chunks (int ≥ 1); the last chunk runs without checkpointing.
        input: the input of the first function (a tensor of any shape and dtype).
        use_reentrant: ``None``/``False`` only (the non-reentrant implementation).
        **kwargs: ``preserve`` (an option name that replays, default ``"region"``), ``state``
            (``"auto"``, the default — what each chunk writes, found —, ``"buffers"`` — each chunk's
            modules' buffers — or tensors/modules declared in every chunk), ``granularity_bytes`` (bytes), ``on_undeclared``, ``verify``,
            ``preserve_rng_state``.

    Returns:
        The output of the last function.

    Raises:
        ValueError: ``segments`` is not a positive int, ``use_reentrant=True``, or ``preserve`` is
            not an option that replays.
        TypeError: an unknown keyword.
        ReplayError: as :func:`stateremat.torch.checkpoint`.

    References:
        Paper §3.1; ``torch.utils.checkpoint.checkpoint_sequential``.
    """
    if use_reentrant:
        raise ValueError("stateremat.torch.checkpoint_sequential: use_reentrant must be False or None: it is "
                         "only supported when use_reentrant=False (got True). Tip: drop the argument.")
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"stateremat.torch.checkpoint_sequential: segments must be a positive int, got "
                         f"{segments!r}. Tip: segments=2 checkpoints the first half.")
    preserve = kwargs.pop("preserve", "region")
    unknown = sorted(set(kwargs) - set(SEGMENT_OPTIONS))
    if unknown:
        raise TypeError(f"stateremat.torch.checkpoint_sequential: unexpected keyword(s) {unknown}; expected "
                        f"preserve or {list(SEGMENT_OPTIONS)}. Tip: check the spelling.")
    if preserve not in PRESERVERS:  # (the engines of the options that replay, as checkpoint checks)
        raise ValueError(f"stateremat.torch.checkpoint_sequential: preserve must name an option that replays "
                         f"({list(PRESERVERS)}), got {preserve!r}. "
                         "Tip: 'region' journals only the bytes written.")
    state = kwargs.pop("state", "auto")
    # (iterating an nn.Sequential gives every position, a module repeated in it included; its
    # children() lists such a module once, which would run it once: torch's own function does so)
    functions = list(functions)
    if segments > len(functions):
        raise ValueError(f"stateremat.torch.checkpoint_sequential: segments={segments} exceeds the number of "
                         f"functions ({len(functions)}); each segment needs at least one. Tip: segments <= "
                         f"{max(1, len(functions))}.")
    size = len(functions) // segments
    end = -1
    x = input
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        chunk = functions[start:end + 1]
        declared = [f for f in chunk if isinstance(f, nn.Module)] if state == "buffers" else state
        if torch.is_grad_enabled():
            x = segment_call(preserve, declared or None, kwargs)(_run(chunk), x)
        else:
            x = _run(chunk)(x)
    return _run(functions[end + 1:])(x)
