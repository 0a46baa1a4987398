"""Reporter of independent-process cohorts: summary.json, Tables 7/8, Figures 1 and 3.

Every number is recomputed from the raw ``cohort_timing`` rows and the frozen cohort
configuration in its sidecar (budgets, prespecified comparisons); nothing the runner
computed is reused. Paper §11, Tables 7 and 8, Figures 1 and 3.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..records import RecordsError
from ..._shared.io import atomic_write_bytes, atomic_write_json
from ..cohort import check_timing_attempts
from ..records import read_records, read_sidecar
from ..stats import FAMILY_ALPHA, N_RESAMPLES, compare, comparisons_from, method_table
from ._figures import method_color, new_figure, save_figure
from ._registry import Expected, register_reporter, steps_done
from ._tables import byte_unit, fmt, markdown_table, method_label, method_rank, time_unit

TIMING_TABLE = "cohort_timing"
STATUS_TABLE = "cohort_processes"
BOOTSTRAP_SEED = 0
OVER = "over budget"  # logical budget exceeded; never an OOM (nothing is enforced)


def cohort_summary(out_dir: str | Path, *, n_resamples: int = N_RESAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """Recompute the cohort summary from raw rows.

    Args:
        out_dir: cohort run folder (``cohort_timing`` table + sidecar).
        n_resamples: bootstrap draws per interval (paper: 20,000).
        seed: bootstrap seed (recorded).

    Returns:
        ``{"experiment", "preset", "device", "n_processes", "cells", "methods" (Table 7 rows),
        "comparisons" (Table 8 rows: comparison, cell, time_ratio, ci, peak_ratio, peak_ci,
        fits, ...), "family_alpha", "confidence_level", "n_resamples", "bootstrap",
        "profile_hashes", "source_hashes", "memory_methods", "attempts"}``.

    Raises:
        RecordsError: if ``out_dir`` has no cohort rows.
    """
    out_dir = Path(out_dir)
    rows = read_records(out_dir, TIMING_TABLE)
    if rows.empty:
        raise RecordsError(f"stateremat report: {out_dir} has no '{TIMING_TABLE}' rows. Tip: run "
                           "`stateremat cohort processes ... --out DIR` first (a process's rows "
                           "appear when it finishes).")
    sidecar = out_dir / f"{TIMING_TABLE}.json"
    doc = read_sidecar(sidecar)  # unreadable, not UTF-8 or not JSON: names the file
    try:
        config = doc["config"]
        config["cells"], config["comparisons"]
    except (KeyError, TypeError) as exc:
        raise RecordsError(f"stateremat report: {sidecar} is not a cohort sidecar with a "
                           f"'config' holding 'cells' and 'comparisons' ({type(exc).__name__}: "
                           f"{exc}). Tip: report a folder written by `stateremat cohort "
                           "processes`.") from None
    budgets = {c["cell"]: c["budget_bytes"] for c in config["cells"]}
    if "budget_bytes" in rows:  # every process must have planned under the frozen budget
        bad = rows[rows["budget_bytes"] != rows["cell"].map(budgets)]
        if not bad.empty:
            r = bad.iloc[0]
            raise RecordsError(
                f"stateremat report: {len(bad)} rows of {out_dir} (first: process {r['process']}, "
                f"cell {r['cell']!r}) were planned under budget {r['budget_bytes']} bytes, but the "
                f"cohort froze {budgets.get(r['cell'])} bytes. Tip: a worker ran other code or "
                "options; rerun those processes into a new --out folder.")
    comps = comparisons_from(config["comparisons"])
    table = sorted(method_table(rows, budgets),
                   key=lambda r: ([c["cell"] for c in config["cells"]].index(r["cell"])
                                  if r["cell"] in budgets else 99, method_rank(r["method"])))
    results = compare(rows, comps, seed=seed, n_resamples=n_resamples)
    status = read_records(out_dir, STATUS_TABLE)
    _check_attempts(out_dir, rows, status)
    attempts = ({s: int(n) for s, n in status["status"].value_counts().items()}
                if not status.empty else {})
    return {
        "experiment": config["experiment"], "preset": config["preset"],
        "device": config["device"], "seed": config["seed"],
        "n_processes": int(rows["process"].nunique()),
        "cells": config["cells"],
        "comparisons": results,
        "methods": table,
        "family_alpha": FAMILY_ALPHA,
        "confidence_level": results[0]["confidence_level"] if results else None,
        "n_resamples": n_resamples,
        "bootstrap": {"method": "percentile", "statistic": "mean of per-process log ratios",
                      "library": "scipy.stats.bootstrap", "seed": seed},
        "profile_hashes": _unique(rows, "profile_hash"),
        "source_hashes": _unique(rows, "source_hash"),
        "memory_methods": _unique(rows, "memory_method"),
        "semantic_checks": _unique(rows, "semantic_checks"),
        "attempts": attempts,
        # in launch order (parts are read in write order): a retry with a smaller N shows too
        "requested_processes": (list(dict.fromkeys(int(v) for v in status["requested_processes"].dropna()))
                                if "requested_processes" in status else None),
        "profile": config.get("profile"),
        "profile_frozen": _profile_frozen(rows, config.get("profile")),
    }


def _profile_frozen(rows: pd.DataFrame, frozen: dict | None) -> bool | None:
    """Every row planned on its cell's frozen card (None: no card was frozen)."""
    if not frozen or "profile_hash" not in rows:
        return None
    want = rows["cell"].map(frozen)
    return bool((rows["profile_hash"] == want).all())


def _unique(rows: pd.DataFrame, col: str) -> list:
    return sorted(map(str, rows[col].dropna().unique())) if col in rows else []


def _check_attempts(out_dir: Path, timing: pd.DataFrame, status: pd.DataFrame) -> None:
    """:func:`check_timing_attempts` for a report. A status table whose sidecar is there but whose
    rows are gone (moved away) is reported incomplete by itself ("no rows yet", exit 1), and says
    nothing about the timing rows: they are not refused as another run's then."""
    if status.empty and (Path(out_dir) / f"{STATUS_TABLE}.json").is_file():
        return
    check_timing_attempts(out_dir, timing, status)


def expected_cohort(doc: dict, out_dir: Path) -> Expected:
    """Every (process, cell, method) of processes ``0..N-1``, N the largest launch's
    ``--processes``; a unit is complete with all its measured steps (or an infeasible row) and
    no row that raised (an ``error`` row is a failed method, never an infeasible one).

    Raises:
        RecordsError: a frozen card under ``profile/`` is missing or differs from the hash the
            config recorded (the rows were planned on another card).
    """
    check_frozen_cards(doc["config"], out_dir)
    status = read_records(out_dir, STATUS_TABLE)
    _check_attempts(out_dir, read_records(out_dir, TIMING_TABLE), status)
    n = int(status["requested_processes"].max()) if "requested_processes" in status else 0
    cells = doc["config"]["cells"]
    finished = {c["cell"]: steps_done(int(c["steps"])) for c in cells}
    problems: dict[tuple, str] = {}

    def done(g: pd.DataFrame) -> bool:
        err = g[g["error"].fillna("").astype(str) != ""] if "error" in g else g.iloc[:0]
        if not err.empty:
            r = err.iloc[0]
            problems[(int(r["process"]), str(r["cell"]), str(r["method"]))] = (
                f"{len(err)} row(s) raised: {str(r['error']).strip().splitlines()[-1][:120]}")
            return False
        return finished[g["cell"].iloc[0]](g)

    units = [(p, c["cell"], m) for p in range(n) for c in cells for m in c["methods"]]
    return Expected(("process", "cell", "method"), units, done, "(process, cell, method)",
                    why=problems.get)


def check_frozen_cards(config: dict, out_dir: Path) -> None:
    """Refuse a cohort folder whose frozen cards (``profile/<cell>.json``) are missing or no
    longer the cards its config recorded (by hash).

    Raises:
        RecordsError: naming the card file and what differs.
    """
    from ...contract import ProfileCardError, load_card

    for cell, want in (config.get("profile") or {}).items():
        rel = f"profile/{cell}.json"
        path = Path(out_dir) / rel
        tip = ("Tip: restore the original card (e.g. from a copy of the run folder); rerunning "
               "`stateremat cohort processes` with --profile and the original cards restores a "
               "missing one.")
        if not path.exists():
            raise RecordsError(f"frozen card {rel} of {out_dir} is missing, so nothing shows "
                               f"what the rows were planned on. {tip}")
        try:
            got = load_card(path).source_hash()
        except ProfileCardError as exc:
            raise RecordsError(f"frozen card {rel} of {out_dir} is unreadable ({exc}). {tip}") \
                from None
        if got != want:
            raise RecordsError(f"frozen card {rel} of {out_dir} differs from the card the run "
                               f"froze (hash {got[:12]}…, the config recorded {want[:12]}…): it "
                               f"was edited after the rows were planned on it. {tip}")


@register_reporter(TIMING_TABLE, outputs=("summary.json", "cohort.md", "figure1.png", "figure1.svg",
                                          "figure3.png", "figure3.svg"), expected=expected_cohort)
def report_cohort(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Write ``summary.json``, ``cohort.md``, ``figure1.{png,svg}``, ``figure3.{png,svg}`` (into
    ``dest``, default the run folder)."""
    out_dir = Path(out_dir)
    s = cohort_summary(out_dir)
    dest = Path(dest or out_dir)
    paths = [atomic_write_json(dest / "summary.json", s)]
    paths.append(atomic_write_bytes(dest / "cohort.md", cohort_markdown(s).encode()))
    paths += figure_step_time(s, dest / "figure1")
    paths += figure_memory_time(s, dest / "figure3")
    return paths


@register_reporter(STATUS_TABLE, outputs=("processes.md",))
def report_processes(out_dir: Path, dest: Path | None = None) -> list[Path]:
    """Write ``processes.md``: every launch attempt with its status and exit code."""
    st = read_records(out_dir, STATUS_TABLE)
    def count(v):  # exit_code and n_rows may be missing (the schema allows it)
        return "–" if pd.isna(v) else int(v)

    rows = [[int(r.process), int(r.attempt), r.status, count(r.exit_code), r.hostname,
             f"{r.wall_s:.1f}", count(r.n_rows),
             (str(r.stderr_tail).strip().splitlines() or [""])[-1][:80] if r.status != "ok"
             else ""] for r in st.sort_values(["process", "attempt"]).itertuples()]
    md = ("# Cohort processes (every launch attempt)\n\n" + markdown_table(
        ["process", "attempt", "status", "exit code", "host", "wall s", "rows", "last stderr"],
        rows))
    return [atomic_write_bytes(Path(dest or out_dir) / "processes.md", md.encode())]


def cohort_markdown(s: dict[str, Any]) -> str:
    """Table 7-style per-method outcomes and Table 8-style comparisons as markdown."""
    n = s["n_processes"]
    lines = [f"# Independent-process cohort `{s['experiment']}` (preset `{s['preset']}`, "
             f"device `{s['device']}`)\n",
             f"{n} completed independent processes"
             + (f" (launches asked for N = {', '.join(map(str, s['requested_processes']))})"
                if s.get("requested_processes") else "") + f". Time is the arithmetic mean of the {n} "
             "process means; peak is the mean of per-process peaks (range when they differ); "
             "Fits counts processes whose observed peak stays within the logical budget. The "
             "budget is not enforced: exceeding it is *over budget*, not an out-of-memory "
             "event. A method without a feasible static policy is listed as infeasible and "
             "has no time.\n"]
    for cell in s["cells"]:
        rows = [r for r in s["methods"] if r["cell"] == cell["cell"]]
        tu, tm = time_unit(max([r["mean_step_time_s"] or 0 for r in rows] + [0]))
        bu, bd = byte_unit(max([r["peak_bytes"] or 0 for r in rows] + [cell["budget_bytes"]]))
        rule = cell.get("budget_rule", "fixed")
        lines.append(f"## Cell `{cell['cell']}` — budget {cell['budget_bytes'] / bd:.3f} {bu}"
                     + ("" if rule == "fixed" else f" ({rule}, frozen card)") + ", "
                     f"{cell['warmups']} warmups + {cell['steps']} measured steps per method\n")
        body = []
        for r in rows:
            checks = f"{r['semantic_pass']}/{r['n_processes']}"
            if r["n_errors"]:
                checks += f" ({r['n_errors']} steps raised)"
            if r["mean_step_time_s"] is None:
                body.append([method_label(r["method"]), "infeasible", "—", f"0/{n}", "—"])
                continue
            peak = f"{r['peak_bytes'] / bd:.3f}"
            if r["peak_bytes_min"] != r["peak_bytes_max"]:
                peak += f" ({r['peak_bytes_min'] / bd:.3f}–{r['peak_bytes_max'] / bd:.3f})"
            body.append([method_label(r["method"]), f"{r['mean_step_time_s'] * tm:.2f}", peak,
                         f"{r['fits']}/{r['n_processes']}", checks])
        lines.append(markdown_table(["Method", f"Step {tu}", f"Peak {bu}", "Fits",
                                     "Checks pass"], body))
    if s["comparisons"]:
        lvl = s["confidence_level"]
        lines.append(f"## Prespecified comparisons\n\nGeometric means of per-process paired "
                     f"ratios (lower is better). Brackets: {100 * lvl:.2f}% paired "
                     f"process-bootstrap intervals ({s['n_resamples']:,} draws, percentile, "
                     f"Bonferroni-adjusted for a family-wise {100 * s['family_alpha']:.0f}% "
                     "across the primary metrics). Point intervals reflect identical observed "
                     "values, not absence of population uncertainty.\n")
        body = []
        for c in s["comparisons"]:
            prim = set(c["primary"])
            body.append([c["comparison"], c["cell"],
                         _ratio(c["time_ratio"], c["ci"]) + ("" if "time" in prim else " †"),
                         _ratio(c["peak_ratio"], c["peak_ci"]) + ("" if "peak" in prim else " †"),
                         ", ".join(f"{k} {v}/{n}" for k, v in c["fits"].items()),
                         c["n_processes"]])
        lines.append(markdown_table(["Comparison", "Cell", "Step time", "Peak memory", "Fits",
                                     "Paired processes"], body))
        lines += [f"- `{c['comparison']}`: {c['note']}.\n" for c in s["comparisons"] if c["note"]]
        if any(set(c["primary"]) != {"time", "peak"} for c in s["comparisons"]):
            lines.append("† secondary metric (not in the prespecified family).\n")
    lines.append(f"Profile hashes: {', '.join(h[:12] for h in s['profile_hashes']) or '—'} "
                 f"(frozen for every process: {s['profile_frozen']}); "
                 f"memory method: {', '.join(s['memory_methods']) or '—'}; semantic checks: "
                 f"{', '.join(s['semantic_checks']) or '—'}; attempts: {s['attempts']}.\n")
    return "\n".join(lines)


def _ratio(point: float | None, ci: list) -> str:
    if point is None:
        return "—"
    if ci[0] is None:
        return f"{point:.4f}"
    return f"{point:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"


def _short(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def figure_step_time(s: dict[str, Any], stem: Path) -> list[Path]:
    """Figure 1: mean step time per method; over-budget bars hatched; labels time and peak."""
    fig, axes = new_figure(len(s["cells"]), panel_height_in=0.45 * 7 + 1.0)
    n = s["n_processes"]
    for ax, cell in zip(axes, s["cells"]):
        rows = [r for r in s["methods"] if r["cell"] == cell["cell"]][::-1]
        tu, tm = time_unit(max([r["mean_step_time_s"] or 0 for r in rows] + [0]))
        bu, bd = byte_unit(max([r["peak_bytes"] or 0 for r in rows] + [cell["budget_bytes"]]))
        xmax = max([r["max_step_time_s"] or 0 for r in rows] + [1e-9]) * tm
        for i, r in enumerate(rows):
            if r["mean_step_time_s"] is None:
                ax.text(0, i, "  no feasible policy (static model)", va="center", fontsize=8)
                continue
            t = r["mean_step_time_s"] * tm
            over = r["fits"] < r["n_processes"]
            ax.barh(i, t, color=method_color(r["method"]), hatch="///" if over else None,
                    edgecolor="black", linewidth=0.6)
            ax.errorbar(t, i, xerr=[[t - r["min_step_time_s"] * tm],
                                    [r["max_step_time_s"] * tm - t]],
                        fmt="none", ecolor="black", capsize=2, linewidth=0.8)
            label = f"  {_short(t)} {tu}, {_short(r['peak_bytes'] / bd)} {bu}"
            if over:
                label += f", {OVER}" + ("" if r["fits"] == 0 else f" in {r['n_processes'] - r['fits']}/{r['n_processes']}")
            ax.text(r["max_step_time_s"] * tm, i, label, va="center", fontsize=8)
        ax.set_yticks(range(len(rows)), [method_label(r["method"]) for r in rows])
        ax.set_xlim(0, xmax * 1.9)
        ax.set_xlabel(f"Mean step time ({tu}), {n} processes; whiskers: range of process means")
        ax.set_title(f"{s['experiment']} / {cell['cell']}: budget "
                     f"{cell['budget_bytes'] / bd:.3g} {bu} (hatched: {OVER}, logical)",
                     fontsize=9)
    return save_figure(fig, stem)


def figure_memory_time(s: dict[str, Any], stem: Path) -> list[Path]:
    """Figure 3: peak memory vs mean step time per method; region above the budget shaded."""
    fig, axes = new_figure(len(s["cells"]), panel_height_in=4.0)
    for ax, cell in zip(axes, s["cells"]):
        rows = [r for r in s["methods"] if r["cell"] == cell["cell"]
                and r["mean_step_time_s"] is not None]
        tu, tm = time_unit(max([r["mean_step_time_s"] for r in rows] + [0]))
        budget = cell["budget_bytes"]
        bu, bd = byte_unit(max([r["peak_bytes"] for r in rows] + [budget]))
        xs = [r["peak_bytes"] / bd for r in rows] + [budget / bd]
        lo, hi = min(xs), max(xs)
        pad = 0.08 * (hi - lo or hi or 1.0)
        ax.axvspan(budget / bd, hi + 2.5 * pad, color="#f4cccc", alpha=0.6,
                   label=f"above the logical {budget / bd:.3g} {bu} budget (not an OOM)")
        ax.axvline(budget / bd, color="#cc0000", linewidth=0.8)
        for i, r in enumerate(sorted(rows, key=lambda r: r["peak_bytes"])):
            x, y = r["peak_bytes"] / bd, r["mean_step_time_s"] * tm
            ax.errorbar(x, y, yerr=[[y - r["min_step_time_s"] * tm],
                                    [r["max_step_time_s"] * tm - y]],
                        fmt="o", color=method_color(r["method"]), ecolor="#b0b0b0", capsize=2,
                        elinewidth=0.8, zorder=3,
                        markersize=7 if r["method"] in ("joint", "eager_whole") else 5)
            ax.annotate(method_label(r["method"]), (x, y), textcoords="offset points",
                        xytext=(6, 5 if i % 2 == 0 else -12), fontsize=8, zorder=4,
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                              "alpha": 0.8})  # alternate above/below: neighbours are close
        missing = [method_label(r["method"]) for r in s["methods"]
                   if r["cell"] == cell["cell"] and r["mean_step_time_s"] is None]
        if missing:
            ax.text(0.01, 0.99, "no feasible policy, no point: " + ", ".join(missing),
                    transform=ax.transAxes, va="top", fontsize=8)
        ax.set_xlim(max(0.0, lo - pad), hi + 2.5 * pad)  # room for the rightmost label
        how = {"cpu_live_storage_tracker": "CPU live-storage tracker",
               "cuda_max_memory_allocated": "CUDA max allocated"}
        ax.set_xlabel(f"Peak memory ({bu}; "
                      f"{', '.join(how.get(m, m) for m in s['memory_methods']) or 'measured'})")
        ax.set_ylabel(f"Mean step time ({tu})")
        ax.set_title(f"{s['experiment']} / {cell['cell']}: means over {s['n_processes']} "
                     "processes (bars: range of process means)", fontsize=9)
        ax.legend(loc="best", fontsize=8)
    return save_figure(fig, stem)
