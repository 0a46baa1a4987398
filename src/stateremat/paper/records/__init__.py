"""Raw execution records of the paper's runs: Parquet parts + JSON sidecar, atomic, resumable.

Every row is kept (matches, rejections, divergences); summaries are recomputed from the rows
by separate code (DESIGN.md, "Records and artifacts").
"""
from ._store import (TEMP_DIR as TEMP_DIR, RecordStore as RecordStore,
                     check_not_writing as check_not_writing, check_resumable as check_resumable,
                     claim_folder as claim_folder,
                     declare_table as declare_table, lock_run as lock_run,
                     read_records as read_records,
                     read_sidecar as read_sidecar, table_spec as table_spec)

__all__ = ["RecordStore", "TEMP_DIR", "check_not_writing", "check_resumable", "claim_folder", "declare_table",
           "lock_run", "read_records", "read_sidecar", "table_spec"]
