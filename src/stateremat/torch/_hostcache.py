"""Host-side objects that live across steps: the ``uint8`` byte views of small declared storages.

A segment declaring a BatchNorm builds one :class:`~._runtime.DeclaredStorage` per buffer, and
each makes a ``uint8`` view of every byte of its storage (:func:`~._storage.flat_bytes`, about
5 µs on the host, paid per storage per segment, 9 per ResNet block). The storage objects
themselves cannot outlive their segments (their witnesses and journals are per use), but the byte
view can: :func:`flat_of` keeps it per declared tensor and hands it back while it still covers
exactly the bytes the tensor's storage has now.

Why a cached view cannot be stale: a hit needs (checked on every call) the same tensor object
(a weak reference, dropped with the tensor), the view's storage at the tensor's storage's data
pointer, on its device, with its byte count. The view shares its ``StorageImpl`` with the
storage it was made from, so a ``resize_`` that moves or grows that storage moves the view's
pointer or count too (a miss), and ``.data =`` / ``set_`` / a replaced buffer give the tensor
another storage (another pointer, or another count: a miss); two storages at one pointer with one
count on one device are the same bytes, which is all the view is used for (copies in and out,
bumping no version). dtype and shape do not enter: the view is of bytes. Only storages of at most
:data:`CACHED_BYTES` are cached, so the bytes a swapped-out storage is kept alive by its view
(until the tensor's next segment or its death) are bounded.
"""
from __future__ import annotations

import weakref

import torch

from ._storage import flat_bytes

#: Storages up to this size (bytes) keep their byte view across steps (the small-storage
#: threshold of ``_txn``: larger ones pay one view per segment, negligible beside their copies).
CACHED_BYTES = 1 << 14

#: id(tensor) -> (weak reference to it, its storage's byte view).
_VIEWS: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def _drop(i: int, ref: weakref.ref) -> None:
    entry = _VIEWS.get(i)
    if entry is not None and entry[0] is ref:
        del _VIEWS[i]


def flat_of(t: torch.Tensor) -> torch.Tensor:
    """``flat_bytes(t)``: a ``uint8`` view of every byte of ``t``'s storage, reused while it
    covers the same bytes (the module docstring: why a reused one is never stale)."""
    st = t.untyped_storage()
    n = st.nbytes()
    if n == 0 or n > CACHED_BYTES:
        return flat_bytes(t)
    entry = _VIEWS.get(id(t))
    if entry is not None and entry[0]() is t:
        flat = entry[1]
        fs = flat.untyped_storage()
        if fs.data_ptr() == st.data_ptr() and fs.nbytes() == n and flat.numel() == n and flat.device == t.device:
            return flat
    flat = flat_bytes(t)
    if flat.is_inference():  # (made under inference_mode: not writable outside it)
        return flat
    i = id(t)
    try:
        ref = weakref.ref(t, lambda r, i=i: _drop(i, r))
    except TypeError:  # a tensor class without weak references: no cache
        return flat
    _VIEWS[i] = (ref, flat)
    return flat


def cached_views() -> int:
    """How many byte views are cached now (tests)."""
    return len(_VIEWS)
