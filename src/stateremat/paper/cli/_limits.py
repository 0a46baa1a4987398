"""The documented range of every numeric option of the paper commands, checked before any work.

Counts are capped where the work (or the rows a summary reads back) would outgrow any machine
long before it finished; the README's "Commands" section lists the same numbers. Options with
a plain integer range declare it to typer (``min=``/``max=``, shown by ``--help``); seed
ranges are checked here before a list of seeds is built.
"""
from __future__ import annotations

import re

from stateremat._shared.checks import MAX_SEED, check_memory, fail

from ..limits import (MAX_JOBS as MAX_JOBS, MAX_MOCO_SEEDS as MAX_MOCO_SEEDS,
                      MAX_PROCESSES as MAX_PROCESSES, MAX_PROGRAMS as MAX_PROGRAMS,
                      MAX_STEPS as MAX_STEPS, MAX_STUDY_SEEDS as MAX_STUDY_SEEDS,
                      MAX_THREADS as MAX_THREADS, MAX_WARMUPS as MAX_WARMUPS)
#: ``--timeout-s`` of a cohort process: at most a week.
MAX_TIMEOUT_S = 7 * 24 * 3600.0

#: Bytes a row of each table takes once read back into pandas (measured), times the copies a
#: summary makes (concatenation, grouping): what ``check_rows`` multiplies by.
ROW_BYTES = {"finite": 300, "engines": 350, "alias": 400, "semantics": 600, "cohort_timing": 600}
_COPIES = 4


def parse_seeds(api: str, option: str, text: str, max_count: int, *,
                count_form: bool = False) -> list[int]:
    """Seeds of ``text``: a half-open range ``A:B`` or (``count_form``) a count ``N`` meaning
    ``0:N``; every seed in ``[0, MAX_SEED]``, at most ``max_count`` of them.

    Without ``count_form`` a bare integer ``N`` is refused: it reads as a count to some and as
    one seed to others (``verify alias --seeds 3`` is seeds 0, 1, 2), so the range options ask
    for ``A:B`` (one seed: ``N:N+1``). The bounds are checked before the list is built, so a
    20-digit range costs nothing.

    Raises:
        typer.Exit: (code 2) naming the option, what was expected and what was given.
    """
    where = f"{api}: {option} {text!r}"
    form = "a count N (seeds 0..N-1) or a half-open range A:B" if count_form else \
        "a half-open range A:B (one seed N: N:N+1; a bare N is refused)"
    tip = f"Tip: {option} takes {form} of seeds in [0, {MAX_SEED}], at most {max_count:,} seeds."
    # ASCII digits only ([0-9], not \d: "٠:٢" is no seed range anyone types on purpose)
    m = re.fullmatch(r"\s*\+?([0-9]+)\s*(?::\s*\+?([0-9]+)\s*)?", str(text))
    if not m:
        signed = re.fullmatch(r"\s*[-+]?[0-9]+\s*:\s*[-+]?[0-9]+\s*", str(text))
        why = ("seeds must be non-negative integers (NumPy and torch generators take seeds "
               ">= 0)" if signed else "expected " + ("a seed count >= 1 or a range A:B"
                                                    if count_form else "a half-open range A:B")
               + f", written in ASCII digits 0-9, got {text!r}")
        raise fail(f"{where}: {why}. {tip}")
    a, b = int(m.group(1)), None if m.group(2) is None else int(m.group(2))
    if b is None and not count_form:
        raise fail(f"{where}: a bare number is ambiguous here (a count, or one seed?); "
                   f"{option} takes a half-open range A:B. Tip: write {option} {a}:{a + 1} "
                   f"for the one seed {a}, or {option} 0:{a} for the {a:,} seeds 0..{a - 1}."
                   if a > 0 else
                   f"{where}: a bare number is ambiguous here (a count, or one seed?); "
                   f"{option} takes a half-open range A:B. Tip: write {option} 0:1 for the "
                   "one seed 0.")
    if b is None:
        if a == 0:
            raise fail(f"{where}: expected a seed count >= 1 or a range A:B, got 0. {tip}")
        a, b = 0, a
    if b <= a:
        raise fail(f"{where}: empty range (A:B is half-open; need A < B). {tip}")
    if b - 1 > MAX_SEED:
        raise fail(f"{where}: seeds must be at most {MAX_SEED} (32 bits), got {b - 1}. {tip}")
    if b - a > max_count:
        raise fail(f"{where}: {b - a:,} seeds, more than the {max_count:,} allowed. {tip}")
    return list(range(a, b))


def check_rows(api: str, table: str, rows: int, what: str) -> None:
    """Refuse a run whose rows, read back for its summary, would not fit in memory."""
    check_memory(api, f"{what} ({rows:,} rows of {table!r}, read back for the summary)",
                 rows * ROW_BYTES[table] * _COPIES, tip="ask for fewer")
