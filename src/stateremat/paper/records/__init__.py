"""Raw execution records of the paper's runs: Parquet parts + JSON sidecar, atomic, resumable.

Every row is kept (matches, rejections, divergences); summaries are recomputed from the rows
by separate code (DESIGN.md, "Records and artifacts").
"""
from ._store import RecordStore as RecordStore, read_records as read_records

__all__ = ["RecordStore", "read_records"]
