"""Tables (markdown/CSV) and figures (matplotlib) recomputed from raw records.

Reporter modules register themselves on import (one import line each below).
"""
from ._registry import REPORTERS as REPORTERS, register_reporter as register_reporter, tables_in as tables_in
from ._cohort import cohort_summary as cohort_summary  # registers the cohort reporters
from ._semantics import report_semantics as report_semantics, report_semantics_extension as report_semantics_extension
from ._bench import render as render_bench, report_bench as report_bench, write_tables as write_bench_tables
from ._moco import report_moco as report_moco

__all__ = ["REPORTERS", "cohort_summary", "register_reporter", "render_bench", "report_bench",
           "report_moco", "report_semantics", "report_semantics_extension", "tables_in",
           "write_bench_tables"]
