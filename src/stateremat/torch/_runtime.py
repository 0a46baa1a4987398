"""The runtime: every piece of mutable bookkeeping of one thread, in one object.

A thread that runs checkpointed forwards owns a :class:`Runtime`: the segments whose forward
is running, the declared storages with live users (:class:`DeclaredStorage`), the sequence
numbers that order journal entries, and the preservation counters. Two threads training two
models never share one. A segment keeps a reference to the runtime it was created in, so a
replay that autograd runs on another thread (CUDA's device threads) still finds its state;
only the *replay stack* (what ``is_replaying()`` reports) belongs to the executing thread.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable

import torch

from stateremat.contract import OPTIONS

from ._compat import library_ops
from ._hostcache import flat_of
from ._storage import StorageKey


#: Called with a :class:`DeclaredStorage` nobody uses any more. ``_mark`` registers its
#: ``unmark_storage`` here when imported (it sits above this module: its write handler reaches
#: the preservers, which import this module), so the runtime never imports it.
ON_FORGET: list[Callable[["DeclaredStorage"], None]] = []


def journaled(by_option: dict[str, int]) -> int:
    """The bytes of ``by_option`` (option name -> bytes) held by options that journal."""
    return sum(v for k, v in by_option.items() if OPTIONS.journals(k))


class Counters:
    """Bytes held for preservation and replay counts of one runtime (``preservation_stats``).

    ``held`` is keyed by option name (``stateremat.contract.OPTIONS``): each preserver charges
    what it keeps under its own option, so a new option needs no new counter.
    """

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        self.live_segments = 0
        self.peak_retained = 0
        self.peak_temporary = 0
        self.recompute_count = 0

    def hold(self, option: str, n: int) -> None:
        """Charge ``n`` bytes (negative: freed) to ``option`` and update the retained peak."""
        self.held[option] = self.held.get(option, 0) + n
        self.touch()

    @property
    def journal_bytes(self) -> int:
        """Bytes held now by options that journal (``OPTIONS.journals``: region)."""
        return journaled(self.held)

    @property
    def snapshot_bytes(self) -> int:
        """Bytes held now by every other option (whole snapshots)."""
        return self.retained() - self.journal_bytes

    def retained(self) -> int:
        return sum(self.held.values())

    def touch(self) -> None:
        """Update the retained peak (after every change of held bytes)."""
        r = self.retained()
        if r > self.peak_retained:
            self.peak_retained = r


class DeclaredStorage:
    """One storage some live segment declared: its bytes, version witnesses and journal.

    Args:
        rt: the runtime that owns it.
        key: storage identity (:func:`stateremat.torch._storage.storage_key`).
        tensor: a declared tensor on the storage (keeps the storage alive while declared).

    Attributes:
        flat: ``uint8`` view of every byte of the storage (writes through it bump no version).
        consumers: segment id -> start sequence number of region segments needing the journal.
        journal: the storage's region journal (``_preserve.region``), or None.
        gap_seq: sequence number of the last write no journal saw (version witnesses, R8).
    """

    def __init__(self, rt: "Runtime", key: StorageKey, tensor: torch.Tensor) -> None:
        self.rt = rt
        self.key = key
        self._tensor = tensor
        self._flat: torch.Tensor | None = None
        self.nbytes = tensor.untyped_storage().nbytes()
        self.users = 0
        self.consumers: dict[int, int] = {}
        self.journal: Any = None
        self.witnesses: dict[int, torch.Tensor] = {}
        self.synced: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.gap_seq = 0
        self.gap_note = ""
        self.marks: list[Any] = []  # weak references to tensors whose class was swapped (_mark)
        self.unmarkable = False  # a declared tensor's class cannot carry the write handler
        #: journaled writes whose version bumps come after a dispatch mode saw them (autograd's
        #: in-place layer runs above it): a change of at most this many is no gap
        self.bumps_due = 0

    @property
    def flat(self) -> torch.Tensor:
        """``uint8`` view of every byte of the storage (made on first use; a small storage's is
        reused across steps, ``_hostcache``)."""
        if self._flat is None:
            self._flat = flat_of(self._tensor)
        return self._flat

    # -- version witnesses (R8) -----------------------------------------------------------
    def add_witness(self, t: torch.Tensor, name: str) -> bool:
        """Watch ``t``'s version counter: a change no journal saw is a gap. True if new."""
        if id(t) in self.witnesses:
            return False
        self.witnesses[id(t)] = t
        self.synced[id(t)] = t._version
        self.names[id(t)] = name
        return True

    def observe(self, journaled: bool) -> None:
        """Compare witnesses with the last synced versions; an unjournaled change is a gap.

        Only a region journal reads gaps: with none, nothing is compared (a journal begun later
        syncs every witness first, so what changed before it is no gap of its consumers)."""
        if self.journal is None:
            return
        changed = [i for i, t in self.witnesses.items() if t._version != self.synced[i]]
        if not changed:
            return
        due, self.bumps_due = self.bumps_due, 0
        if due and all(self.witnesses[i]._version - self.synced[i] <= due for i in changed):
            journaled = True  # the bumps of writes a mode journaled, seen before the mode settled them
        if not journaled:
            self.gap_seq = self.rt.next_seq()
            i = changed[0]
            self.gap_note = (f"{self.names[i]!r} (version {self.synced[i]} -> {self.witnesses[i]._version}: a "
                             "version gap) was written outside any checkpointed segment, or through an alias the region journal "
                             "does not see, after the segment's forward")
        for i in changed:
            self.synced[i] = self.witnesses[i]._version

    def note_gap(self, note: str) -> None:
        """A write no journal saw all of (R8): segments that started before now cannot replay by region."""
        self.gap_seq = self.rt.next_seq()
        self.gap_note = note

    def name(self) -> str:
        """A declared name of this storage for messages."""
        return next(iter(self.names.values()), f"a storage of {self.nbytes} bytes")

    def snapshot(self) -> torch.Tensor:
        """A copy of every byte of the storage."""
        with library_ops():
            return self.flat.clone()


class Runtime:
    """All mutable state of one thread's checkpointing (segments, storages, sequence, counters)."""

    def __init__(self) -> None:
        self.forward: list[Any] = []  # Watches of the segments whose original forward runs, innermost last
        self.replay: list[Any] = []  # ReplayLog of replays running on this thread, innermost last
        self.storages: dict[StorageKey, DeclaredStorage] = {}
        self.strict_depth = 0  # a global write-interception mode is pushed on this thread
        self.replay_queries = 0  # calls of is_replaying(): a forward that asks guards its side effects
        #: storage keys of the tensors a watched state="auto" forward passed to an op (``_learn``)
        self.touched: set | None = None
        #: what ``state="auto"`` learned on this thread (``_learn.Learned``, created on first use)
        self.learned: Any = None
        #: a watched state="auto" forward wrote a pre-existing tensor no scan reached: auto
        #: replays run on past the early-stop point from now on (``_frame.Frame.run_on``)
        self.unreached_writes = False
        self.counters = Counters()
        self._seq = itertools.count(1)

    def next_seq(self) -> int:
        """The next sequence number (orders journal entries, segment starts and gaps)."""
        return next(self._seq)

    def acquire(self, key: StorageKey, tensor: torch.Tensor) -> DeclaredStorage:
        """The declared storage of ``key`` (created on first use), with one more user."""
        st = self.storages.get(key)
        if st is None:
            st = self.storages[key] = DeclaredStorage(self, key, tensor)
        st.users += 1
        return st

    def release(self, st: DeclaredStorage) -> None:
        """One user fewer; forget the storage when nobody uses it."""
        st.users -= 1
        if st.users <= 0 and self.storages.get(st.key) is st:
            del self.storages[st.key]
            for forget in ON_FORGET:
                forget(st)


class _Local(threading.local):
    def __init__(self) -> None:
        self.rt = Runtime()


_LOCAL = _Local()


def runtime() -> Runtime:
    """This thread's runtime."""
    return _LOCAL.rt


def replaying() -> bool:
    """True while a checkpointed segment is being replayed (recomputed) on this thread.

    Public as ``stateremat.torch.is_replaying()``: code with Python side effects (a forward
    hook that logs, counts or appends to a list) can skip them during the replay, so they
    happen once per step as in eager execution::

        def hook(module, inputs, output):
            if not stateremat.torch.is_replaying():
                seen.append(output.detach())

    A forward that asks is taken to guard its Python side effects itself: a Python scalar
    attribute it rebinds (``self.t = self.t + 1``) is then replayed with the value it holds at
    backward, not the forward's start value (see ``stateremat.torch._bindings``).

    Returns:
        bool.
    """
    rt = _LOCAL.rt
    rt.replay_queries += 1
    return bool(rt.replay)
