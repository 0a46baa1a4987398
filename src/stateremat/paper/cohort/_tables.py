"""Row schemas of a process cohort's two tables: per-step timing rows and per-process status."""
from __future__ import annotations

import pyarrow as pa

from ..records import declare_table

TIMING_TABLE = "cohort_timing"
STATUS_TABLE = "cohort_processes"
TIMING_KEY = ("process", "cell", "method", "step")
STATUS_KEY = ("process", "attempt")
#: A bench row (see ``bench._summary``) plus the process that measured it; ``budget_rule``
#: came later, so older parts may lack it.
TIMING_COLUMNS = [
    ("experiment", pa.string()), ("preset", pa.string()), ("cell", pa.string()),
    ("budget_bytes", pa.int64()), ("profile_hash", pa.string()), ("source_hash", pa.string()),
    ("memory_method", pa.string()), ("device", pa.string()), ("dtype", pa.string()),
    ("min_eager_whole_peak_bytes", pa.int64()), ("min_joint_peak_bytes", pa.int64()),
    ("workload", pa.string()), ("state_bytes", pa.int64()), ("write_fraction", pa.float64()),
    ("live_versions", pa.int64()), ("segments", pa.int64()), ("width", pa.int64()),
    ("batch", pa.int64()), ("granularity_bytes", pa.int64()), ("dropout", pa.float64()),
    ("seed", pa.int64()), ("method", pa.string()), ("feasible", pa.bool_()),
    ("policy", pa.string()), ("predicted_peak_bytes", pa.int64()),
    ("predicted_time_s", pa.float64()), ("semantic_checks", pa.string()),
    ("semantic_max_error", pa.float64()), ("semantic_detail", pa.string()),
    ("error", pa.string()), ("step", pa.int64()), ("step_time_s", pa.float64()),
    ("peak_bytes", pa.int64()), ("fits_budget", pa.bool_()), ("loadavg", pa.string()),
    ("process", pa.int64()), ("order_index", pa.int64()), ("warmups", pa.int64()),
    ("steps", pa.int64()), ("hostname", pa.string()), ("pid", pa.int64()),
    ("process_wall_s", pa.float64()), ("torch_threads", pa.int64()), ("attempt", pa.int64()),
    ("budget_rule", pa.string()),
]
#: One row per process attempt; ``requested_processes`` came later.
STATUS_COLUMNS = [
    ("process", pa.int64()), ("attempt", pa.int64()), ("status", pa.string()),
    ("exit_code", pa.int64()), ("stderr_tail", pa.string()), ("wall_s", pa.float64()),
    ("hostname", pa.string()), ("n_rows", pa.int64()), ("executor", pa.string()),
    ("requested_processes", pa.int64()),
]
declare_table(TIMING_TABLE, TIMING_COLUMNS, TIMING_KEY, optional=("budget_rule",))
declare_table(STATUS_TABLE, STATUS_COLUMNS, STATUS_KEY, required=("status",),
              optional=("requested_processes",))
