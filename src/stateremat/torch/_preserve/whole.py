"""``whole``: a snapshot of every byte of the declared storage when the forward begins (R2).

Every byte, not only the declared views' extent: an alias outside it (``base[4:]`` of a
declared ``base[:4]``) may be read and written too. No write needs watching: the snapshot is
``B0`` whatever happens to the storage later, and the visible bytes set aside at a replay's
start cover every byte a replay can change.
"""
from __future__ import annotations

import numpy as np
import torch

from .._compat import library_ops
from ._base import Preserver, Restored


class WholePreserver(Preserver):
    """Whole snapshot of one declared storage (paper Table 1, "whole checkpoint")."""

    name = "whole"
    captures_replay_writes = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.snapshot: torch.Tensor | None = None

    def begin(self) -> None:
        self.snapshot = self.storage.snapshot()
        self.storage.rt.counters.hold(self.name, self.storage.nbytes)

    def restore(self, segment_name: str) -> Restored:
        st = self.storage
        visible = st.snapshot()
        with library_ops():
            st.flat.copy_(self.snapshot)
        return Restored(np.array([[0, st.nbytes]], dtype=np.int64), visible)

    def reinstate(self, restored: Restored) -> None:
        with library_ops():
            self.storage.flat.copy_(restored.visible)

    def release(self) -> None:
        if self.owned and self.snapshot is not None:
            self.storage.rt.counters.hold(self.name, -self.storage.nbytes)
        self.snapshot = None

    def adopt(self, segment_id: int) -> "WholePreserver":
        p = WholePreserver(self.storage, segment_id, self.granularity_bytes, owned=False)
        p.snapshot, p.names = self.snapshot, list(self.names)
        return p

    @property
    def retained_bytes(self) -> int:
        return self.storage.nbytes if self.owned and self.snapshot is not None else 0
