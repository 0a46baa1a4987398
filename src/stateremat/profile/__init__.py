"""stateremat.profile (see DESIGN.md, layer `profile`): measure profile cards on this device (§4)."""
from ._options import (
    EXECUTABLE_OPTIONS as EXECUTABLE_OPTIONS,
    PROFILE_OPTIONS as PROFILE_OPTIONS,
    RecomputeOnly as RecomputeOnly,
    wrap_segment as wrap_segment,
)
from ._profiler import (
    profile_workload as profile_workload,
    warm_chain as warm_chain,
    workload_source_hash as workload_source_hash,
)
