"""Profile cards of the paper's built-in workloads, measured on this device (§4).

:func:`profile_workload` measures ``r``, ``q``, ``c`` per segment and option of a
:class:`~stateremat.paper.workloads.StatefulChain`; :func:`wrap_segment` puts one segment under
one option (including the card-only ``recompute_only`` view).
"""
from ._options import (
    RecomputeOnly as RecomputeOnly,
    journal_scope as journal_scope,
    preserved_now as preserved_now,
    sync as sync,
    wrap_segment as wrap_segment,
)
from ._profiler import (
    profile_workload as profile_workload,
    warm_chain as warm_chain,
    workload_source_hash as workload_source_hash,
)

__all__ = ["RecomputeOnly", "journal_scope", "preserved_now", "profile_workload",
           "sync", "warm_chain", "workload_source_hash", "wrap_segment"]
