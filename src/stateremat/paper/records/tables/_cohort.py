"""A process cohort's two tables (``cohort_timing``: per-step timing rows; ``cohort_processes``:
per-process status): schemas, keys, value rules.

Written by ``stateremat cohort processes`` (``paper.cohort``); declared here so every reader
checks them, whatever it imported.
"""
from __future__ import annotations

import pyarrow as pa

from ...._shared.checks import MAX_SEED
from ...limits import MAX_PROCESSES, MAX_STEPS, MAX_THREADS, MAX_WARMUPS
from .._store import declare_table
from .._values import (all_of, config_device, config_entry, config_value, in_config, integer, number,
                       one_of, text, text_list)
from ._measured import (CELL_CONSTANT, MEASURED_VALUES, METHOD_CONSTANT, ROW_RULES, RUN_CONSTANT,
                        step_rule)

TIMING_TABLE = "cohort_timing"
STATUS_TABLE = "cohort_processes"
TIMING_KEY = ("process", "cell", "method", "step")
STATUS_KEY = ("process", "attempt")
#: A bench row (see :mod:`._bench`) plus the process that measured it; ``budget_rule``
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
#: Value rules (checked on every read, against the run's sidecar config): a row is of the
#: run's experiment and preset, of one of its cells, with that cell's methods, budget and steps.
TIMING_VALUES = {
    **MEASURED_VALUES, **ROW_RULES, "step": step_rule(("process", "cell", "method"), cell="cell"),
    "seed": config_value("seed"), "profile_hash": config_entry("profile", by="cell"),
    "budget_rule": config_value("budget_rule", by="cell"),
    "experiment": config_value("experiment"), "preset": config_value("preset"),
    "device": config_device(), "cell": in_config("cells", key="cell"),
    "method": in_config("methods", by="cell"),
    **{c: config_value(c, by="cell") for c in ("budget_bytes", "warmups", "steps")},
    "process": number(0, MAX_PROCESSES), "order_index": number(0), "attempt": number(0),
    "torch_threads": all_of(number(1, missing=True), config_value("threads")),  # the threads it ran with
    "pid": number(0), "process_wall_s": number(0),
}
STATUS_VALUES = {
    "status": one_of("ok", "failed", "timeout", "interrupted"), "process": number(0, MAX_PROCESSES),
    "attempt": number(0), "exit_code": number(None, missing=True), "wall_s": number(0),
    "n_rows": number(0, missing=True), "requested_processes": number(1, MAX_PROCESSES, missing=True),
}
#: Sidecar config fields (both tables share the run's config), checked before use.
CONFIG = {"experiment": text(), "preset": text(), "device": text(), "seed": integer(0, MAX_SEED),
          "threads": integer(1, MAX_THREADS), "cells[].cell": text(),
          "cells[].methods": text_list(100), "cells[].budget_bytes": integer(0, 2**63 - 1),
          "cells[].warmups": integer(0, MAX_WARMUPS), "cells[].steps": integer(1, MAX_STEPS)}
#: Columns one value in all rows of a process's (cell, method), of its cell, of the run.
TIMING_CONSTANT_IN = {("process", "cell", "method"): METHOD_CONSTANT,
                      ("process", "cell"): (*CELL_CONSTANT, "warmups", "steps"), (): RUN_CONSTANT}
declare_table(TIMING_TABLE, TIMING_COLUMNS, TIMING_KEY, optional=("budget_rule",),
              values=TIMING_VALUES, config=CONFIG, constant_in=TIMING_CONSTANT_IN)
declare_table(STATUS_TABLE, STATUS_COLUMNS, STATUS_KEY, required=("status",),
              optional=("requested_processes",), values=STATUS_VALUES, config=CONFIG)
