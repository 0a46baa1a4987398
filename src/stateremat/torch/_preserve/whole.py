"""``whole``: a snapshot of every byte of the declared storage when the forward begins (R2).

Every byte, not only the declared views' extent: an alias outside it (``base[4:]`` of a
declared ``base[:4]``) may be read and written too. No write needs watching: the snapshot is
``B0`` whatever happens to the storage later, and the visible bytes set aside at a replay's
start cover every byte a replay can change.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from .._compat import library_ops
from ._base import Preserver, Restored

#: CPU storages from this size on are copied into reused buffers: a fresh allocation of that size
#: is new pages the copy faults in (about 1.5 GB/s against 8 GB/s into warm memory, issue 26),
#: while smaller ones come from the allocator's free lists and a pool would cost more Python than
#: it saves. Device allocators cache blocks already.
POOL_MIN_BYTES = 1 << 18
#: Spare buffers kept per size (a segment holds a snapshot and, during its replay, the visible bytes).
_POOL_SPARES = 2


class _Pool(threading.local):
    def __init__(self) -> None:
        self.spare: dict[tuple[str, int], list[torch.Tensor]] = {}


_POOL = _Pool()


def _pooled(flat: torch.Tensor) -> bool:
    return flat.device.type == "cpu" and flat.numel() >= POOL_MIN_BYTES


def copy_of(flat: torch.Tensor) -> torch.Tensor:
    """A copy of every byte of ``flat`` (one copy), into a reused buffer where :data:`POOL_MIN_BYTES` says."""
    with library_ops():
        if not _pooled(flat):
            return flat.clone()
        spare = _POOL.spare.get((str(flat.device), flat.numel()))
        buf = spare.pop() if spare else torch.empty_like(flat)
        return buf.copy_(flat)


def give_back(buf: torch.Tensor) -> None:
    """``buf`` (from :func:`copy_of`) is no longer used by anyone: keep it for the next copy."""
    if _pooled(buf):
        spare = _POOL.spare.setdefault((str(buf.device), buf.numel()), [])
        if len(spare) < _POOL_SPARES:
            spare.append(buf)


class WholePreserver(Preserver):
    """Whole snapshot of one declared storage (paper Table 1, "whole checkpoint")."""

    name = "whole"
    captures_replay_writes = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.snapshot: torch.Tensor | None = None
        self._users = [1]  # preservers sharing the snapshot (adoption): the last to release frees it

    # One copy each: the snapshot (begin), the visible bytes set aside and B0 put back (restore),
    # the visible bytes put back (reinstate); large CPU storages copy into reused buffers.
    def begin(self) -> None:
        self.snapshot = copy_of(self.storage.flat)
        self.storage.rt.counters.hold(self.name, self.storage.nbytes)

    def restore(self, segment_name: str) -> Restored:
        st = self.storage
        visible = copy_of(st.flat)
        with library_ops():
            st.flat.copy_(self.snapshot)
        return Restored(np.array([[0, st.nbytes]], dtype=np.int64), visible)

    def reinstate(self, restored: Restored) -> None:
        with library_ops():
            self.storage.flat.copy_(restored.visible)
        give_back(restored.visible)

    def release(self) -> None:
        snap, self.snapshot = self.snapshot, None
        if snap is None:
            return
        if self.owned:
            self.storage.rt.counters.hold(self.name, -self.storage.nbytes)
        self._users[0] -= 1
        if self._users[0] == 0:
            give_back(snap)

    def adopt(self, segment_id: int) -> "WholePreserver":
        p = WholePreserver(self.storage, segment_id, self.granularity_bytes, owned=False)
        p.snapshot, p.names, p._users = self.snapshot, list(self.names), self._users
        if self.snapshot is not None:
            self._users[0] += 1
        return p

    @property
    def retained_bytes(self) -> int:
        return self.storage.nbytes if self.owned and self.snapshot is not None else 0
