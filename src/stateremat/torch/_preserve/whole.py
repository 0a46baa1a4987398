"""``whole``: a snapshot of every byte of the declared storage when the forward begins (R2).

Every byte, not only the declared views' extent: an alias outside it (``base[4:]`` of a
declared ``base[:4]``) may be read and written too. No write needs watching: the snapshot is
``B0`` whatever happens to the storage later, and the visible bytes set aside at a replay's
start cover every byte a replay can change.
"""
from __future__ import annotations

from typing import Iterable

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


#: Whole snapshots of storages up to this size (bytes) are copied in batches: one ``cat`` for
#: the snapshots of a transaction, one ``cat`` and one ``_foreach_copy_`` for its restores, one
#: ``_foreach_copy_`` for its reinstatements (per device), instead of one clone or ``copy_`` and
#: its Python per storage (a BatchNorm's three buffers are 3 x 4 tiny copies per segment).
BATCHED_BYTES = 1 << 14


def _batches(ps: Iterable[Preserver]) -> tuple[dict[torch.device, list[WholePreserver]], list[Preserver]]:
    """Whole preservers of small storages by device (only groups of two or more), and the rest."""
    groups: dict[torch.device, list[WholePreserver]] = {}
    rest: list[Preserver] = []
    for p in ps:
        if type(p) is WholePreserver and p.storage.nbytes <= BATCHED_BYTES:
            groups.setdefault(p.storage.flat.device, []).append(p)
        else:
            rest.append(p)
    for dev in [d for d, g in groups.items() if len(g) < 2]:
        rest.extend(groups.pop(dev))
    return groups, rest


def begin_all(ps: Iterable[Preserver]) -> None:
    """:meth:`Preserver.begin` of each of ``ps``, small whole snapshots copied in one ``cat`` per
    device (each preserver's snapshot is its slice of the batch: the batch lives as long as one
    of them, at most :data:`BATCHED_BYTES` per storage)."""
    groups, rest = _batches(ps)
    with library_ops():
        for g in groups.values():
            flats = [p.storage.flat for p in g]
            snaps = torch.cat(flats).split([f.numel() for f in flats])
            for p, s in zip(g, snaps):
                p.snapshot = s
                p.storage.rt.counters.hold(p.name, p.storage.nbytes)
    for p in rest:
        p.begin()


def restore_all(ps: Iterable[Preserver], segment_name: str) -> list[tuple[Preserver, Restored]]:
    """:meth:`Preserver.restore` of each of ``ps`` (those that changed something, with what they
    return); the others first (a region journal's refusal, R8, then leaves the batched ones
    untouched), then the small whole ones batched per device.

    Raises:
        ReplayError: a preserver cannot reconstruct ``B0`` (R8).
    """
    groups, rest = _batches(ps)
    out: list[tuple[Preserver, Restored]] = []
    with library_ops():
        for p in rest:
            r = p.restore(segment_name)
            if r is not None:
                out.append((p, r))
        for g in groups.values():
            flats = [p.storage.flat for p in g]
            sizes = [f.numel() for f in flats]
            visible = torch.cat(flats).split(sizes)
            torch._foreach_copy_(flats, [p.snapshot for p in g])
            out.extend((p, Restored(np.array([[0, n]], dtype=np.int64), v)) for p, n, v in zip(g, sizes, visible))
    return out


def reinstate_all(restored: list[tuple[Preserver, Restored]]) -> None:
    """:meth:`Preserver.reinstate` of each pair :func:`restore_all` returned, the small whole
    ones in one ``_foreach_copy_`` per device."""
    groups, rest = _batches(p for p, _ in restored)
    visible = {id(p): r for p, r in restored}
    with library_ops():
        for p in rest:
            p.reinstate(visible[id(p)])
        for g in groups.values():
            torch._foreach_copy_([p.storage.flat for p in g], [visible[id(p)].visible for p in g])
