"""The ``bench`` table (one row per measured step of a method in a cell): schema, key, rules.

Written by ``stateremat bench`` (``paper.bench``), summarised from the rows by its
``summary.json``; declared here so every reader checks them, whatever it imported.
"""
from __future__ import annotations

import pyarrow as pa

from ...limits import MAX_STEPS, MAX_WARMUPS
from .._store import declare_table
from .._values import (config_device, config_entry, config_value, in_config, integer, number, text,
                       text_list)
from ._measured import (CELL_CONSTANT, MEASURED_VALUES, METHOD_CONSTANT, ROW_RULES, RUN_CONSTANT,
                        step_rule)

#: The seven methods, in the paper's table order (Table 6).
METHODS = ("eager", "whole", "regions", "functional", "state_agnostic", "eager_whole", "joint")
TABLE = "bench"
#: The bench table's row schema (names, types; key columns never null); ``budget_rule``
#: and ``torch_threads`` came later, so older parts may lack them.
COLUMNS = [
    ("experiment", pa.string()), ("preset", pa.string()), ("cell", pa.string()),
    ("budget_bytes", pa.int64()), ("budget_rule", pa.string()), ("profile_hash", pa.string()),
    ("source_hash", pa.string()), ("memory_method", pa.string()), ("device", pa.string()),
    ("dtype", pa.string()), ("min_eager_whole_peak_bytes", pa.int64()),
    ("min_joint_peak_bytes", pa.int64()), ("workload", pa.string()),
    ("state_bytes", pa.int64()), ("write_fraction", pa.float64()),
    ("live_versions", pa.int64()), ("segments", pa.int64()), ("width", pa.int64()),
    ("batch", pa.int64()), ("granularity_bytes", pa.int64()), ("dropout", pa.float64()),
    ("seed", pa.int64()), ("method", pa.string()), ("feasible", pa.bool_()),
    ("policy", pa.string()), ("predicted_peak_bytes", pa.int64()),
    ("predicted_time_s", pa.float64()), ("semantic_checks", pa.string()),
    ("semantic_max_error", pa.float64()), ("semantic_detail", pa.string()),
    ("error", pa.string()), ("step", pa.int64()), ("loadavg", pa.string()),
    ("step_time_s", pa.float64()), ("peak_bytes", pa.int64()), ("fits_budget", pa.bool_()),
]
KEY = ("cell", "method", "step")
COLUMNS.append(("torch_threads", pa.int64()))  # the process's torch threads, when recorded
#: Value rules (checked on every read, against the run's sidecar config): a row is of the
#: run's experiment, preset, cells, methods and budget, its step one the run took (or an
#: infeasible method's lone -1 row), a method's plan the same in each of its rows.
VALUES = {**MEASURED_VALUES, **ROW_RULES, "step": step_rule(("cell", "method")),
          "experiment": config_value("experiment"),
          "preset": config_value("preset"), "device": config_device(), "cell": in_config("cells"),
          "method": in_config("methods"), "budget_bytes": config_value("budget_bytes"),
          "budget_rule": config_entry("budget_rule", by="cell"),
          "torch_threads": number(1, missing=True)}
#: Sidecar config fields, checked before a reader sizes its work from them.
CONFIG = {"experiment": text(), "preset": text(), "device": text(), "cells": text_list(10_000),
          "methods": text_list(len(METHODS)), "budget_bytes": integer(0, 2**63 - 1),
          "warmups": integer(0, MAX_WARMUPS), "steps": integer(1, MAX_STEPS)}
#: Columns one value in all rows of a (cell, method), of a cell, of the run.
CONSTANT_IN = {("cell", "method"): METHOD_CONSTANT, ("cell",): CELL_CONSTANT, (): RUN_CONSTANT}
declare_table(TABLE, COLUMNS, KEY, optional=("budget_rule", "torch_threads"), values=VALUES,
              config=CONFIG, constant_in=CONSTANT_IN)
