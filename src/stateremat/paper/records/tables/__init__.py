"""Every records table the paper's commands write, declared below the wings that write them.

Importing :mod:`stateremat.paper.records` imports this package, which declares (with
:func:`~stateremat.paper.records.declare_table`) each table's row schema, key, value rules and
sidecar config fields: a reader or writer of any table checks its rows against its spec
(:func:`~stateremat.paper.records.table_spec`), whatever else the process imported. The
wings (``verify``, ``bench``, ``moco``, ``semantics``, ``cohort``) import from here the table
names and the vocabularies the rules check (families, methods, dtypes); nothing here imports a
wing.

Tables: ``finite``, ``engines``, ``alias`` (``stateremat verify``); ``bench``; ``moco``
(``stateremat app moco``); ``semantics``, ``semantics_stateremat_jax`` (``stateremat cohort
semantics``); ``cohort_timing``, ``cohort_processes`` (``stateremat cohort processes``).
"""
from ._measured import SEMANTIC_RTOL as SEMANTIC_RTOL
from ._verify import FAMILIES as VERIFY_FAMILIES
from ._bench import METHODS as BENCH_METHODS, TABLE as BENCH_TABLE
from ._moco import METHODS as MOCO_METHODS, TABLE as MOCO_TABLE
from ._semantics import (
    DTYPES as SEMANTICS_DTYPES,
    EXTENSION_TABLE as EXTENSION_TABLE,
    FAMILIES as SEMANTICS_FAMILIES,
    JAX_METHODS as JAX_METHODS,
    SEMANTICS_TABLE as SEMANTICS_TABLE,
    STATEREMAT_JAX_METHOD as STATEREMAT_JAX_METHOD,
    TORCH_METHOD_NAMES as TORCH_METHOD_NAMES,
)
from ._cohort import STATUS_TABLE as STATUS_TABLE, TIMING_TABLE as TIMING_TABLE

#: Every table declared here, by the command that writes it (verify, bench, moco, semantics,
#: cohort).
TABLES: tuple[str, ...] = ("finite", "engines", "alias", BENCH_TABLE, MOCO_TABLE, SEMANTICS_TABLE,
                           EXTENSION_TABLE, TIMING_TABLE, STATUS_TABLE)

__all__ = ["BENCH_METHODS", "BENCH_TABLE", "EXTENSION_TABLE", "JAX_METHODS", "MOCO_METHODS",
           "MOCO_TABLE", "SEMANTICS_DTYPES", "SEMANTICS_FAMILIES", "SEMANTICS_TABLE",
           "SEMANTIC_RTOL", "STATEREMAT_JAX_METHOD", "STATUS_TABLE", "TABLES", "TIMING_TABLE",
           "TORCH_METHOD_NAMES", "VERIFY_FAMILIES"]
