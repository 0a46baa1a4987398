"""The ``moco`` table (one row per trained encoder: seed, method, attempt): schema, key, rules.

Written by ``stateremat app moco`` (``paper.moco``), summarised from the rows and the score files
by its summary; declared here so every reader checks them, whatever it imported.
"""
from __future__ import annotations

import pyarrow as pa

from ...limits import MAX_THREADS
from .._store import declare_table
from .._values import config_device, config_value, integer, number, one_of, text

TABLE = "moco"
KEY = ("seed", "method")
#: The moco table's row schema (names, types; key columns never null).
COLUMNS = [
    ("seed", pa.int64()), ("method", pa.string()), ("dataset", pa.string()),
    ("preset", pa.string()), ("device", pa.string()), ("threads", pa.int64()),
    ("memory_method", pa.string()), ("peak_bytes", pa.int64()),
    ("encoder_time_s", pa.float64()), ("steps", pa.int64()), ("test_accuracy", pa.float64()),
    ("test_cross_entropy", pa.float64()), ("validation_accuracy", pa.float64()),
    ("final_loss", pa.float64()), ("loss_sha256", pa.string()), ("encoder_sha256", pa.string()),
    ("policy", pa.string()), ("budget_bytes", pa.int64()), ("feasible", pa.bool_()),
    ("predicted_peak_bytes", pa.int64()), ("predicted_time_s", pa.float64()),
    ("outcome", pa.string()), ("error_type", pa.string()), ("error", pa.string()),
    ("loadavg", pa.string()), ("scores_file", pa.string()), ("scores_sha256", pa.string()),
    ("attempt", pa.int64()),
]
# A failed unit's row is kept beside its retry's (every record is kept): rows are told apart by
# their attempt (``attempt`` came later: an older part, one row each, counts as its own), so a
# part copied or moved in is refused as a duplicate.
#: The seven methods of paper §12, in Table 9's row order (torch-free, so importing is cheap).
METHODS = ("eager", "whole", "regions", "functional", "deferred", "state_agnostic", "joint")
_FAILED = {"outcome": ("error",)}  # a failed unit's row measured nothing
#: Value rules (checked on every read, against the run's sidecar config).
VALUES = {
    "method": one_of(*METHODS), "outcome": one_of("ok", "error"),
    "preset": config_value("preset.name"), "dataset": config_value("dataset"),
    "device": config_device(),
    "threads": config_value("threads"), "attempt": number(0, missing=True),
    **{c: number(0, missing=_FAILED) for c in ("peak_bytes", "encoder_time_s", "steps",
                                               "test_cross_entropy", "final_loss")},
    **{c: number(0, 1, missing=_FAILED) for c in ("test_accuracy", "validation_accuracy")},
    **{c: number(0, missing=True) for c in ("budget_bytes", "predicted_peak_bytes",
                                            "predicted_time_s")},
}
#: Sidecar config fields, checked before a reader sizes its work from them.
CONFIG = {"preset.name": text(), "dataset": text(), "device": text(),
          "threads": integer(1, MAX_THREADS)}
declare_table(TABLE, COLUMNS, KEY, required=("outcome",), optional=("attempt",),
              distinct_by=("attempt",), values=VALUES, config=CONFIG)
