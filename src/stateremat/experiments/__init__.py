"""stateremat.experiments (see DESIGN.md, layer `experiments`)."""
from ._process_cohort import run_process_cohort as run_process_cohort  # issue 9
from ._moco_app import PRESETS as MOCO_PRESETS, run_moco as run_moco, summarize as summarize_moco  # issue 6
from ._spec import Cell as Cell, ExperimentSpec as ExperimentSpec, METHODS as METHODS, experiment_spec as experiment_spec  # issue 5
from ._runner import cell_card as cell_card, run_cell_methods as run_cell_methods  # issue 5
from ._bench import run_experiment as run_experiment, run_fair as run_fair  # issue 5
