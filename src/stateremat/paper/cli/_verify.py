"""CLI commands: ``stateremat verify finite|engines|alias`` (registered on import).

Every command runs a runner of :mod:`stateremat.paper.verify` (raw rows, resumable: rerunning
with the same ``--out`` skips finished programs) under a progress bar, prints the summary it
recomputed from the stored rows and exits 1 when a contract target fails.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ._app import check_json_target as _check_json_target, fail, verify_app
from ._progress import progress_bar

def _emit(summary: dict, json_path: Optional[Path]) -> None:
    from ...contract import atomic_write_json

    if json_path is not None:
        atomic_write_json(json_path, summary)
    typer.echo(json.dumps(summary, indent=2, default=float))


def check_seed(command: str, seed: int) -> None:
    """Reject a negative base seed before anything is created (NumPy seeds must be >= 0)."""
    if seed < 0:
        raise fail(f"stateremat verify {command}: --seed must be a non-negative integer, got {seed}. "
                   "Tip: the paper's runs use --seed 0.")


def check_json_target(command: str, json_path: Optional[Path]) -> None:
    """Reject a ``--json`` target that cannot be written, before the run starts."""
    _check_json_target(f"stateremat verify {command}", json_path)


def parse_alias_seeds(seeds: str) -> list[int]:
    """``--seeds N`` (seeds ``0..N-1``) or a half-open range ``A:B`` of non-negative seeds."""
    tip = "Tip: use a count like 50 or a half-open range like 0:50."
    where = f"stateremat verify alias: --seeds {seeds!r}"
    from ...contract import parse_seed_range

    if ":" in seeds:
        try:
            seed_list = parse_seed_range(seeds)
        except ValueError as exc:
            raise fail(f"{where}: {exc}. {tip}")
        if seed_list[0] < 0:
            raise fail(f"{where}: seeds must be non-negative integers, got a range from {seed_list[0]}. {tip}")
        return seed_list
    text = seeds.strip()
    if not (text.lstrip("+-").isdigit()):
        raise fail(f"{where}: expected a seed count (a non-negative integer) or a range A:B. {tip}")
    n = int(text)
    if n < 1:
        raise fail(f"{where}: expected a seed count >= 1, got {n}. {tip}")
    return list(range(n))


def _exit_on_failures(command: str, fails: list[str]) -> None:
    """Exit 1 listing the failed contract targets (records and summary are already written)."""
    if fails:
        raise fail(f"stateremat verify {command}: {len(fails)} contract check(s) failed: "
                   + "; ".join(fails) + ". Tip: read the rows under --out (read_records) and look at the "
                   "outcome, max_error and message columns of the failing check.", code=1)


def _guard(fn):
    from ...contract import RecordsError

    try:
        return fn()
    except RecordsError as exc:  # a resume into another run's folder: bad input, nothing lost
        raise fail(str(exc))


@verify_app.command("finite")
def verify_finite(
    programs: int = typer.Option(1024, "--programs", help="Programs per suite (derivative, byte)."),
    seed: int = typer.Option(0, "--seed", help="Base seed of the program generators."),
    out: Path = typer.Option(Path("out/verify-finite"), "--out", help="Records folder (resumable)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary JSON here."),
) -> None:
    """Derivative and byte suites of the finite NumPy reference (paper §6)."""
    if programs < 1:
        raise fail(f"stateremat verify finite: --programs must be >= 1, got {programs}. "
                   "Tip: the paper's suites use --programs 1024.")
    check_seed("finite", seed)
    check_json_target("finite", json_path)
    from ..verify import finite_failures, run_finite

    with progress_bar() as bar:
        summary = _guard(lambda: run_finite(out, programs, seed, progress=bar))
    _emit(summary, json_path)
    _exit_on_failures("finite", finite_failures(summary, programs))


@verify_app.command("engines")
def verify_engines(
    programs: int = typer.Option(1200, "--programs", help="Programs (families queue/prototype/recurrence)."),
    seed: int = typer.Option(0, "--seed", help="Base seed of the program generator."),
    out: Path = typer.Option(Path("out/verify-engines"), "--out", help="Records folder (resumable)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary JSON here."),
) -> None:
    """Five preservation engines on the semantic study (paper §7, Table 1)."""
    if programs < 1:
        raise fail(f"stateremat verify engines: --programs must be >= 1, got {programs}. "
                   "Tip: the paper's study uses --programs 1200.")
    check_seed("engines", seed)
    check_json_target("engines", json_path)
    from ..verify import ENGINE_NAMES, engines_failures, run_engines

    with progress_bar() as bar:
        summary = _guard(lambda: run_engines(out, programs, seed, progress=bar))
    _emit(summary, json_path)
    _exit_on_failures("engines", engines_failures(summary, programs, list(ENGINE_NAMES)))


@verify_app.command("alias")
def verify_alias(
    seeds: str = typer.Option("50", "--seeds", help="Number of seeds N (seeds 0..N-1) or a range A:B."),
    out: Path = typer.Option(Path("out/verify-alias"), "--out", help="Records folder (resumable)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary JSON here."),
) -> None:
    """Joint-alias study: seeds x 3 patterns x dims 32/64 (paper §7, Table 3)."""
    seed_list = parse_alias_seeds(seeds)
    check_json_target("alias", json_path)
    from ..verify import ALIAS_DIMS, ALIAS_PATTERNS, ENGINE_NAMES, alias_failures, run_alias

    with progress_bar() as bar:
        summary = _guard(lambda: run_alias(out, seed_list, progress=bar))
    _emit(summary, json_path)
    _exit_on_failures("alias", alias_failures(summary, len(seed_list), len(ENGINE_NAMES),
                                              len(ALIAS_PATTERNS) * len(ALIAS_DIMS)))
