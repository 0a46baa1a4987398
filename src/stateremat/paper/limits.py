"""The paper commands' count limits, where both the commands and the records readers see them.

The commands check their options against them (``cli._limits``); the records tables check a
sidecar's config against the same numbers before a reader sizes work from it.
"""
from __future__ import annotations

#: Programs of ``verify finite`` / ``verify engines`` (paper: 1,024 and 1,200).
MAX_PROGRAMS = 100_000
#: Seeds of ``verify alias`` (paper: 50) and ``cohort semantics`` (paper: 50).
MAX_STUDY_SEEDS = 10_000
#: Seeds of ``app moco`` (paper: 6).
MAX_MOCO_SEEDS = 1_000
#: Processes of ``cohort processes`` (paper: 50) and concurrent jobs.
MAX_PROCESSES = 10_000
MAX_JOBS = 1_024
#: CPU threads per process.
MAX_THREADS = 1_024
#: Measured steps and warmups per method (paper: at most 1,000 and 50).
MAX_STEPS = 10_000
MAX_WARMUPS = 1_000
