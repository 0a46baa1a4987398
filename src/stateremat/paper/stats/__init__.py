"""Statistics of independent-process cohorts (paper §11).

Per process: mean step time per method; paired ratio per process; point estimate = the
geometric mean of process ratios; intervals from paired process-bootstrap draws
(``scipy.stats.bootstrap`` on log ratios), Bonferroni-adjusted across a cohort's
prespecified comparisons. Infeasible methods get no time (never infinite).
"""
from ._bootstrap import (
    FAMILY_ALPHA as FAMILY_ALPHA,
    N_RESAMPLES as N_RESAMPLES,
    RatioEstimate as RatioEstimate,
    bonferroni_level as bonferroni_level,
    bootstrap_ratio as bootstrap_ratio,
)
from ._cohort import (
    Comparison as Comparison,
    compare as compare,
    comparisons_from as comparisons_from,
    family_size as family_size,
    method_table as method_table,
)
from ._ratios import (
    geometric_mean as geometric_mean,
    paired_ratios as paired_ratios,
    process_means as process_means,
)

__all__ = [
    "FAMILY_ALPHA", "N_RESAMPLES", "Comparison", "RatioEstimate", "bonferroni_level",
    "bootstrap_ratio", "compare", "comparisons_from", "family_size", "geometric_mean",
    "method_table", "paired_ratios", "process_means",
]
