"""Preservation statistics: bytes retained for state preservation, replay counts (§4 profile cards).

The cost runtime reads :func:`preservation_stats` around a step to charge each option its
retained bytes ``r`` (whole snapshots + region journal entries alive) and temporary bytes
``q`` (copies of the visible bytes held while a replay runs).
"""
from __future__ import annotations

from dataclasses import dataclass

from ._runtime import runtime


@dataclass(frozen=True)
class PreservationStats:
    """Live and peak bytes held for state preservation, and replay counts.

    Attributes:
        snapshot_bytes: bytes of whole snapshots held by live segments now.
        journal_bytes: bytes of region-journal entries held now (all declared storages).
        retained_state_bytes: ``snapshot_bytes + journal_bytes``.
        peak_retained_state_bytes: max of ``retained_state_bytes`` since the last reset.
        peak_temporary_bytes: max bytes copied aside while one replay ran (visible bytes kept
            for reinstatement), since the last reset.
        live_segments: checkpointed segments whose forward ran and that may still replay.
        recompute_count: replays run since the last reset.
        retained_by_option: bytes held now per option name (``"whole"``, ``"region"``, any
            registered option), summing to ``retained_state_bytes``.
    """

    snapshot_bytes: int
    journal_bytes: int
    retained_state_bytes: int
    peak_retained_state_bytes: int
    peak_temporary_bytes: int
    live_segments: int
    recompute_count: int
    retained_by_option: dict[str, int]


def preservation_stats() -> PreservationStats:
    """Return bytes held for state preservation now and their peaks since the last reset.

    Returns:
        A :class:`PreservationStats`; sizes in bytes.

    References:
        Paper §4 (retained bytes ``r``, temporary bytes ``q`` of a profile card).
    """
    c = runtime().counters
    retained = c.retained()
    return PreservationStats(
        snapshot_bytes=c.snapshot_bytes,
        journal_bytes=c.journal_bytes,
        retained_state_bytes=retained,
        peak_retained_state_bytes=max(c.peak_retained, retained),
        peak_temporary_bytes=c.peak_temporary,
        live_segments=c.live_segments,
        recompute_count=c.recompute_count,
        retained_by_option={k: v for k, v in c.held.items() if v},
    )


def reset_preservation_stats() -> None:
    """Reset the peaks and the replay count (live byte counts are kept: they are facts)."""
    c = runtime().counters
    c.peak_retained = c.retained()
    c.peak_temporary = 0
    c.recompute_count = 0
