"""Independent-process cohorts (paper §11): N fresh interpreters, every method each, rows kept."""
from ._process_cohort import (
    PRESPECIFIED as PRESPECIFIED,
    STATUS_TABLE as STATUS_TABLE,
    TIMING_TABLE as TIMING_TABLE,
    cohort_config as cohort_config,
    freeze_profiles as freeze_profiles,
    prespecified_comparisons as prespecified_comparisons,
    run_process_cohort as run_process_cohort,
)
from ._launch import CohortStopped as CohortStopped, check_dask_address as check_dask_address, run_one_process as run_one_process
from ._tables import check_timing_attempts as check_timing_attempts
from ._process_worker import (
    EXPERIMENTS as EXPERIMENTS,
    method_order as method_order,
    worker_main as worker_main,
)

__all__ = [
    "CohortStopped", "EXPERIMENTS", "PRESPECIFIED", "STATUS_TABLE", "TIMING_TABLE", "check_dask_address",
    "check_timing_attempts", "cohort_config",
    "freeze_profiles", "method_order", "prespecified_comparisons", "run_one_process",
    "run_process_cohort", "worker_main",
]
