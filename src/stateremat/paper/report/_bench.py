"""The bench reporter: re-renders a bench run folder's summary and tables from its raw rows.

Every number is recomputed from the ``bench`` records through
:func:`stateremat.paper.bench.summarize`; nothing is read from ``summary.json``. The tables
themselves are the bench's (:func:`stateremat.paper.bench.render_bench`).
"""
from __future__ import annotations

from pathlib import Path

from ..._shared.io import atomic_write_json
from ._registry import Expected, register_reporter, steps_done


def expected_bench(doc: dict, out_dir: Path) -> Expected:
    """Every (cell, method) of the experiment; complete with all its measured steps (or an
    infeasible row)."""
    from ..bench import experiment_spec

    config = doc["config"]
    spec = experiment_spec(config["experiment"], config["preset"])
    units = [(c.name, m) for c in spec.cells if c.name in config["cells"] for m in c.methods]
    return Expected(("cell", "method"), units, steps_done(int(config["steps"])), "(cell, method)")


@register_reporter("bench", outputs=("summary.json", "tables.md"), expected=expected_bench)
def report_bench(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Write ``summary.json`` and ``tables.md`` for a bench run folder from its raw rows (into
    ``dest``, default the run folder)."""
    from ..bench import bench_summary, write_bench_tables

    summary = bench_summary(out_dir)
    dest = Path(dest or out_dir)
    return [atomic_write_json(dest / "summary.json", summary), write_bench_tables(dest, summary)]
