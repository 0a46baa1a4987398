"""Tables (markdown/CSV) and figures (matplotlib) recomputed from raw records.

Reporter modules register themselves on import (one import line each below).
"""
from ._registry import (OUTPUTS as OUTPUTS, REPORTERS as REPORTERS, orphan_tables as orphan_tables,
                        register_reporter as register_reporter, tables_in as tables_in)
from ._cohort import cohort_summary as cohort_summary  # registers the cohort reporters
from ._semantics import report_semantics as report_semantics, report_semantics_extension as report_semantics_extension
from ._bench import report_bench as report_bench
from ._moco import report_moco as report_moco
from ._verify import report_alias as report_alias, report_engines as report_engines, report_finite as report_finite
from ._complete import check_complete as check_complete, stale_outputs as stale_outputs

__all__ = ["OUTPUTS", "REPORTERS", "check_complete", "cohort_summary", "orphan_tables",
           "register_reporter",
           "report_alias", "report_bench", "report_engines", "report_finite", "report_moco",
           "stale_outputs", "report_semantics", "report_semantics_extension", "tables_in",
           ]
