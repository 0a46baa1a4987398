"""Markdown tables of the cost-runtime benches (paper Tables 4, 5, 6, 10), from a bench summary.

The summary is recomputed from the ``bench`` records by :func:`stateremat.paper.bench.summarize`;
nothing here reads rows. Sizes are shown in MiB for the ``cpu`` preset (bytes / 1024 of the
paper's GiB) and GiB for ``h100``, so the cpu tables read like the paper's with the unit shifted
by 1024. They live with the bench (not in ``report``) because :func:`run_experiment` writes them
at the end of a run and ``report`` imports the bench, never the reverse.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ...contract import OPTIONS
from ..._shared.io import atomic_write_bytes
from .. import method_label


def _unit(preset: str) -> tuple[str, int]:
    return ("GiB", 1024**3) if preset == "h100" else ("MiB", 1024**2)


def _policy(p) -> str:
    if not p:
        return "—"
    c = Counter(p)
    return ", ".join(f"{c[o]} {o}" for o in OPTIONS.names if c[o])


def _fmt(v, div, nd=3) -> str:
    return "—" if v is None else f"{v / div:.{nd}f}"


def method_table(summary: dict) -> str:
    """Table 6 layout: one row per method of each cell (peak, mean step ms, fits, predictions)."""
    unit, div = _unit(summary["preset"])
    out = []
    for cell in summary["cells"]:
        rule = cell.get("budget_rule", "fixed")
        out.append(f"### {summary['experiment']} — cell `{cell['cell']}`, logical budget "
                   f"{cell['budget_bytes'] / div:g} {unit}"
                   + ("" if rule == "fixed" else f" ({rule})") + "\n")
        out.append(f"| Method | Peak {unit} | Step ms (mean) | Step ms (median) | Fits? | "
                   f"Predicted {unit} | Predicted ms | Policy | Checks |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for m in cell["methods"]:
            if not m["feasible"]:
                out.append(f"| {method_label(m['method'])} | infeasible | — | — | — | — | — | — | not run |")
                continue
            pt = m["predicted_time_s"]
            out.append(
                f"| {method_label(m['method'])} | {_fmt(m['peak_bytes'], div)} | "
                f"{_fmt(m['step_time_s'], 1e-3, 2)} | {_fmt(m['step_time_median_s'], 1e-3, 2)} | "
                f"{'Yes' if m['fits_budget'] else 'No'} | {_fmt(m['predicted_peak_bytes'], div)} | "
                f"{_fmt(pt, 1e-3, 2)} | {_policy(m['policy'])} | {m['semantic_checks']} |")
        out.append("")
    return "\n".join(out)


def pressure_tables(summary: dict) -> str:
    """Table 4 (peak / mean step ms per method, or infeasible) and Table 5 (min eager/whole peak)."""
    unit, div = _unit(summary["preset"])
    methods = ["eager", "whole", "regions", "functional", "state_agnostic", "joint"]
    lines = [f"### Table 4 — peak {unit} / mean step ms (budget {summary['budget_bytes'] / div:g} {unit})\n",
             "| Cell | " + " | ".join(method_label(m) for m in methods) + " |",
             "|---|" + "---|" * len(methods)]
    for cell in summary["cells"]:
        by = {m["method"]: m for m in cell["methods"]}
        vals = []
        for m in methods:
            e = by.get(m)
            if e is None:
                vals.append("—")
            elif not e["feasible"]:
                vals.append("Infeasible")
            else:
                vals.append(f"{_fmt(e['peak_bytes'], div, 2)} / {_fmt(e['step_time_s'], 1e-3, 1)}")
        lines.append(f"| {cell['cell']} | " + " | ".join(vals) + " |")
    lines += ["", f"### Table 5 — minimum predicted peak of correctly costed eager/whole policies\n",
              f"| Cell | Min eager/whole {unit} | Fits {summary['budget_bytes'] / div:g} {unit}? | "
              f"Min joint {unit} | Joint fits? |", "|---|---|---|---|---|"]
    for cell in summary["cells"]:
        ew, jt, b = cell["min_eager_whole_peak_bytes"], cell["min_joint_peak_bytes"], cell["budget_bytes"]
        lines.append(f"| {cell['cell']} | {_fmt(ew, div, 4)} | {'Yes' if ew is not None and ew <= b else 'No'} "
                     f"| {_fmt(jt, div, 4)} | {'Yes' if jt is not None and jt <= b else 'No'} |")
    return "\n".join(lines) + "\n"


def calibration_table(summary: dict) -> str:
    """Table 10: regions / whole and regions / eager ratios of peak and mean step time."""
    lines = ["### Table 10 — regions ratios (peak = max measured bytes, time = mean step)\n",
             "| Workload | MiB (paper) | Write (%) | Live | Peak/whole | Time/whole | Peak/eager | "
             "Time/eager | Joint policy | Checks |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in summary["cells"]:
        by = {m["method"]: m for m in cell["methods"]}

        def ratio(a, b, key):
            x, y = by.get(a), by.get(b)
            if not x or not y or x[key] is None or y[key] is None or not y[key]:
                return "—"
            return f"{x[key] / y[key]:.3f}"

        paper_mib = cell["state_bytes"] * (1024 if summary["preset"] == "cpu" else 1) // 1024**2
        checks = "pass" if all(m["semantic_checks"] == "pass" for m in cell["methods"]) else "FAIL"
        lines.append(
            f"| {cell['workload']} | {paper_mib} | {cell['write_fraction'] * 100:g} | "
            f"{cell['live_versions']} | {ratio('regions', 'whole', 'peak_bytes')} | "
            f"{ratio('regions', 'whole', 'step_time_s')} | {ratio('regions', 'eager', 'peak_bytes')} | "
            f"{ratio('regions', 'eager', 'step_time_s')} | "
            f"{_policy((by.get('joint') or {}).get('policy'))} | {checks} |")
    return "\n".join(lines) + "\n"


def render(summary: dict) -> str:
    """All markdown tables of one bench summary."""
    name = summary["experiment"]
    head = (f"# stateremat bench {name} — preset {summary['preset']}, device {summary['device']}, "
            f"memory: {summary['memory_method']}\n\n")
    if name == "calibrate":
        return head + calibration_table(summary) + "\n" + method_table(summary)
    if name == "pressure":
        return head + pressure_tables(summary) + "\n" + method_table(summary)
    return head + method_table(summary)


def write_tables(out_dir: Path, summary: dict) -> Path:
    """Render ``summary`` once into ``out_dir/tables.md`` (atomically); returns the path."""
    return atomic_write_bytes(Path(out_dir) / "tables.md", render(summary).encode())
