"""Row schemas of a process cohort's two tables: per-step timing rows and per-process status."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from ...contract import RecordsError
from ..._shared.checks import MAX_SEED
from ..limits import MAX_PROCESSES, MAX_STEPS, MAX_THREADS, MAX_WARMUPS
from ..measured import (CELL_CONSTANT, MEASURED_VALUES, METHOD_CONSTANT, ROW_RULES, RUN_CONSTANT,
                        step_rule)
from ..records import declare_table, first_part_holding
from ..records import (all_of, config_device, config_entry, config_value, in_config, integer, number,
                       one_of, text, text_list)

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


def check_timing_attempts(out_dir, timing, status, processes: int | None = None) -> None:
    """Refuse ``cohort_timing`` rows of a process attempt the run did not write.

    A run appends a process's rows, then its ``ok`` status row. Rows are the run's own when
    ``cohort_processes`` records their (process, attempt) as ``ok``, or when they are of the one
    attempt a stop (``kill -9``) cut short between the two appends: a process with no ok attempt,
    the attempt right after its recorded ones, of a process below the largest ``--processes``
    asked for (``processes``: the launch resuming now). Anything else (a process outside the
    cohort, an attempt after an ok one) would be counted as a process of this run. With no status
    rows at all (its table emptied or deleted, sidecar and all) only the first attempt of one
    process is the run's: a stop between the run's very first two appends leaves just that.

    Args:
        out_dir: the run folder; ``timing``, ``status``: its two tables' rows (DataFrames).
        processes: the N of a launch resuming the run now, if any.

    Raises:
        RecordsError: naming the first part holding such rows, the process and the attempt.
    """
    if timing.empty:
        return
    pairs = timing[["process", "attempt"]].drop_duplicates()
    if status.empty:  # only a stop between the run's very first two appends leaves this
        seen = [(int(p), int(a)) for p, a in pairs.itertuples(index=False, name=None)]
        cut = seen[0] if seen[0][1] == 1 and (processes is None or seen[0][0] < processes) else None
        bad = [pa for pa in seen if pa != cut]
        if bad:
            _refuse(out_dir, bad, "which no status row of the run records (its table "
                    f"{Path(out_dir) / STATUS_TABLE} is empty or missing, as only a stop between "
                    "the run's first process's rows and its status row leaves it, for that one "
                    "process)")
        return
    recorded = set(zip(status["process"].astype(int), status["attempt"].astype(int)))
    good = status[status["status"] == "ok"]
    ok = set(zip(good["process"].astype(int), good["attempt"].astype(int)))
    ok_process = {p for p, _ in ok}
    tries = status.groupby("process").size().to_dict()
    asked = status["requested_processes"].dropna() if "requested_processes" in status else None
    bound = max(int(asked.max()) if asked is not None and not asked.empty
                else int(status["process"].max()) + 1, int(processes or 0))

    def own(p: int, a: int) -> bool:
        if (p, a) in ok:
            return True
        return ((p, a) not in recorded and p not in ok_process and p < bound
                and a == int(tries.get(p, 0)) + 1)

    bad = [(int(p), int(a)) for p, a in pairs.itertuples(index=False, name=None)
           if not own(int(p), int(a))]
    if bad:
        _refuse(out_dir, bad, f"which {Path(out_dir) / STATUS_TABLE} does not record as a "
                f"successful attempt of this run (processes 0 to {bound - 1})")


def _refuse(out_dir, bad: list[tuple[int, int]], why: str) -> None:
    """Raise the RecordsError for ``bad`` (process, attempt) pairs, naming the first part
    holding the first."""
    p, a = bad[0]
    part = first_part_holding(out_dir, TIMING_TABLE, ("process", "attempt"), (p, a))
    more = f" (and {len(bad) - 1} more such process attempt(s))" if len(bad) > 1 else ""
    raise RecordsError(
        f"stateremat records: {part} holds {TIMING_TABLE!r} rows of process {p}, attempt {a}, "
        f"{why}{more}: the run did not write them (a part of another "
        "cohort copied in, or edited). Tip: move that part out of the folder (keep it if it "
        "belongs elsewhere), then rerun the run's command with the same --out.")
