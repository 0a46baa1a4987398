"""stateremat checkpointing for Hugging Face transformers models (5.x), through their own hook.

transformers 5.x checkpoints a ``GradientCheckpointingLayer`` by calling the layer's
``_gradient_checkpointing_func(partial(forward, layer, **kwargs), *args)``; that function is set
for every such layer by ``PreTrainedModel._set_gradient_checkpointing(enable=True,
gradient_checkpointing_func=..., every_n_layers=...)`` — what ``activation_checkpointing_enable``
calls with ``torch.utils.checkpoint.checkpoint``. :func:`enable` passes a stateremat checkpoint
there instead: each layer is replayed with its buffers declared and the forward's RNG (dropout
masks replayed), as many layers as transformers would checkpoint.

The framework's own switches: after :func:`enable`, the model's ``_set_gradient_checkpointing``
(where ``gradient_checkpointing_enable``, ``activation_checkpointing_enable`` and
``Trainer(args=TrainingArguments(gradient_checkpointing=True))`` all end) keeps stateremat's
checkpoint: a later enable that passes torch's checkpoint gets stateremat's, with the torch
keywords it was given (``gradient_checkpointing_kwargs``); one that passes any other function,
``use_reentrant=True`` or ``preserve_rng_state=False`` (the replay would draw other dropout masks:
gradients silently unlike training without checkpointing) is refused at that call. transformers' own disable turns checkpointing off
and a later enable turns stateremat's back on; :func:`disable` turns it off and hands the switch
back to transformers.

KV caches: transformers itself passes ``past_key_values=None`` to a layer it checkpoints (and
logs that caching is incompatible), unless the layer class says it only reads the cache
(``_can_checkpoint_with_cache``); such a layer is checked to leave the cache unchanged. A cache
object (``DynamicCache``...) that a replayed layer would update is refused at the first forward
with an error naming it (train with ``use_cache=False``), never a shape error in backward.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch.utils.checkpoint as _tuc
from torch import nn

from stateremat.torch import Checkpointer, refuse_python_state

_API = "stateremat.integrations.transformers.enable"


def _owner(fn: Any) -> nn.Module | None:
    """The layer a checkpointed callable runs: ``partial(forward, layer, ...)``, a bound method or a module."""
    while isinstance(fn, functools.partial):
        if fn.args and isinstance(fn.args[0], nn.Module) and not isinstance(fn.func, nn.Module) \
                and getattr(fn.func, "__self__", None) is None:
            return fn.args[0]
        fn = fn.func
    if isinstance(fn, nn.Module):
        return fn
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _arguments(fn: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Every positional and keyword argument the layer receives, partials unrolled."""
    all_args, all_kwargs = list(args), dict(kwargs)
    while isinstance(fn, functools.partial):
        all_args = list(fn.args) + all_args
        all_kwargs = {**fn.keywords, **all_kwargs}
        fn = fn.func
    return tuple(all_args), all_kwargs


class StateAwareCheckpoint:
    """The ``gradient_checkpointing_func`` :func:`enable` installs (torch's call signature).

    Args:
        names: module path of each layer by ``id`` (for error messages).
        state: ``"auto"`` (default: the state the layer writes, found), ``"buffers"`` (the
            layer's buffers) or tensors/modules declared in every layer.
        **options: ``preserve``, ``granularity_bytes``, ``on_undeclared``, ``verify``.
    """

    def __init__(self, names: dict[int, str], state: Any = "auto", **options: Any) -> None:
        Checkpointer(state=None if state == "buffers" else state, **options)  # validates the options
        self.names, self.state, self.options = names, state, options

    def __call__(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        owner = _owner(function)
        if self.state == "buffers" and owner is None:
            raise TypeError(f"{_API}: cannot tell which layer {function!r} runs (expected a partial of a "
                            "layer's forward, a bound method or a module). Tip: pass state=[...] to declare "
                            "the state explicitly.")
        name = self.names.get(id(owner), type(owner).__name__) if owner is not None else repr(function)
        state = owner if self.state == "buffers" else self.state
        run = functools.partial(Checkpointer(state=state, **self.options), function, *args, **kwargs)
        reads_only = getattr(owner, "_can_checkpoint_with_cache", False)  # said to only read its cache: check
        out = refuse_python_state(_API, name, *_arguments(function, args, kwargs), run=run if reads_only else None)
        return out if reads_only else run()

    def __repr__(self) -> str:
        return f"StateAwareCheckpoint(state={self.state!r}, {self.options})"


def _hook(model: Any) -> Callable:
    hook = getattr(model, "_set_gradient_checkpointing", None)
    params = inspect.signature(hook).parameters if callable(hook) else {}
    if not getattr(model, "supports_gradient_checkpointing", False) or "gradient_checkpointing_func" not in params:
        raise TypeError(
            f"{_API}: {type(model).__name__} does not offer transformers' activation-checkpointing hook "
            "(expected a PreTrainedModel with supports_gradient_checkpointing=True and "
            "_set_gradient_checkpointing(enable, gradient_checkpointing_func, ...), as in transformers 5.x; got "
            f"supports_gradient_checkpointing={getattr(model, 'supports_gradient_checkpointing', None)!r}, "
            f"_set_gradient_checkpointing parameters {list(params)}). Tip: checkpoint its layers with "
            "stateremat.torch.auto_checkpoint(model, budget, sample=..., segments='model.layers.*').")
    return hook


def enable(model: Any, *, every_n_layers: int = 1, state: Any = "auto", preserve: str = "region",
           granularity_bytes: int | None = None, on_undeclared: str = "raise", verify: bool = False) -> Any:
    """Turn on stateremat checkpointing of a transformers model's layers (training mode only).

    Args:
        model: a ``transformers.PreTrainedModel`` whose layers support gradient checkpointing.
        every_n_layers: checkpoint every n-th layer (as transformers' ``every_n_layers``); int ≥ 1.
        state: ``"auto"`` (default: the state each layer writes, found), ``"buffers"`` (each
            layer's buffers) or tensors/modules declared in every layer.
        preserve: ``"region"`` or ``"whole"`` (see :func:`stateremat.torch.checkpoint`).
        granularity_bytes: region journal chunk size in bytes; ``None`` (the default, as in
            :func:`stateremat.torch.checkpoint`) keeps exactly the written bytes.
        on_undeclared: ``"raise"``, ``"warn"`` or ``"declare"``.
        verify: compare recomputed saved tensors with the forward's bit for bit (debugging).

    Returns:
        ``model`` (changed in place; ``model.gradient_checkpointing_disable()`` or
        :func:`disable` turns it off).

    Raises:
        TypeError: the model offers no such hook (the message names what was expected).
        ValueError: a bad option value (``preserve="eager"`` included) or ``every_n_layers``;
            every argument is checked before the model changes.
        UnsupportedError: at the first training forward, a KV cache object reached a replayed layer.

    Danger:
        transformers runs a layer's forward hooks outside the checkpoint (it checkpoints
        ``forward``, not ``__call__``); Python side effects inside ``forward`` repeat at replay
        unless guarded by :func:`stateremat.torch.is_replaying`.

    References:
        Paper §3.1 (the replay transaction), §5.
    """
    hook = _hook(model)
    if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
        raise ValueError(f"{_API}: every_n_layers must be a positive int, got {every_n_layers!r}. "
                         "Tip: 1 checkpoints every layer.")
    names = {id(m): n for n, m in model.named_modules()}
    func = StateAwareCheckpoint(names, state, preserve=preserve, granularity_bytes=granularity_bytes,
                                on_undeclared=on_undeclared, verify=verify)
    kwargs = {"every_n_layers": every_n_layers} if "every_n_layers" in inspect.signature(hook).parameters else {}
    if every_n_layers != 1 and not kwargs:
        raise ValueError(f"{_API}: this transformers version has no every_n_layers; got {every_n_layers}. "
                         "Tip: use every_n_layers=1.")
    model.__dict__.pop("_set_gradient_checkpointing", None)  # enable twice: the newest options win
    hook = _hook(model)
    hook(enable=True, gradient_checkpointing_func=func, **kwargs)
    model._stateremat_checkpoint = func
    # every later switch of transformers' (or Trainer's) ends here: keep stateremat's checkpoint; a
    # partial, not types.MethodType, which pickles as getattr(model, '_keep_stateremat') and so
    # cannot be loaded again (pickle / torch.save of an enabled model)
    model._set_gradient_checkpointing = functools.partial(_keep_stateremat, model)
    return model


def _torch_keywords(func: Any) -> dict | None:
    """The keywords of ``functools.partial(torch.utils.checkpoint.checkpoint, **kw)`` (what
    transformers builds from ``gradient_checkpointing_kwargs``), or None for any other function."""
    if func is _tuc.checkpoint:
        return {}
    if isinstance(func, functools.partial) and func.func is _tuc.checkpoint and not func.args:
        return dict(func.keywords)
    return None


def _keep_stateremat(self: Any, enable: bool = True, gradient_checkpointing_func: Callable = _tuc.checkpoint,
                     every_n_layers: int = 1) -> None:
    """The model's ``_set_gradient_checkpointing`` while :func:`enable` is in force (see the module doc)."""
    ours = self._stateremat_checkpoint
    if enable and not isinstance(gradient_checkpointing_func, StateAwareCheckpoint):
        kw = _torch_keywords(gradient_checkpointing_func)
        if kw is None or kw.get("use_reentrant"):
            got = f"use_reentrant={kw['use_reentrant']!r}" if kw else f"gradient_checkpointing_func={gradient_checkpointing_func!r}"
            raise ValueError(
                f"{_API}: {type(self).__name__}'s layers are checkpointed by stateremat (enabled by {_API}); "
                f"transformers was asked to checkpoint them with another function (expected torch's "
                f"non-reentrant checkpoint, which stateremat's replaces, got {got}). Tip: drop the option "
                "(e.g. gradient_checkpointing_kwargs / offload), or call "
                "stateremat.integrations.transformers.disable(model) first to use transformers' own.")
        if not kw.get("preserve_rng_state", True):
            raise ValueError(
                f"{_API}: {type(self).__name__}'s layers are checkpointed by stateremat, which replays each layer "
                "with the forward's random-number-generator states (dropout masks equal: gradients equal to "
                "training without checkpointing); transformers was asked for preserve_rng_state=False (expected "
                "True or nothing), with which the replay would draw other dropout masks than the forward and the "
                "gradients would differ silently from training without checkpointing. Tip: drop "
                "preserve_rng_state from gradient_checkpointing_kwargs (activation_checkpointing_kwargs), or call "
                "stateremat.integrations.transformers.disable(model) first to use torch's checkpoint with it.")
        kw.pop("use_reentrant", None)
        gradient_checkpointing_func = functools.partial(ours, **kw) if kw else ours
    type(self)._set_gradient_checkpointing(self, enable=enable, gradient_checkpointing_func=gradient_checkpointing_func,
                                           every_n_layers=every_n_layers)


def disable(model: Any) -> Any:
    """Turn checkpointing of ``model``'s layers off again and hand transformers' switch back
    (its later ``gradient_checkpointing_enable`` uses torch's checkpoint); returns ``model``."""
    model.__dict__.pop("_set_gradient_checkpointing", None)
    model.__dict__.pop("_stateremat_checkpoint", None)
    _hook(model)(enable=False)
    return model
