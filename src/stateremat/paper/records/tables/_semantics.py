"""The semantics cohort's two tables (``semantics``, ``semantics_stateremat_jax``): schema, rules.

Written by ``stateremat cohort semantics`` (``paper.semantics``); declared here so every reader
checks them, whatever it imported (and readers need no torch or JAX). The cohort's families,
methods and dtypes are named here too: the tables' rules check them.
"""
from __future__ import annotations

import pyarrow as pa

from ...._shared.checks import MAX_SEED
from ...limits import MAX_STUDY_SEEDS
from .._store import declare_table
from .._values import in_config, int_list, number, one_of, text_list

#: Family names, in table order (paper §5).
FAMILIES: tuple[str, ...] = (
    "local_strided",
    "local_overlap",
    "hidden_strided",
    "hidden_overlap",
    "raw_overlap_copy",
)
#: Torch execution methods, in table order (paper Table 2).
TORCH_METHOD_NAMES: tuple[str, ...] = (
    "functional_reference", "native_eager", "reentrant", "nonreentrant",
    "reentrant_rng_unpreserved", "nonreentrant_rng_unpreserved", "stateremat_transactional",
)
#: JAX execution methods of the paper's rows -> the families they run on (None: all).
JAX_METHODS: dict[str, tuple[str, ...] | None] = {
    "functional_reference": None,
    "functional_checkpoint": None,
    "native_inplace_eager": None,
    "native_inplace_checkpoint": None,
    "impure_holder_eager": ("hidden_strided", "hidden_overlap"),
    "impure_holder_checkpoint": ("hidden_strided", "hidden_overlap"),
}
#: The stateremat.jax.checkpoint method (extension table, not part of the paper's 5,900).
STATEREMAT_JAX_METHOD = "stateremat_jax_checkpoint"
#: Precisions every program runs in.
DTYPES: tuple[str, ...] = ("float32", "float64")

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
_NOT_RUN = {"outcome": ("R", "unsupported")}  # raised or outside the domain: nothing compared
#: Value rules of both tables (checked on every read, against the run's sidecar config).
VALUES = {
    "seed": in_config("seeds"), "family": in_config("families"), "dtype": in_config("dtypes"),
    "outcome": one_of("M", "R", "D", "unsupported"),
    **{c: number(0, missing=_NOT_RUN) for c in ("max_abs_diff_out", "max_abs_diff_grad",
                                                "max_abs_diff_state", "max_abs_diff_rng")},
    "max_rel_diff": number(0, missing=_NOT_RUN, inf=True),  # a divergence from a zero reference
    "invocation_count": number(0), "elapsed_s": number(0),
}
#: What tells the two tables' rows apart (a part of one copied into the other is refused).
METHODS = {SEMANTICS_TABLE: (("torch", "jax"), (*TORCH_METHOD_NAMES, *JAX_METHODS)),
           EXTENSION_TABLE: (("jax",), (STATEREMAT_JAX_METHOD,))}
#: Sidecar config fields, checked before a reader sizes its work from them.
CONFIG = {"seeds": int_list(0, MAX_SEED, MAX_STUDY_SEEDS), "families": text_list(len(FAMILIES)),
          "dtypes": text_list(len(DTYPES))}
for _table, (_backends, _methods) in METHODS.items():
    declare_table(_table, COLUMNS, KEY, required=("outcome",), config=CONFIG,
                  values={**VALUES, "backend": one_of(*_backends), "method": one_of(*_methods)})
