"""Checkpoint a submodule in place: its instance ``forward`` runs the class forward under an option.

``apply_plan``, ``auto_checkpoint``, the profiler and the integrations wrap a segment by setting
an instance attribute ``forward`` (a :class:`SegmentForward`) instead of replacing the module with
a wrapper module, so parameter names, ``state_dict`` keys, attribute access, module hooks
(which run outside the checkpoint, once per step) and ``isinstance`` checks are those of the
unwrapped model. ``del module.forward`` (:func:`unwrap_module`) restores it exactly.
"""
from __future__ import annotations

import types
from typing import Any, Callable

import torch
from torch import nn

from stateremat.contract import OPTIONS, RECOMPUTE_ONLY

from ._pystate import refuse_python_state

#: Keyword options of a checkpointed segment (everything but the option itself).
SEGMENT_OPTIONS = ("state", "granularity_bytes", "on_undeclared", "verify", "preserve_rng_state")


def check_segment_options(state: Any, opts: dict[str, Any], api: str = "stateremat.torch") -> None:
    """Refuse bad segment options when a plan is applied or a profile starts, not at the first
    forward: unknown keywords (``TypeError``), a bad ``state`` (:func:`check_state`: an unknown string
    such as ``"everything"`` is a ``ValueError``, a bad entry a ``TypeError``) and bad values of
    ``granularity_bytes``/``on_undeclared`` (``ValueError``)."""
    from ._checkpoint import Checkpointer, check_flag
    from ._scan import check_state

    if "preserve_rng_state" in opts:
        check_flag(api, "preserve_rng_state", opts["preserve_rng_state"])
    unknown = sorted(set(opts) - set(SEGMENT_OPTIONS))
    if unknown:
        raise TypeError(f"{api}: unknown segment option(s) {unknown}; expected a subset "
                        f"of {list(SEGMENT_OPTIONS)[1:]}. Tip: check the spelling.")
    check_state(state, api)
    Checkpointer(state=None if isinstance(state, str) else state,
                 **{k: v for k, v in opts.items() if k != "preserve_rng_state"})


def segment_call(option: str, state: Any, opts: dict[str, Any], name: str | None = None) -> Callable[..., Any] | None:
    """How a segment under ``option`` runs: a function with ``torch.utils.checkpoint.checkpoint``'s
    signature for an option that replays, ``None`` for one that does not (the baseline: its own
    forward, activations kept). The one place the wrappers ask ``OPTIONS.replays``.

    Raises:
        ValueError: ``option`` is not registered (the message names the registered options).
    """
    if not OPTIONS.replays(option):
        return None
    rng = {"preserve_rng_state": opts["preserve_rng_state"]} if "preserve_rng_state" in opts else {}
    if option == RECOMPUTE_ONLY:  # profiling only: replay with nothing preserved
        from torch.utils.checkpoint import checkpoint as torch_checkpoint

        return lambda fn, *a, **kw: torch_checkpoint(fn, *a, use_reentrant=False, **rng, **kw)
    from ._checkpoint import Checkpointer

    ckpt = Checkpointer(state=state, preserve=option, name=name,
                        **{k: v for k, v in opts.items() if k != "preserve_rng_state"})
    return (lambda fn, *a, **kw: ckpt(fn, *a, **rng, **kw)) if rng else ckpt


class SegmentForward:
    """The instance ``forward`` of a module checkpointed in place.

    Args:
        module: the segment.
        option: an option name from :data:`stateremat.contract.OPTIONS` (``"eager"`` runs the
            forward as is) or ``"recompute_only"`` (plain ``torch.utils.checkpoint``, profiling).
        name: the segment's module path (errors name it).
        state: ``"auto"`` (default: what the segment writes, found), ``"buffers"`` (every
            buffer of ``module``) or tensors/modules.
        inner: the instance ``forward`` the module had before (kept and restored on unwrap).
        **opts: ``granularity_bytes``, ``on_undeclared``, ``verify``, ``preserve_rng_state``.

    Attributes:
        probe: ``None`` or an object with ``enter(name, args, kwargs)`` and
            ``exit(name, args, kwargs, out)`` called around every forward (the profiler's).
    """

    def __init__(self, module: nn.Module, option: str, name: str, state: Any = "auto",
                 inner: Callable | None = None, **opts: Any) -> None:
        unknown = sorted(set(opts) - set(SEGMENT_OPTIONS))
        if unknown:
            raise TypeError(f"stateremat.torch: unknown segment option(s) {unknown}; expected a subset "
                            f"of {list(SEGMENT_OPTIONS)[1:]}. Tip: check the spelling.")
        self.module = module
        self.option = option
        self.name = name
        self.state = state
        self.inner = inner
        self.opts = opts
        #: the checkpoint this segment runs under, ``None`` for an option that does not replay
        self.call = segment_call(option, module if isinstance(state, str) and state == "buffers" else state,
                                 opts, name)
        self.probe: Any = None

    def original(self) -> Callable[..., Any]:
        """The forward this wrapper runs: the previous instance forward or the class's."""
        if self.inner is not None:
            return self.inner
        return types.MethodType(type(self.module).forward, self.module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fwd = self.original()
        if self.probe is not None:
            self.probe.enter(self.name, args, kwargs)
        if self.call is None or not torch.is_grad_enabled():
            out = fwd(*args, **kwargs)
        else:
            refuse_python_state("stateremat.torch.apply_plan", self.name, args, kwargs)
            out = self.call(fwd, *args, **kwargs)
        if self.probe is not None:
            self.probe.exit(self.name, args, kwargs, out)
        return out

    def __repr__(self) -> str:
        return f"SegmentForward({self.name!r}, option={self.option!r})"


def segment_forward(module: nn.Module) -> SegmentForward | None:
    """The :class:`SegmentForward` installed on ``module``, or ``None``."""
    f = module.__dict__.get("forward")
    return f if isinstance(f, SegmentForward) else None


def wrap_module(module: nn.Module, option: str, name: str, state: Any = "auto",
                **opts: Any) -> SegmentForward:
    """Install (or replace) a :class:`SegmentForward` on ``module``; returns it."""
    old = segment_forward(module)
    inner = old.inner if old is not None else module.__dict__.get("forward")
    wrapper = SegmentForward(module, option, name, state, inner, **opts)
    module.forward = wrapper  # an instance attribute: nn.Module.__setattr__ keeps it in __dict__
    return wrapper


def apply_option(module: nn.Module, option: str, name: str, state: Any = "auto",
                 **opts: Any) -> SegmentForward | None:
    """Put ``module`` under ``option`` as a plan says: a :class:`SegmentForward` where the option
    replays, its own forward (no wrapper left) where it does not; returns the wrapper or ``None``."""
    wrapper = wrap_module(module, option, name, state, **opts)
    if wrapper.call is None:
        unwrap_module(module)
        return None
    return wrapper


def unwrap_module(module: nn.Module) -> None:
    """Remove a :class:`SegmentForward` from ``module`` (its previous forward comes back)."""
    old = segment_forward(module)
    if old is None:
        return
    if old.inner is not None:
        module.forward = old.inner
    else:
        del module.forward
