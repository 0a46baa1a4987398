"""CLI commands: plan (registered on import)."""
from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer

from .._shared.checks import check_output_file, fail, in_range, is_stdout, nonempty_path
from ._app import app

_MAX_ROWS = 32  # longer cards print option counts instead of one row per segment
MAX_FRONTIER_CAP = 10_000_000
#: Cards with at least this many segments draw a progress line while they are planned.
PROGRESS_SEGMENTS = 500


@contextlib.contextmanager
def plan_progress(n_segments: int) -> Iterator[Optional[Callable[[str, int, int, int], None]]]:
    """A progress callback for :func:`stateremat.planner.plan` drawn on stderr (long cards
    only), with the planner's warnings printed as they happen ("warning: ...")."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..planner import FrontierWarning

    def show(message, category, filename, lineno, file=None, line=None):
        typer.echo(f"warning: {message}", err=True)

    with warnings.catch_warnings():
        warnings.simplefilter("always", FrontierWarning)
        warnings.showwarning = show
        if n_segments < PROGRESS_SEGMENTS:
            yield None
            return
        bar = Progress(TextColumn("plan: {task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("frontier {task.fields[frontier]:,}"), TimeElapsedColumn(),
                       console=Console(stderr=True), transient=True)
        task = bar.add_task("", total=n_segments, frontier=0)

        def progress(stage: str, done: int, total: int, frontier: int) -> None:
            bar.update(task, description=stage, completed=done, total=total, frontier=frontier)

        with bar:
            yield progress


@app.command("plan")
def plan_cmd(
    card_path: Path = typer.Argument(..., metavar="CARD.json", parser=nonempty_path,
                                     help="Profile card (schema 1)."),
    budget: str = typer.Option(..., "--budget", help="Logical budget M: whole bytes, or with a "
                               "unit: B, KiB, MiB, GiB, TiB (powers of 1024) or kB, MB, GB, TB "
                               "(powers of 1000), e.g. 32GiB, 46.5MiB; or a percentage of the "
                               "card's all-eager peak (in the --peak model), e.g. 60%."),
    planner: str = typer.Option("joint", "--planner", help="joint, eager_whole, state_agnostic, "
                                "or a fixed method: eager, whole, region."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="PLAN.json",
                                             parser=nonempty_path,
                                             help="Write the plan here (atomically; a regular "
                                             "file, not the card; a link's target is written). "
                                             "- : standard output (the JSON alone; the table "
                                             "goes to standard error)."),
    frontier_cap: Optional[int] = typer.Option(
        None, "--frontier-cap", callback=in_range(1, MAX_FRONTIER_CAP, "omit it for an exact "
                                                  "frontier; 1000 is quick on long cards"),
        help=f"Cap DP frontier points per segment, 1 to {MAX_FRONTIER_CAP:,} (result marked "
        "truncated)."),
    bound_pruning: bool = typer.Option(True, "--bound-pruning/--no-bound-pruning",
                                       help="Exact Lagrangian-bound pruning in the DP."),
    explain: bool = typer.Option(False, "--explain", help="Print per-segment reasons."),
    peak: str = typer.Option("eq3", "--peak", help="The peak the budget bounds: eq3 (the paper's "
                             "P + Σ r + max q) or chain (the peak when the segments run as a "
                             "chain, closer to what is measured)."),
) -> None:
    """Choose eager/whole/region per segment of CARD.json under a budget (paper §4, eq. 3).

    Long plans show their progress; a frontier that grows past the planner's warning size is
    reported at once with what to do (a frontier cap, or the MILP).

    Exit status: 0 when the plan fits the budget; 1 when no plan of the chosen planner fits
    it (the table and --json are still written, with "fits_budget": false); 2 on bad input
    (nothing is written). The JSON is RFC 8259: a number past float range (the predicted time
    of a card whose times sum past 1.8e308 s) is written as null, meaning infinite.
    """
    from ..contract import ProfileCardError, format_bytes, load_card, parse_size
    from .._shared.io import atomic_write_json, dumps_json, provenance
    from ..planner import PLANNERS, plan

    from ..planner import PEAK_MODELS

    api = "stateremat plan"
    if peak not in PEAK_MODELS:
        raise fail(f"{api}: --peak must be one of {list(PEAK_MODELS)}, got {peak!r}. Tip: chain "
                   "is the peak that happens; eq3 the paper's bound.")
    if budget.strip().lower() == "fit":
        raise fail(f"{api}: --budget fit needs the device the model runs on; a card has none. "
                   "Tip: give bytes, a size (32GiB) or a percentage of the eager peak (60%).")
    percent = budget.strip().endswith("%")
    try:
        budget_bytes = budget if percent else parse_size(budget)
    except ValueError as exc:
        raise fail(f"{api}: --budget: {exc}. Tip: e.g. --budget 32GiB or --budget 60%.")
    if not percent and budget_bytes <= 0:
        raise fail(f"{api}: --budget must be positive, got {budget!r}. Tip: e.g. --budget 32GiB.")
    if planner not in PLANNERS:
        raise fail(f"{api}: --planner {planner!r} is unknown; expected one of {list(PLANNERS)}. "
                   "Tip: joint is the paper's planner.")
    check_output_file(api, "--json", json_path, inputs=[("CARD.json", card_path)], stdout=True)
    try:
        card = load_card(card_path)
    except ProfileCardError as exc:
        raise fail(f"{api}: {exc}")
    try:
        with plan_progress(len(card.segments)) as progress:
            result = plan(card, budget_bytes, planner, frontier_cap=frontier_cap,
                          bound_pruning=bound_pruning, progress=progress, peak=peak)
    except (OverflowError, ValueError) as exc:  # e.g. a size the card cap should have refused
        raise fail(f"{api}: cannot plan {str(card_path)!r}: {exc}. Tip: check the card's sizes "
                   "are bytes and the budget is at most 8 PiB.")
    budget_bytes = result.budget_bytes
    to_stdout = is_stdout(json_path)  # the JSON alone on stdout; everything else on stderr
    _print(result, stderr=to_stdout)
    if explain:
        typer.echo(result.explain(), err=to_stdout)
    if json_path is not None:
        doc = result.to_dict()
        doc["card"] = {"path": str(card_path), "source_hash": card.source_hash(),
                       "meta": card.meta}
        doc["provenance"] = provenance(command="plan")
        if to_stdout:  # RFC 8259: a non-finite number (a time past float range) is null
            typer.echo(dumps_json(doc))
        else:
            atomic_write_json(json_path, doc)
            typer.echo(f"wrote {json_path}")
    if not result.fits_budget:
        raise fail(f"{api}: no {planner} plan fits the budget {format_bytes(budget_bytes)} "
                   f"({budget_bytes:,} bytes); the least predicted peak is "
                   f"{format_bytes(result.min_feasible_peak_bytes)}. Tip: "
                   + _infeasible_tip(card, result, planner, frontier_cap, bound_pruning, peak),
                   code=1)


def _infeasible_tip(card, result, planner: str, frontier_cap, bound_pruning: bool,
                    peak: str) -> str:
    """A tip for a plan that does not fit that works as written: the least budget this planner
    fits (checked by planning again), and ``--planner joint`` only when joint fits this budget."""
    from ..planner import plan

    def fits(budget: int, name: str) -> bool:
        try:
            return plan(card, budget, name, frontier_cap=frontier_cap,
                        bound_pruning=bound_pruning, peak=peak).fits_budget
        except (OverflowError, ValueError):
            return False

    tips = []
    need = result.min_feasible_peak_bytes
    if need is not None and fits(need, planner):
        tips.append(f"pass --budget {need} (bytes: the least predicted peak)")
    if planner != "joint" and fits(result.budget_bytes, "joint"):
        tips.append("use --planner joint (the paper's planner), which fits this budget")
    if not tips:
        return (f"even a budget of its least predicted peak does not fit the {planner} plan of "
                "this card; check the card's sizes (they are bytes).")
    return ", or ".join(tips) + "."


def _print(res, stderr: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..contract import format_bytes

    console = Console(stderr=stderr)
    summary = Table(title=f"plan: {res.planner}", show_header=False)
    summary.add_column("field")
    summary.add_column("value", overflow="fold")
    summary.add_row("budget", f"{format_bytes(res.budget_bytes)} ({res.budget_bytes} B)")
    summary.add_row("peak model", res.peak)
    summary.add_row("fits budget", "yes" if res.fits_budget else
                    ("no (EXCEEDS budget)" if res.feasible else "no (INFEASIBLE)"))
    if res.feasible:
        summary.add_row("predicted peak", f"{format_bytes(res.predicted_peak_bytes)} "
                        f"({'fits' if res.fits_budget else 'EXCEEDS budget'})")
        summary.add_row("predicted time", f"{res.predicted_time_s:.6g} s/step")
        summary.add_row("peaks of this plan", f"chain {format_bytes(res.chain_peak_bytes)}, "
                        f"eq. (3) bound {format_bytes(res.bound_peak_bytes)}")
        if res.model_peak_bytes != res.predicted_peak_bytes:
            summary.add_row("planner's own model", f"{format_bytes(res.model_peak_bytes)}, "
                            f"{res.model_time_s:.6g} s (preservation omitted)")
    own = " (own model)" if res.planner == "state_agnostic" else ""
    summary.add_row("min feasible peak" + own, format_bytes(res.min_feasible_peak_bytes))
    summary.add_row("frontier size", str(res.frontier_size))
    if res.frontier_candidates_max is not None:
        summary.add_row("candidates examined (max per segment)", str(res.frontier_candidates_max))
    summary.add_row("truncated", str(res.truncated))
    summary.add_row("solve time", f"{res.solve_time_s * 1e3:.2f} ms")
    for note in res.notes:
        summary.add_row("note", note)
    console.print(summary)
    policy = res.options if res.options is not None else None
    if policy is None:
        counts = Counter(res.min_peak_options)
        console.print("infeasible: min-peak policy would be "
                      + ", ".join(f"{v}× {k}" for k, v in sorted(counts.items())))
        return
    if len(policy) > _MAX_ROWS or res.card is None:
        console.print("options: " + ", ".join(f"{v}× {k}" for k, v in sorted(Counter(policy).items())))
        return
    table = Table(title="per segment")
    for col in ("segment", "option", "retained", "temporary", "seconds"):
        table.add_column(col, justify="left" if col in ("segment", "option") else "right")
    for seg, opt in zip(res.card.segments, policy):
        c = seg.options[opt]
        table.add_row(seg.name, opt, format_bytes(c.retained_bytes), format_bytes(c.temp_bytes),
                      f"{c.time_s:.4g}")
    console.print(table)
