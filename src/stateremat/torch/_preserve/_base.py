"""The Preserver interface: how one segment keeps ``B0`` of one declared storage (Table 1).

A segment's transaction holds one preserver per declared storage. The life of a preserver:

* :meth:`Preserver.begin` — the segment's forward begins: keep what a replay will need;
* :meth:`Preserver.before_write` (per storage, class level) — an in-place write is about to
  change the storage's bytes, inside or outside any segment (R6);
* :meth:`Preserver.restore` — a replay begins: put ``B0`` back (R2) and hand back the bytes
  that were visible, which :meth:`Preserver.reinstate` puts back after the replay (R5);
* :meth:`Preserver.release` — the segment can no longer replay: free what was kept.

Each option of :data:`stateremat.contract.OPTIONS` that replays has one implementation in
this package (``whole.py``, ``region.py``), registered in ``__init__``.
"""
from __future__ import annotations

import abc
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from .._compat import library_ops
from .._runtime import DeclaredStorage
from .._storage import scatter


class Restored(NamedTuple):
    """Bytes to reinstate after a replay: ``runs`` (shape ``(n, 2)``, byte offsets) and the
    ``uint8`` ``visible`` bytes they held before the restore."""

    runs: np.ndarray
    visible: torch.Tensor


class Preserver(abc.ABC):
    """Preservation of one declared storage for one segment.

    Args:
        storage: the declared storage.
        segment_id: the segment's id (one preserver per segment and storage).
        granularity_bytes: journal chunk size in bytes (region journals).
        owned: False when an enclosing segment adopts a nested segment's preserver: the
            nested one owns (and frees) what is kept.

    Attributes:
        name: the option name (``stateremat.contract.OPTIONS``).
        captures_replay_writes: writes during a replay must be undone explicitly (True), or
            the visible bytes returned by :meth:`restore` cover every byte (False).
    """

    name: ClassVar[str]
    captures_replay_writes: ClassVar[bool] = True

    def __init__(self, storage: DeclaredStorage, segment_id: int, granularity_bytes: int | None,
                 owned: bool = True) -> None:
        self.storage = storage
        self.segment_id = segment_id
        self.granularity_bytes = granularity_bytes
        self.owned = owned
        self.names: list[str] = []

    @abc.abstractmethod
    def begin(self) -> None:
        """The segment's forward begins: keep what :meth:`restore` will need."""

    @classmethod
    def before_write(cls, storage: DeclaredStorage, func: Any, args: tuple, kwargs: dict,
                     written: torch.Tensor) -> int:
        """``func`` is about to write ``written`` (on ``storage``); return the bytes kept for it."""
        return 0

    @abc.abstractmethod
    def restore(self, segment_name: str) -> Restored | None:
        """Put ``B0`` back for a replay; return the bytes to reinstate afterwards (None: nothing changed).

        Raises:
            ReplayError: ``B0`` cannot be reconstructed exactly (R8).
        """

    def reinstate(self, restored: Restored) -> None:
        """Put back the bytes :meth:`restore` returned (R5)."""
        with library_ops():
            scatter(self.storage.flat, restored.runs, restored.visible)

    @abc.abstractmethod
    def release(self) -> None:
        """Free what is kept; the segment can no longer replay."""

    @abc.abstractmethod
    def adopt(self, segment_id: int) -> "Preserver":
        """A preserver for an enclosing segment that shares this one's ``B0``."""

    @property
    def retained_bytes(self) -> int:
        """Bytes this preserver owns for its segment's replay (a whole snapshot). What is kept per
        write (a shared journal) is credited to the writing segment's transaction instead
        (``Transaction.credit``), under the option's name."""
        return 0
