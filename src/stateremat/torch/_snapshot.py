"""Save and restore everything a profiling run may change: module state, gradients, RNG, optimizers."""
from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ._compat import has_storage



def _clone(v: Any) -> Any:
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


def _base(c: Any) -> type | None:
    """The builtin container class whose own methods read and write ``c``'s entries (a subclass's
    overrides bypassed: transformers' ``ACT2FN``, an ``OrderedDict`` subclass, makes an instance
    in ``__getitem__``); None for a weakref container (its own methods are the entries')."""
    for base in (OrderedDict, dict, list, set):
        if isinstance(c, base):
            return base
    return None


def _contents(c: Any) -> Any:
    """What a container holds, to put back by :func:`_put_back`: its raw entries (``(key, value)``
    pairs in order, items, members), or a weakref container's copy."""
    base = _base(c)
    if base is None:
        return copy.copy(c)
    if base is list or base is set:
        return base.copy(c)
    return [(k, dict.__getitem__(c, k)) for k in base.__iter__(c)]


def _put_back(c: Any, saved: Any) -> None:
    """Give container ``c`` the entries :func:`_contents` took, with the builtin class's own methods."""
    base = _base(c)
    if base is None:
        c.clear()
        c.update(saved)
        return
    base.clear(c)
    if base is list:
        list.extend(c, saved)
    elif base is set:
        set.update(c, saved)
    else:
        for k, v in saved:
            base.__setitem__(c, k, v)


class ModelSnapshot:
    """Every module's attributes (parameters, buffers, plain attributes, tensor contents and which
    object each name is bound to), the contents of the lists, dicts and sets and the attributes
    of the plain objects the model reaches (as :func:`~._scan.reach` follows them: the state a
    checkpointed segment of it can reach), the bytes of every tensor among them, every
    gradient, the CPU/CUDA generator states and those of generators the model holds, and the
    ``state_dict`` of the given optimizers with the parameters they step outside the model;
    :meth:`restore` puts all of it back, byte for byte, into the same tensor objects (so
    optimizers keep referring to the model's parameters).
    """

    def __init__(self, model: nn.Module, optimizers: tuple = ()) -> None:
        from ._framework import framework_objects, fsdp_unsharded_grads, reshard_units
        from ._scan import reach, weak_kind

        # FSDP2 units bound unsharded (the root after a no_grad forward): resharded, so that what is
        # saved is the sharded parameters (FSDP frees the unsharded storage), and unsharded again
        self.unsharded = reshard_units(model)
        self.fsdp_grads = fsdp_unsharded_grads(model)  # FSDP2's, while gradient sync is off
        found = reach(model, (), {})  # what a segment of the model can reach, as checkpoint sees it
        self.modules = list(model.modules())
        self.attrs = [dict(vars(m)) for m in self.modules]
        self.tables = [{k: dict(getattr(m, k)) for k in ("_parameters", "_buffers", "_modules")}
                       for m in self.modules]
        self.data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.grads: dict[int, tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = {}
        for m in self.modules:
            for v in list(m._parameters.values()) + list(m._buffers.values()) + list(vars(m).values()):
                if isinstance(v, torch.Tensor) and id(v) not in self.data:
                    self.data[id(v)] = (v, _clone(v))
            for p in m._parameters.values():
                if p is not None:
                    self.grads[id(p)] = (p, p.grad, _clone(p.grad))
        for _, v in found.tensors.values():  # inside containers and plain objects too
            if id(v) not in self.data:
                self.data[id(v)] = (v, _clone(v))
        # containers the forward may append to, plain objects whose attributes it may rebind
        # (not the parallelism framework's own bookkeeping, FSDP2's state: see _framework)
        theirs = framework_objects(self.modules)
        ours = [v for v in found.mutables if id(v) not in theirs]
        # (subclasses too; a weak mapping's or WeakSet's copy holds its referents weakly, as it does)
        kept = [(v, isinstance(v, (list, dict, set)) or weak_kind(v) in ("mapping", "set")) for v in ours]
        self.containers = [(v, _contents(v)) for v, container in kept if container]
        self.objects = [(v, dict(vars(v))) for v, container in kept if not container]  # (a weakref.proxy's referent's)
        self.generators = [(g, g.get_state()) for _, g in found.generators.values()]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.params = {id(p) for p in model.parameters()}
        self.optimizers: list[tuple[Any, dict]] = []
        for o in optimizers:
            self._add_optimizer(o)

    def _add_optimizer(self, opt: Any) -> None:
        """Save ``opt``'s state and the parameters it steps that are not the model's (a learnable
        temperature, a head kept elsewhere): profiling steps them too."""
        self.optimizers.append((opt, copy.deepcopy(opt.state_dict())))
        for g in opt.param_groups:
            for p in g["params"]:
                if isinstance(p, torch.Tensor) and id(p) not in self.data:
                    self.data[id(p)] = (p, _clone(p))
                    self.grads[id(p)] = (p, p.grad, _clone(p.grad))

    @contextlib.contextmanager
    def watching_optimizers(self, found: Callable[[Any], None] = lambda opt: None) -> Iterator[None]:
        """While open, an optimizer that steps one of the model's parameters and was not given is
        saved just before its first step (so :meth:`restore` puts its state back too, and the
        values of the parameters it steps outside the model; their gradients as they were at that
        first step) and passed to ``found``. Uses torch's global optimizer step pre-hook (public
        ``torch.optim`` API)."""
        seen = {id(o) for o, _ in self.optimizers}

        def pre_step(opt: Any, args: Any, kwargs: Any) -> None:
            if id(opt) in seen:
                return
            seen.add(id(opt))
            if any(id(p) in self.params for g in opt.param_groups for p in g["params"]):
                self._add_optimizer(opt)
                found(opt)

        handle = register_optimizer_step_pre_hook(pre_step)
        try:
            yield
        finally:
            handle.remove()

    @torch.no_grad()
    def restore(self) -> None:
        """Put every saved binding, byte, gradient, generator state and optimizer state back (a
        parameter slot FSDP2 rebinds stays as FSDP2 has it, see _framework)."""
        from ._framework import framework_swap, restore_unsharded_grads, unshard_units

        for m, attrs, tables in zip(self.modules, self.attrs, self.tables):
            for k in set(vars(m)) - set(attrs):
                delattr(m, k)
            vars(m).update(attrs)
            for k, table in tables.items():
                now = getattr(m, k)
                keep = {n: v for n, v in now.items() if framework_swap(k, table.get(n), v)}
                now.clear()
                now.update(table)
                now.update(keep)
        for t, saved in self.data.values():
            if t.numel() and has_storage(t) and not t.untyped_storage().nbytes():
                continue  # storage a framework freed (FSDP2's unsharded parameter): FSDP2 refills it
            if t.shape != saved.shape:
                t.data = saved.clone()
            else:
                t.copy_(saved)
        for p, grad, saved in self.grads.values():
            if grad is not None and grad.shape == saved.shape:
                grad.copy_(saved)
            p.grad = grad
        for obj, saved in self.containers:
            _put_back(obj, saved)
        for obj, saved in self.objects:
            for k in set(vars(obj)) - set(saved):
                delattr(obj, k)
            vars(obj).update(saved)
        for g, state in self.generators:
            g.set_state(state)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        for opt, state in self.optimizers:
            opt.load_state_dict(copy.deepcopy(state))
        restore_unsharded_grads(self.fsdp_grads)
        unshard_units(self.unsharded)
