"""Checks across a process cohort's two tables (declared in ``records.tables``): which timing
rows are the run's own."""
from __future__ import annotations

from pathlib import Path

from ..records import RecordsError, first_part_holding
from ..records.tables import STATUS_TABLE, TIMING_TABLE


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
