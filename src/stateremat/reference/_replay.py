"""Byte-level replay of a segment: snapshot replay, region undo/redo, wrong-RNG control.

Replay contract (eq. 2): replaying ops ``[s, e)`` from the bytes ``B_s`` and generator state
``R_s`` the original forward saw must end with exactly ``(B_e, R_e)`` — every storage byte
(all aliases at once) *and* the generator state. :func:`same_state` is that comparison; its
``check_rng`` switch exists only so tests can show that dropping the RNG half lets a wrong
generator state pass (R3).

References: paper §3 eq. (2), §3.1, §6; rules R2–R5.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._exec import execute
from ._ir import Program


def same_state(bytes_a: np.ndarray, rng_a: dict, bytes_b: np.ndarray, rng_b: dict,
               check_rng: bool = True) -> bool:
    """True iff both byte arrays are identical and (unless disabled) both generator states are.

    Equal bytes with a differently advanced generator is *not* the same state (R3).
    """
    return bool(np.array_equal(bytes_a, bytes_b)) and (not check_rng or rng_a == rng_b)


def _generator(state: dict) -> np.random.Generator:
    g = np.random.Generator(np.random.PCG64())
    g.bit_generator.state = state
    return g


@dataclass
class JournalEntry:
    """One journaled write: byte offsets ``(w,)``, old/new bytes ``(w,)`` uint8, generator
    states before/after the op and the noise ``(m,)`` float64 it drew (``None``: no draw)."""

    where: np.ndarray
    old: np.ndarray
    new: np.ndarray
    rng_before: dict
    rng_after: dict
    eps: np.ndarray | None


@dataclass
class SegmentForward:
    """The original forward of a program with a snapshot at ``s`` and a journal from ``s``.

    ``journal`` holds, in write order, one :class:`JournalEntry` per write at or after ``s``
    (the union of the segment's own writes and the later writes that destroy state it needs,
    R6), including the generator state around the write and the noise it drew (R3).
    """

    s: int
    e: int
    b_s: np.ndarray
    r_s: dict
    b_e: np.ndarray
    r_e: dict
    b_t: np.ndarray
    r_t: dict
    journal: list


def forward_with_snapshot(p: Program, s: int, e: int) -> SegmentForward:
    """Run ``p`` once from ``(B0, R0)``, snapshotting at ``s`` and ``e`` and journaling from ``s``."""
    g = p.initial_rng()
    head = execute(p, rng=g, ops=p.ops[:s], track=False)
    b_s, r_s = head.bytes_.copy(), head.rng_state
    seg = execute(p, head.bytes_, g, ops=p.ops[s:e], start=s)
    b_e, r_e = seg.bytes_.copy(), seg.rng_state
    tail = execute(p, seg.bytes_, g, ops=p.ops[e:], start=e)
    journal = [JournalEntry(r.write_byte_offsets(), r.old_bytes.reshape(-1), r.new_bytes.reshape(-1),
                            r.rng_before, r.rng_after, None if r.eps is None else r.eps.copy())
               for r in seg.records + tail.records]
    return SegmentForward(s, e, b_s, r_s, b_e, r_e, tail.bytes_, tail.rng_state, journal)


def snapshot_replay(p: Program, f: SegmentForward, rng_state: dict | None = None):
    """Replay ``[s, e)`` from the snapshot ``(B_s, R_s)``; returns ``(bytes, rng_state)``.

    ``rng_state`` overrides ``R_s`` (the wrong-RNG negative control).
    """
    g = _generator(f.r_s if rng_state is None else rng_state)
    run = execute(p, f.b_s, g, ops=p.ops[f.s:f.e], start=f.s, track=False)
    return run.bytes_, run.rng_state


def redo_rng(entry: JournalEntry, state: dict | None) -> dict | None:
    """Generator state after redoing ``entry`` from ``state``; ``None`` if the record is corrupt.

    The redo replays the entry's draws: starting from ``state`` (which must equal the recorded
    ``rng_before``) it draws as many normals as the op drew, which must reproduce the recorded
    noise and end at the recorded ``rng_after``; an op without draws must not move it.
    """
    if state is None or state != entry.rng_before:
        return None
    g = _generator(state)
    if entry.eps is not None and not np.array_equal(g.standard_normal(len(entry.eps)), entry.eps):
        return None
    after = g.bit_generator.state
    return after if after == entry.rng_after else None


def region_undo_replay(p: Program, f: SegmentForward):
    """Undo the journal on ``B_T`` in reverse order, replay ``[s, e)``, redo the later writes.

    The redo reinstates the later writes' new bytes and replays their draws from the replayed
    generator state (:func:`redo_rng`), so the returned generator state is reproduced, not
    copied from ``R_T``.

    Returns:
        ``(undone_bytes, (replayed_bytes, replayed_rng), (redone_bytes, redone_rng))`` to be
        compared with ``B_s``, ``(B_e, R_e)`` and ``(B_T, R_T)``; ``redone_rng`` is ``None``
        when a journaled generator record is inconsistent.
    """
    b = f.b_t.copy()
    for entry in reversed(f.journal):
        b[entry.where] = entry.old
    undone = b.copy()
    g = _generator(f.r_s)
    run = execute(p, b, g, ops=p.ops[f.s:f.e], start=f.s, track=False)
    replayed = (run.bytes_.copy(), run.rng_state)
    b, state = run.bytes_, run.rng_state
    n_seg = f.e - f.s
    for entry in f.journal[n_seg:]:  # redo the writes after the segment, in order
        b[entry.where] = entry.new
        state = redo_rng(entry, state)
    return undone, replayed, (b, state)


def wrong_rng_state(r: dict) -> dict:
    """``r`` advanced by one extra standard-normal draw (the wrong-RNG control's start)."""
    g = _generator(r)
    g.standard_normal()
    return g.bit_generator.state
