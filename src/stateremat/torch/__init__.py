"""stateremat.torch (see DESIGN.md, layer `torch`): transactional activation checkpointing.

``checkpoint`` / ``StatefulCheckpoint`` replay a segment with its declared state restored to
the bytes of the original forward and reinstate the visible state afterwards (paper §3.1, §5).
One segment is three rooms, wired by ``_checkpoint.run_segment`` in the order data flows
(forward → pack → backward → restore → recompute → reinstate): the transaction (``_txn``, with
``_bindings``, ``_plain`` and the ``_preserve`` engines: everything a replay puts back), the
frame (``_frame``: torch's checkpoint frame) and the watch (``_watch``: R7).
"""
from . import _compat  # noqa: F401  (fails here, with the torch versions needed, on an unsupported torch)
# The contract's errors, each also a torch.utils.checkpoint.CheckpointError (what is raised here).
from ._errors import (
    ReplayDivergenceError as ReplayDivergenceError,
    ReplayError as ReplayError,
    UndeclaredStateError as UndeclaredStateError,
    UnsupportedError as UnsupportedError,
)

from ._checkpoint import Checkpointer as Checkpointer, checkpoint as checkpoint, journal_writes as journal_writes
from ._runtime import replaying as is_replaying
from ._memory import PeakMemory as PeakMemory, memory_method as memory_method, storage_bytes as storage_bytes  # issue 5
from ._mode import UndeclaredStateWarning as UndeclaredStateWarning
from ._module import StatefulCheckpoint as StatefulCheckpoint
from ._auto import auto_checkpoint as auto_checkpoint, expected_peak_bytes as expected_peak_bytes
from ._plan import apply_plan as apply_plan
from ._profiler import profile as profile
from ._pystate import refuse_python_state as refuse_python_state
from ._segments import resolve_segments as resolve_segments
from ._sequential import checkpoint_sequential as checkpoint_sequential
from ._stats import (
    PreservationStats as PreservationStats,
    preservation_stats as preservation_stats,
    reset_preservation_stats as reset_preservation_stats,
)

__all__ = [
    "Checkpointer", "PeakMemory", "PreservationStats", "ReplayDivergenceError", "ReplayError",
    "StatefulCheckpoint", "UndeclaredStateError", "UndeclaredStateWarning", "UnsupportedError",
    "apply_plan", "auto_checkpoint", "checkpoint", "checkpoint_sequential", "expected_peak_bytes",
    "is_replaying", "journal_writes", "memory_method", "preservation_stats", "profile",
    "refuse_python_state", "reset_preservation_stats", "resolve_segments", "storage_bytes",
]
