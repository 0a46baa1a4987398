"""stateremat.experiments (see DESIGN.md, layer `experiments`)."""
from ._process_cohort import run_process_cohort as run_process_cohort  # issue 9
