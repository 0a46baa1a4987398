"""The dense-queue MoCo application (paper §12, Table 9): seven methods per seed, linear probe."""
from ._app import MocoPreset as MocoPreset, PRESETS as PRESETS, check_threads as check_threads, resolve_device as resolve_device, run_moco as run_moco, scores_path as scores_path
from ._summary import KEY as KEY, METHODS as METHODS, TABLE as TABLE, failed_runs as failed_runs, launch_units as launch_units, refuse_foreign_rows as refuse_foreign_rows, score_file_problem as score_file_problem, summarize as summarize, write_summary as write_summary

__all__ = ["KEY", "METHODS", "MocoPreset", "PRESETS", "TABLE", "check_threads", "failed_runs",
           "launch_units", "refuse_foreign_rows", "resolve_device", "run_moco", "score_file_problem", "scores_path", "summarize", "write_summary"]
