"""Value rules of a measured step row, shared by the ``bench`` and ``cohort_timing`` tables.

Torch-free (the tables are declared where readers need no torch). A step that did not run (an
infeasible method's ``step = -1`` row, or a step that raised: ``error`` set) has no time or
peak; every other step has both, finite and non-negative.
"""
from __future__ import annotations

from .records import number, one_of, set_text

_UNMEASURED = {"step": (-1,), "error": set_text}

#: column -> rule, for the columns both tables share.
MEASURED_VALUES = {
    "step": number(-1), "step_time_s": number(0, missing=_UNMEASURED),
    "peak_bytes": number(0, missing=_UNMEASURED),
    "predicted_peak_bytes": number(0, missing=True), "predicted_time_s": number(0, missing=True),
    "min_eager_whole_peak_bytes": number(0, missing=True),
    "min_joint_peak_bytes": number(0, missing=True),
    "semantic_checks": one_of("not_run", "pass", "fail"),
    "semantic_max_error": number(0, missing=True),
    **{c: number(0, missing=True) for c in ("state_bytes", "live_versions", "segments", "width",
                                             "batch", "granularity_bytes")},
    "write_fraction": number(0, 1, missing=True), "dropout": number(0, 1, missing=True),
}
