"""Marking: the tensors of a journaled storage carry a write handler, nothing else pays.

A region journal must see every in-place write to its storage (R6) — inside a segment, in an
eager part of the model, in an optimizer step — but ops that touch no declared state should
run at full speed. So instead of a dispatch mode over every op, the declared tensors of a
journaled storage are *marked*: their class is swapped, for as long as the journal lives, to
a subclass whose ``__torch_function__`` runs the call under :class:`~._mode.WriteMode`, which
sees the ATen ops and their write annotations. Views and other aliases a marked call returns
are marked too, so ``queue[ptr:ptr + n].copy_(keys)`` is seen. When the journal is dropped,
every marked tensor gets its class back; pickling and ``deepcopy`` see the original class.

Danger:
    Writes through an alias created *before* the mark (a view taken earlier) bypass the
    handler; they still bump the shared version counter, which the journal reports as a gap
    (R8), except for kernels that write without a version bump (``native_batch_norm``'s running
    statistics given such an alias).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch import nn

from ._compat import (
    PLAIN_TENSOR_TYPES,
    DisableTorchFunctionSubclass,
    as_eager_class,
    dtensor_of,
    eager_only,
    has_storage,
    torch_function_kind,
)
from ._errors import UnsupportedError
from ._mode import WriteMode, direct_writes, run_direct
from ._runtime import ON_FORGET
from ._storage import storage_key

#: id(marked tensor) -> its DeclaredStorage.
_OWNER: dict[int, Any] = {}


class _Delegating(threading.local):
    depth = 0  # a user __torch_function__ runs under _delegate's write mode on this thread


_DELEGATING = _Delegating()

_QUIET = {
    *(getattr(torch.Tensor, n).__get__ for n in (
        "shape", "dtype", "device", "requires_grad", "is_leaf", "grad_fn", "layout", "ndim", "_version",
        "is_cuda", "is_meta", "is_sparse", "is_quantized", "is_nested", "output_nr", "itemsize", "nbytes")
      if hasattr(torch.Tensor, n)),
    *(getattr(torch.Tensor, n) for n in (
        "size", "dim", "numel", "stride", "storage_offset", "element_size", "is_contiguous", "data_ptr",
        "untyped_storage", "is_floating_point", "is_complex", "nelement", "ndimension", "get_device",
        "__len__", "__hash__", "__format__", "__repr__", "__bool__", "item", "tolist")),
}
_AS_BASE = {torch.Tensor.__deepcopy__, torch.Tensor.__reduce_ex__}


def _handler(cls: type, func: Any, types: tuple, args: tuple = (), kwargs: dict | None = None) -> Any:
    if kwargs is None:
        kwargs = {}
    if func in _QUIET:  # metadata: no write, no alias
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    if len(types) == 1:  # only marked tensors of one class: the common case
        return _handle(func, args, kwargs, _BASE_OF.get(cls, cls))
    return _as_eager_dispatch(func, types, args, kwargs)


#: types tuple -> _eager_order of it (a BatchNorm call meets the same Parameter/marked pair every step)
_ORDERS: dict[tuple, tuple[type, ...]] = {}


def _eager_order(types: tuple) -> tuple[type, ...]:
    """The classes whose ``__torch_function__`` eager would try, in its order: marked classes
    replaced by their own, ``Tensor`` and classes with torch functions disabled (``Parameter``)
    dropped, a subclass before its superclasses, otherwise in argument order."""
    order = _ORDERS.get(types)
    if order is None:
        order = _ORDERS[types] = tuple(_order(types))
    return order


def _order(types: tuple) -> list[type]:
    order: list[type] = []
    for t in types:
        t = _BASE_OF.get(t, t)
        if t is torch.Tensor or t in order or torch_function_kind(t) == "disabled":
            continue
        at = next((i for i, u in enumerate(order) if issubclass(t, u)), len(order))
        order.insert(at, t)
    return order


def _as_eager_dispatch(func: Any, types: tuple, args: tuple, kwargs: dict) -> Any:
    """Marked tensors met other tensor subclasses: run the ``__torch_function__`` protocol over
    the classes eager would see (the unmarked ones). A class with torch's default handler takes
    the call if it is a subclass of every other (its results get its class); a class with its
    own handler is called, with writes to declared storages seen at the dispatch level (its
    handler runs the op with subclass torch functions off, past the marks); NotImplemented
    passes to the next, and ``TypeError`` when none takes it, as in eager.

    Raises:
        TypeError: no class implements ``func`` for these types (eager raises the same).
    """
    order = _eager_order(types)
    if not order:
        return _handle(func, args, kwargs, torch.Tensor)
    for c in order:
        if torch_function_kind(c) == "default":
            if all(issubclass(c, t) for t in order):
                return _handle(func, args, kwargs, c)
            continue
        out = _delegate(c, func, order, args, kwargs)
        if out is not NotImplemented:
            return out
    raise TypeError(f"no implementation found for '{getattr(func, '__qualname__', func)}' on types that "
                    f"implement __torch_function__: {order}")


@eager_only
def _delegate(c: type, func: Any, types: tuple, args: tuple, kwargs: dict) -> Any:
    """Call ``c``'s own ``__torch_function__`` with the writes it makes to declared storages seen."""
    known: dict = {}
    with DisableTorchFunctionSubclass():
        _collect(args, known)
        if kwargs:
            _collect(kwargs.values(), known)
    _DELEGATING.depth += 1
    try:
        with WriteMode(known):
            out = c.__torch_function__(func, types, args, kwargs)
    finally:
        _DELEGATING.depth -= 1
    if out is not NotImplemented:
        with DisableTorchFunctionSubclass():
            _mark_aliases(out, known)
    return out


@eager_only
def _handle(func: Any, args: tuple, kwargs: dict, base: type = torch.Tensor) -> Any:
    """Run ``func`` on marked tensors: writes to declared storages reach ``on_write``; results
    get the class eager gives them (``base``: the unmarked class), and aliases of a declared
    storage are marked."""
    with DisableTorchFunctionSubclass():
        if func in _AS_BASE:
            return _as_base(func, args, kwargs)
        known: dict = {}
        _collect(args, known)
        if kwargs:
            _collect(kwargs.values(), known)
        if not known or _DELEGATING.depth:  # (a delegate's write mode sees these writes already)
            out = as_eager_class(func(*args, **kwargs), func, base)
            _mark_aliases(out, known)
            return out
        direct = direct_writes(func, args, kwargs)
        if direct is not None:  # writes known up front: no dispatch mode
            out = run_direct(known, *direct, func, args, kwargs)
        else:
            with WriteMode(known):
                out = func(*args, **kwargs)
        out = as_eager_class(out, func, base)
        _mark_aliases(out, known)
        return out


def _collect(values: Any, known: dict) -> None:
    for a in values:
        if type(a) in _BASE_OF:
            st = _OWNER.get(id(a))
            if st is not None:
                known[st.key] = st
        elif type(a) in (list, tuple):
            for x in a:
                if type(x) in _BASE_OF:
                    st = _OWNER.get(id(x))
                    if st is not None:
                        known[st.key] = st


def _mark_aliases(out: Any, known: dict) -> None:
    outs = out if type(out) in (tuple, list) else (out,)
    for o in outs:
        if isinstance(o, torch.Tensor) and type(o) in _MARKED_OF and has_storage(o):
            st = known.get(storage_key(o))
            if st is not None:
                mark_tensor(o, st)


def _as_base(func: Any, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    cls = type(t)
    t.__class__ = _BASE_OF[cls]
    try:
        return func(*args, **kwargs)
    finally:
        t.__class__ = cls


class _MarkedTensor(torch.Tensor):
    """A ``torch.Tensor`` on a journaled declared storage (class swapped in place)."""

    __torch_function__ = classmethod(_handler)  # type: ignore[assignment]


class _MarkedParameter(nn.Parameter):
    """An ``nn.Parameter`` on a journaled declared storage (class swapped in place)."""

    __torch_function__ = classmethod(_handler)  # type: ignore[assignment]


_MARKED_OF: dict[type, type] = {torch.Tensor: _MarkedTensor, nn.Parameter: _MarkedParameter}
_BASE_OF: dict[type, type] = {v: k for k, v in _MARKED_OF.items()}
PLAIN_TENSOR_TYPES.update(_BASE_OF)


def _marked_subclass(cls: type) -> type | None:
    """A marked class for a user subclass of Tensor/Parameter that keeps torch's ``__torch_function__``."""
    plain = isinstance(cls, type) and issubclass(cls, torch.Tensor) and torch_function_kind(cls) != "own"
    if not plain or "__slots__" in vars(cls):
        return None  # a subclass with its own __torch_function__: every op is watched instead (StrictMode)
    try:
        marked = type(f"_Marked{cls.__name__}", (cls,), {"__torch_function__": classmethod(_handler),
                                                         "__module__": __name__})
    except Exception:  # its __init_subclass__ refuses a subclass (a required keyword, a registry)
        return None
    _MARKED_OF[cls], _BASE_OF[marked] = marked, cls
    return marked


def is_marked(t: torch.Tensor) -> bool:
    """True if ``t`` currently carries the write handler."""
    return type(t) in _BASE_OF


def mark_tensor(t: torch.Tensor, st: Any) -> bool:
    """Mark ``t`` as a tensor of declared storage ``st``; False if its class cannot be marked.

    Raises:
        UnsupportedError: ``t`` is already marked for another runtime's storage (the same
            tensor declared by segments running on two threads).
    """
    wrapper = dtensor_of(t)
    if wrapper is not None:
        # A DTensor's local shard: the DTensor's dispatch writes it below __torch_function__ and
        # bumps only the DTensor's version. Not markable: its writes are watched by StrictMode
        # (which maps a written DTensor to its shard), and the DTensor's version is a witness (an
        # unseen write is a gap, R8).
        st.add_witness(wrapper, st.names.get(id(t), st.name()))
        return False
    cls = type(t)
    if cls in _BASE_OF:
        owner = _OWNER.get(id(t))
        if owner is st or owner is None:
            _OWNER[id(t)] = st
            return True
        if owner.rt is st.rt:
            if owner.key != st.key:  # the same thread: the tensor moved to another storage (.data =, set_)
                _OWNER[id(t)] = st
                st.marks.append((id(t), weakref.ref(t)))
            return True
        raise UnsupportedError(
            f"stateremat.torch: declared state {st.name()!r} is declared by checkpointed segments running on two "
            "threads at once (expected each thread to declare its own tensors, got one tensor in two "
            "runtimes; the write handler of a declared tensor belongs to one thread, whichever preserver "
            "keeps it). Tip: give each thread its own copy of the model (copy.deepcopy(model)), or leave a "
            "tensor the segments only read out of state=...; concurrent mutation from other threads is out "
            "of scope."
        )
    marked = _MARKED_OF.get(cls) or _marked_subclass(cls)
    if marked is None:
        return False
    t.__class__ = marked
    _OWNER[id(t)] = st
    st.marks.append((id(t), weakref.ref(t)))
    return True


def mark_storage(st: Any) -> None:
    """Mark the declared tensors on storage ``st`` (its witnesses that live on it)."""
    for t in list(st.witnesses.values()):
        with DisableTorchFunctionSubclass():
            on_it = has_storage(t) and storage_key(t) == st.key
        if on_it and not mark_tensor(t, st):
            st.unmarkable = True


def unmark_storage(st: Any) -> None:
    """Give every tensor marked for ``st`` its class back."""
    for i, ref in st.marks:
        t = ref()
        if _OWNER.get(i) is st:
            del _OWNER[i]
            if t is not None and type(t) in _BASE_OF:
                t.__class__ = _BASE_OF[type(t)]
    st.marks.clear()


ON_FORGET.append(unmark_storage)  # the runtime forgets a storage: its tensors get their class back
