"""The paper wing: reproduces the studies of arXiv 2611.00590 on top of the library.

Subpackages: ``workloads`` and ``profile`` (built-in stateful chains, MoCo, and their
profiler), ``bench`` (experiment specs, methods, the one runner, summaries), ``cohort``
(independent-process cohorts), ``semantics`` (Torch/JAX replay-semantics cohort), ``moco``
(dense-queue application), ``verify`` (finite suites, engine and alias studies), ``records``
(raw rows, and every table's declaration, below the wings that write them), ``stats``,
``report`` (tables and figures) and ``cli`` (the paper commands).
Needs the ``[paper]`` extra (pandas, pyarrow, matplotlib, dask). The library never imports it.
"""
from ._methods import METHOD_OPTION as METHOD_OPTION, method_label as method_label
from .._shared.progress import NO_PROGRESS as NO_PROGRESS, Progress as Progress, Task as Task, as_progress as as_progress

__all__ = ["METHOD_OPTION", "NO_PROGRESS", "Progress", "Task", "as_progress", "method_label"]
