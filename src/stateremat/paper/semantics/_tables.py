"""Row schemas of the semantics cohort's two tables (declared here so readers need no JAX)."""
from __future__ import annotations

import pyarrow as pa

from ..records import declare_table

SEMANTICS_TABLE = "semantics"
EXTENSION_TABLE = "semantics_stateremat_jax"
KEY = ("backend", "method", "family", "seed", "dtype")
#: One row per (backend, method, family, seed, dtype); key columns never null.
COLUMNS = [
    ("backend", pa.string()), ("method", pa.string()), ("family", pa.string()),
    ("seed", pa.int64()), ("dtype", pa.string()), ("outcome", pa.string()),
    ("max_abs_diff_out", pa.float64()), ("max_abs_diff_grad", pa.float64()),
    ("max_abs_diff_state", pa.float64()), ("max_abs_diff_rng", pa.float64()),
    ("max_rel_diff", pa.float64()), ("exception_type", pa.string()),
    ("exception_message", pa.string()), ("exception_stage", pa.string()),
    ("invocation_count", pa.int64()), ("warnings", pa.string()), ("elapsed_s", pa.float64()),
    ("framework_version", pa.string()), ("device", pa.string()), ("program_hash", pa.string()),
    ("params_json", pa.string()), ("created_utc", pa.string()),
]
for _table in (SEMANTICS_TABLE, EXTENSION_TABLE):
    declare_table(_table, COLUMNS, KEY, required=("outcome",))
