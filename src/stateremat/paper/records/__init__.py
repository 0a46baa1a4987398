"""Raw execution records of the paper's runs: Parquet parts + JSON sidecar, atomic, resumable.

Every row is kept (matches, rejections, divergences); summaries are recomputed from the rows
by separate code (DESIGN.md, "Records and artifacts"). Every table the paper's commands write
is declared here, in :mod:`.tables` (row schema, key, value rules, sidecar config fields), which
this package imports: whatever a process imported, a reader or writer of a table checks its
rows against its spec (:func:`table_spec`). The wings that write the tables import their names
and specs from here, never the reverse. An unusable folder, sidecar or part raises
:class:`RecordsError` (a ``ValueError``).
"""
from ._errors import RecordsError as RecordsError
from ._store import (TEMP_DIR as TEMP_DIR, RecordStore as RecordStore,
                     check_not_writing as check_not_writing, check_resumable as check_resumable,
                     claim_folder as claim_folder,
                     declare_table as declare_table, lock_run as lock_run,
                     read_records as read_records,
                     read_sidecar as read_sidecar, table_spec as table_spec,
                     PART_KEY as PART_KEY, RUN_ID as RUN_ID, new_run_id as new_run_id,
                     part_identity as part_identity)
from ._units import (first_part_holding as first_part_holding, foreign_units_message as foreign_units_message,
                     refuse_units_outside as refuse_units_outside, units_outside as units_outside)
from ._values import (Rule as Rule, all_of as all_of, constant as constant,
                      implies as implies, marker_alone as marker_alone, step_index as step_index,
                      below_config as below_config, config_device as config_device,
                      config_entry as config_entry,
                      config_value as config_value,
                      in_config as in_config, int_list as int_list, integer as integer,
                      number as number, one_of as one_of, set_text as set_text, text as text,
                      text_list as text_list)
from . import tables as tables  # noqa: E402  (declares every table; after declare_table)

__all__ = ["PART_KEY", "RUN_ID", "RecordStore", "RecordsError", "Rule", "new_run_id", "TEMP_DIR", "all_of",
           "constant", "implies", "marker_alone", "step_index", "below_config", "config_device", "first_part_holding", "foreign_units_message",
           "refuse_units_outside", "units_outside",
           "config_entry",
           "config_value", "in_config", "int_list", "integer", "number", "one_of",
           "part_identity", "set_text", "text", "text_list", "check_not_writing",
           "check_resumable", "claim_folder", "declare_table", "lock_run", "read_records",
           "read_sidecar", "table_spec"]
