"""One training step of a user's model, from a step function or a sample batch."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch import nn

from ._compat import tree_flatten

_API = "stateremat.torch"


def default_loss(out: Any) -> torch.Tensor:
    """The loss of a model output: its ``.loss`` if set (transformers), else the mean of its first
    floating-point tensor that requires grad.

    Raises:
        ValueError: no such tensor in ``out``.
    """
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    for t in tree_flatten(out.to_tuple() if hasattr(out, "to_tuple") else out)[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            return t.mean()
    raise ValueError(f"{_API}: the model's output ({type(out).__name__}) has no floating-point tensor that "
                     "requires grad to take a loss from. Tip: pass a step function, "
                     "step_fn(model) -> runs forward, loss.backward() and the optimizer step.")


def _call(model: nn.Module, sample: Any) -> Any:
    if isinstance(sample, torch.Tensor):
        return model(sample)
    if isinstance(sample, Mapping):
        return model(**sample)
    if isinstance(sample, (tuple, list)):
        return model(*sample)
    raise TypeError(f"{_API}: sample must be a tensor, a tuple of positional arguments or a dict of keyword "
                    f"arguments, got {type(sample).__name__}. Tip: or pass step_fn(model).")


def make_step(model: nn.Module, step: Any) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    """``(run, inputs)``: ``run()`` performs one full training step; ``inputs`` are the sample's tensors.

    Args:
        model: the model.
        step: a step function ``step_fn(model)`` that runs forward, backward (and the optimizer
            step, if any) — the tensors it captures (:func:`captured_tensors`) are its inputs —
            or a sample: a tensor, a tuple of positional arguments or a dict of
            keyword arguments, for which a step is ``default_loss(model(sample)).backward()``.

    Raises:
        TypeError: ``step`` is neither.
    """
    if step is None:
        raise TypeError(f"{_API}: expected a step function step_fn(model) or a sample batch, got None. "
                        "Tip: profile(model, segments, sample_batch).")
    if callable(step) and not isinstance(step, (torch.Tensor, nn.Module)):
        return (lambda: step(model)), captured_tensors(step)
    if not isinstance(step, (torch.Tensor, Mapping, tuple, list)):
        _call(model, step)  # raises the TypeError naming what a sample may be
    _check_sample(step, 0, [])  # before flattening it: a sample that contains itself recurses

    def run() -> Any:
        loss = default_loss(_call(model, step))
        loss.backward()
        return loss.detach()

    return run, [t for t in tree_flatten(step)[0] if isinstance(t, torch.Tensor)]


#: Nesting levels of tuples, lists and dicts accepted in a sample batch.
MAX_SAMPLE_DEPTH = 100


#: At most this many leaves (counted with repeats: a list held twice counts twice) in a sample:
#: torch flattens a sample leaf by leaf, so a few shared lists nested 30 deep would be 2**30.
MAX_SAMPLE_LEAVES = 1_000_000


def _too_deep() -> ValueError:
    return ValueError(f"{_API}: the sample is nested more than {MAX_SAMPLE_DEPTH} levels deep; expected "
                      "a tensor, a tuple of positional arguments or a dict of keyword arguments. "
                      "Tip: pass the batch itself, or a step function step_fn(model).")


def _check_sample(obj: Any, depth: int, path: list[int], done: dict[int, tuple[int, int]] | None = None
                  ) -> tuple[int, int]:
    """Refuse a sample whose tuples, lists or dicts contain themselves, nest deeper than
    :data:`MAX_SAMPLE_DEPTH` or hold more than :data:`MAX_SAMPLE_LEAVES` leaves (``path``: ids of
    the containers above ``obj``; ``done``: ``id -> (height, leaves)`` of containers checked,
    so a container shared many times is walked once). Returns ``obj``'s (height, leaves)."""
    if not isinstance(obj, (Mapping, tuple, list)):
        return 0, 1
    done = {} if done is None else done
    if id(obj) in path:
        raise ValueError(f"{_API}: the sample contains itself (a {type(obj).__name__} inside itself); "
                         "expected a tensor, a tuple of positional arguments or a dict of keyword "
                         "arguments. Tip: pass the batch itself, or a step function step_fn(model).")
    if id(obj) not in done:
        if depth > MAX_SAMPLE_DEPTH:
            raise _too_deep()
        path.append(id(obj))
        below = [_check_sample(x, depth + 1, path, done)
                 for x in (obj.values() if isinstance(obj, Mapping) else obj)]
        path.pop()
        done[id(obj)] = (1 + max((h for h, _ in below), default=0), sum(n for _, n in below))
    height, leaves = done[id(obj)]
    if depth + height - 1 > MAX_SAMPLE_DEPTH:  # its deepest container, reached from here
        raise _too_deep()
    if leaves > MAX_SAMPLE_LEAVES:
        raise ValueError(f"{_API}: the sample holds more than {MAX_SAMPLE_LEAVES:,} leaves (counting a "
                         "list or dict once per place it is held); expected a tensor, a tuple of "
                         "positional arguments or a dict of keyword arguments. Tip: pass the batch "
                         "itself, or a step function step_fn(model).")
    return height, leaves


def captured_tensors(fn: Any) -> list[torch.Tensor]:
    """Tensors a step function reaches without arguments: its closure cells and the globals it
    names (one level into tuples, lists and dicts) — typically its batch."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    values = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    glb = getattr(fn, "__globals__", {})
    values += [glb[n] for n in code.co_names if n in glb]
    out = []
    for v in values:
        items = list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, (tuple, list)) else [v]
        out += [t for t in items if isinstance(t, torch.Tensor)]
    return out


def model_device(model: nn.Module, device: Any = None, api: str = "stateremat.torch.profile") -> torch.device:
    """``device`` if given, else the device of the model's first parameter or buffer (CPU if none).

    Raises:
        TypeError: ``device`` is neither a ``torch.device``, a string nor an int.
        ValueError: ``device`` names no device, one that is neither CPU nor CUDA (memory is
            measured only there), or CUDA on a machine without it.
    """
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, (torch.device, str, int)):
            raise TypeError(f"{api}: device must be a torch.device, a name such as 'cpu' or 'cuda:0', or a CUDA "
                            f"index, got {type(device).__name__}. Tip: leave device=None to use the model's.")
        try:
            d = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"{api}: device {device!r} is not a device this torch can use ({e}). Tip: 'cpu', "
                             "'cuda' or 'cuda:0', or leave device=None to use the model's.") from None
        if d.type not in ("cpu", "cuda"):
            raise ValueError(f"{api}: device {str(d)!r} is not supported (expected cpu or cuda: memory is measured "
                             "there). Tip: move the model to cpu or cuda and leave device=None.")
        if d.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{api}: device {str(d)!r} asked for, but this torch sees no CUDA device. Tip: "
                             "device='cpu', or leave device=None to use the model's.")
        return d
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    """Wait for queued device work (wall time is synchronized on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
