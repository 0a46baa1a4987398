"""The replay contract as numbered rules (paper §3, eq. 2).

Engines, error messages and tests cite these ids ("see R3"), as PyTorch's checkpoint
cites the Rules of its "Nestable Checkpoint" note.
"""
from __future__ import annotations

RULES: dict[str, str] = {
    "R1": "Values are versions: a logical value is identified by the write that produced it, "
    "not by its address. Every operation reads the versions current *before* its writes; "
    "overlapping source/destination sets are resolved by version, never by the final buffer (§3).",
    "R2": "Replay sees the original bytes: recomputing a segment starts from exactly the storage "
    "bytes B0 its original forward saw, for every declared tensor and every alias of it (§3, eq. 2).",
    "R3": "Replay sees the original randomness: recomputation starts from the generator state R0 "
    "of the original forward, reusing recorded noise; equal bytes with a differently advanced "
    "generator is a violation (§3, eq. 2).",
    "R4": "Replay reproduces its end state: P(B0, R0) = (BT, RT) — the replayed segment ends with "
    "the bytes and generator state the original forward ended with (§3, eq. 2).",
    "R5": "Replay is a transaction: after recomputation the state visible outside replay (declared "
    "buffer bytes and RNG state) is reinstated exactly, so a mutation happens exactly once per "
    "forward (§3.1, Fig. 2A).",
    "R6": "Journals cover destroying writes: a region journal for a segment covers the union of its "
    "own writes and later writes that destroy state it needs (§3.1).",
    "R7": "State is declared: replay restores only declared state; a write to undeclared state "
    "inside a replayed segment is detected and refused, never silently replayed (§3.1, §13).",
    "R8": "Never silently wrong: what cannot be reconstructed exactly is refused with an explicit "
    "error or an 'unsupported' outcome (integer-bit writes are not differentiated) (§3.1, §7).",
}


def rule(rule_id: str) -> str:
    """Return ``"R<n>: <text>"`` for citing a rule in an error message.

    Raises:
        KeyError: if ``rule_id`` is not one of :data:`RULES`.
    """
    return f"{rule_id}: {RULES[rule_id]}"
