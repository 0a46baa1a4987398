"""Planner benchmark: DP solve times and frontier sizes next to MILP (and exhaustive) times.

Targets (issue 4): 16 segments untruncated in < 50 ms; 1,000 segments in < 2 s, stating the
frontier size and whether truncated. Each card is solved by the DP variants and the MILP
interleaved (A B A B …); medians over ``--repeats`` are printed with /proc/loadavg, since the
machine is shared. Every DP result is checked against the MILP optimum (relative 1e-9).

    .venv/bin/python benchmarks/bench_planner.py [--repeats 5] [--exhaustive] [--json out.json]
"""
from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console
from rich.table import Table

from stateremat._shared.io import atomic_write_json, loadavg, provenance
from stateremat.contract import ProfileCard, SegmentCard, format_bytes
from stateremat.planner import activation_pressure_card, exhaustive, milp, plan, random_card

GiB = 1024**3


def _repeated_layers(n: int) -> ProfileCard:
    """``n`` segments cycling through the 16 layers of the pressure card (many exact ties)."""
    base = activation_pressure_card()
    segs = [SegmentCard(f"layer{i}", base.segments[i % 16].options) for i in range(n)]
    return ProfileCard(base.persistent_bytes, segs, meta={"method": "repeated pressure layers"})


def _gib_bytes_card(n: int, seed: int) -> ProfileCard:
    """1–64 GiB segments whose options differ by a few bytes (float-rounding stress for bounds)."""
    import numpy as np

    from stateremat.contract import OptionCost

    rng = np.random.default_rng(seed)
    segs = []
    for i in range(n):
        base = int(rng.integers(1, 65)) * GiB + int(rng.integers(0, 1000))
        opts = {o: OptionCost(base + int(rng.integers(0, 8)),
                              int(rng.integers(0, 3)) * (GiB if rng.random() < 0.5 else 1),
                              float(rng.integers(0, 5)) * 1e-3 + rng.random() * 1e-4)
                for o in ("eager", "whole", "region")}
        segs.append(SegmentCard(f"s{i}", opts))
    return ProfileCard(2 * GiB, segs, meta={"method": "GiB segments, byte-level option gaps"})


def _cards():
    """(label, card, budget_bytes, planner, repeats or None) cases."""
    cases = [("pressure 16 @32GiB", activation_pressure_card(), 32 * GiB, "joint", None),
             ("pressure 16 @44GiB", activation_pressure_card(), 44 * GiB, "joint", None),
             ("pressure 16 @44GiB", activation_pressure_card(), 44 * GiB, "eager_whole", None)]
    for n, seed in ((16, 1), (16, 2), (1000, 1), (1000, 2)):
        card = random_card(n, seed)
        lo = plan(card, 0).min_feasible_peak_bytes
        hi = plan(card, 0, "eager").predicted_peak_bytes
        cases.append((f"random {n} seed {seed}", card, (lo + hi) // 2, "joint", None))
    for n in (16, 1000):
        card = _gib_bytes_card(n, 3)
        lo = plan(card, 0).min_feasible_peak_bytes
        cases.append((f"gib-bytes {n} @min+7B", card, lo + 7, "joint", None))
    # Identical layers: symmetric for branch and bound (the MILP takes about a minute), so once.
    cases.append(("repeated 1000 @1000GiB", _repeated_layers(1000), 1000 * GiB, "joint", 1))
    return cases


def _variants(n: int):
    """DP variants run on a card of ``n`` segments: (name, kwargs)."""
    out = [("dp exact+bound", {"bound_pruning": True})]
    if n <= 100:  # the whole Pareto frontier grows exponentially on heterogeneous cards
        out.append(("dp full frontier", {"bound_pruning": False}))
    out.append(("dp cap 256", {"bound_pruning": False, "frontier_cap": 256}))
    return out


def _growth(console: Console, sizes=(16, 32, 50, 100)) -> list[dict]:
    """Size and time of the whole (budget-pruned only) Pareto frontier as segments grow."""
    rows = []
    for n in sizes:
        card = random_card(n, 1)
        lo = plan(card, 0).min_feasible_peak_bytes
        budget = (lo + plan(card, 0, "eager").predicted_peak_bytes) // 2
        t = time.perf_counter()
        full = plan(card, budget, bound_pruning=False)
        t_full = time.perf_counter() - t
        t = time.perf_counter()
        exact = plan(card, budget)
        t_exact = time.perf_counter() - t
        rows.append({"segments_count": n, "full_frontier_size": full.frontier_size,
                     "full_s": t_full, "bound_frontier_size": exact.frontier_size,
                     "bound_s": t_exact, "same_policy": full.options == exact.options})
    table = Table(title="frontier growth, random cards (one run each)")
    for col in ("segments", "full frontier", "full ms", "bound-pruned frontier", "bound ms",
                "same policy"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["segments_count"]), str(r["full_frontier_size"]),
                      f"{r['full_s'] * 1e3:.1f}", str(r["bound_frontier_size"]),
                      f"{r['bound_s'] * 1e3:.1f}", str(r["same_policy"]))
    console.print(table)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exhaustive", action="store_true", help="also enumerate 16-segment cards "
                    "(2^16 eager/whole, 3^16 ≈ 43 M joint policies: tens of seconds)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    console = Console(width=150)
    rows = []
    load_before = loadavg()
    for label, card, budget, planner, repeats in _cards():
        n = len(card.segments)
        variants = _variants(n)
        times = {name: [] for name, _ in variants}
        times["milp"] = []
        results = {}
        for _ in range(repeats or args.repeats):  # interleaved: every solver once per round
            for name, kw in variants:
                t = time.perf_counter()
                results[name] = plan(card, budget, planner, **kw)
                times[name].append(time.perf_counter() - t)
            t = time.perf_counter()
            results["milp"] = milp(card, budget, options=planner, time_limit_s=300.0)
            times["milp"].append(time.perf_counter() - t)
        if args.exhaustive and n <= 16:
            t = time.perf_counter()
            results["exhaustive"] = exhaustive(card, budget, options=planner)
            times["exhaustive"] = [time.perf_counter() - t]
        ref = results["milp"]
        for name, res in results.items():
            if ref.feasible and res.feasible:
                gap = (res.predicted_time_s - ref.predicted_time_s) / ref.predicted_time_s
            else:
                gap = None
            rows.append({"case": label, "planner": planner, "segments_count": n,
                         "budget_bytes": budget, "solver": name,
                         "median_s": statistics.median(times[name]),
                         "min_s": min(times[name]), "repeats": len(times[name]),
                         "feasible": res.feasible, "frontier_size": res.frontier_size,
                         "candidates_max": res.frontier_candidates_max,
                         "truncated": res.truncated, "optimal": res.optimal,
                         "predicted_time_s": res.predicted_time_s,
                         "predicted_peak_bytes": res.predicted_peak_bytes,
                         "rel_gap_vs_milp": gap})
            if (name in ("dp exact+bound", "dp full frontier", "exhaustive")) \
                    and gap is not None and abs(gap) > 1e-9:
                console.print(f"[red]MISMATCH {label} {name}: gap {gap:.3e}[/red]")
    table = Table(title=f"planner benchmark (medians of {args.repeats} unless 'runs' says; loadavg before "
                        f"{load_before}, after {loadavg()})")
    for col in ("case", "planner", "solver", "runs", "median ms", "frontier", "cands", "truncated",
                "feasible", "time s/step", "gap vs MILP"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["case"], r["planner"], r["solver"], str(r["repeats"]),
                      f"{r['median_s'] * 1e3:.1f}",
                      str(r["frontier_size"]), str(r["candidates_max"]), str(r["truncated"]),
                      str(r["feasible"]),
                      "-" if r["predicted_time_s"] is None else f"{r['predicted_time_s']:.6g}",
                      "-" if r["rel_gap_vs_milp"] is None else f"{r['rel_gap_vs_milp']:.2e}")
    console.print(table)
    for r in rows:
        if r["predicted_peak_bytes"] is not None and r["solver"] == "milp":
            console.print(f"{r['case']} ({r['planner']}): budget {format_bytes(r['budget_bytes'])}, "
                          f"MILP peak {format_bytes(r['predicted_peak_bytes'])}")
    growth = _growth(console)
    if args.json:
        atomic_write_json(args.json, {"rows": rows, "growth": growth, "provenance": provenance(
            loadavg_before=load_before, benchmark="bench_planner", repeats=args.repeats)})
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
