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

from ._app import check_json_target, check_out_dir, fail, guarded, run_owns, verify_app
from stateremat._shared.checks import in_range
from stateremat._shared.checks import is_stdout, nonempty_path

from ._limits import MAX_PROGRAMS, MAX_SEED, MAX_STUDY_SEEDS, check_rows, parse_seeds
from ..._shared.progress import progress_bar

_SEED = typer.Option(0, "--seed", callback=in_range(0, MAX_SEED, "the paper's runs use --seed 0"),
                     help=f"Base seed of the program generators, 0 to {MAX_SEED}.")
_JSON = typer.Option(None, "--json", parser=nonempty_path,
                     help="Also write the summary JSON here (a regular file outside the run's own "
                     "files; - : standard output only, the JSON alone).")

def _emit(summary: dict, json_path: Optional[Path]) -> None:
    from ..._shared.io import atomic_write_json

    if json_path is not None and not is_stdout(json_path):
        atomic_write_json(json_path, summary)
    typer.echo(json.dumps(summary, indent=2, default=float))


def _checks(command: str, out: Path, json_path: Optional[Path], table: str, rows: int,
            what: str) -> None:
    """Everything checked before a verify command starts (nothing is written before)."""
    api = f"stateremat verify {command}"
    owns = run_owns(table)
    check_out_dir(api, out, owns=owns)
    check_json_target(api, json_path, out, owns)
    check_rows(api, table, rows, what)


def _exit_on_failures(command: str, fails: list[str]) -> None:
    """Exit 1 listing the failed contract targets (records and summary are already written)."""
    if fails:
        raise fail(f"stateremat verify {command}: {len(fails)} contract check(s) failed: "
                   + "; ".join(fails) + ". Tip: read the rows under --out (read_records) and look at the "
                   "outcome, max_error and message columns of the failing check.", code=1)


@verify_app.command("finite")
def verify_finite(
    programs: int = typer.Option(1024, "--programs", callback=in_range(
        1, MAX_PROGRAMS, "the paper's suites use --programs 1024"),
        help=f"Programs per suite (derivative, byte), 1 to {MAX_PROGRAMS:,}."),
    seed: int = _SEED,
    out: Path = typer.Option(Path("out/verify-finite"), "--out", parser=nonempty_path,
                      help="Records folder (resumable)."),
    json_path: Optional[Path] = _JSON,
) -> None:
    """Derivative and byte suites of the finite NumPy reference (paper §6)."""
    _checks("finite", out, json_path, "finite", 7 * programs, f"--programs {programs}")
    from ..verify import finite_failures, run_finite

    with guarded("stateremat verify finite", out), progress_bar() as bar:
        summary = run_finite(out, programs, seed, progress=bar)
    _emit(summary, json_path)
    _exit_on_failures("finite", finite_failures(summary, programs))


@verify_app.command("engines")
def verify_engines(
    programs: int = typer.Option(1200, "--programs", callback=in_range(
        1, MAX_PROGRAMS, "the paper's study uses --programs 1200"),
        help=f"Programs (families queue/prototype/recurrence), 1 to {MAX_PROGRAMS:,}."),
    seed: int = _SEED,
    out: Path = typer.Option(Path("out/verify-engines"), "--out", parser=nonempty_path,
                      help="Records folder (resumable)."),
    json_path: Optional[Path] = _JSON,
) -> None:
    """Five preservation engines on the semantic study (paper §7, Table 1)."""
    _checks("engines", out, json_path, "engines", 6 * programs, f"--programs {programs}")
    from ..verify import ENGINE_NAMES, engines_failures, run_engines

    with guarded("stateremat verify engines", out), progress_bar() as bar:
        summary = run_engines(out, programs, seed, progress=bar)
    _emit(summary, json_path)
    _exit_on_failures("engines", engines_failures(summary, programs, list(ENGINE_NAMES)))


@verify_app.command("alias")
def verify_alias(
    seeds: str = typer.Option("50", "--seeds", help="A count N of seeds: seeds 0..N-1 (not "
                              "seed N; unlike the A:B options), or a half-open range A:B; seeds "
                              f"in [0, {MAX_SEED}], at most {MAX_STUDY_SEEDS:,}."),
    out: Path = typer.Option(Path("out/verify-alias"), "--out", parser=nonempty_path,
                             help="Records folder (resumable)."),
    json_path: Optional[Path] = _JSON,
) -> None:
    """Joint-alias study: seeds x 3 patterns x dims 32/64 (paper §7, Table 3)."""
    seed_list = parse_seeds("stateremat verify alias", "--seeds", seeds, MAX_STUDY_SEEDS,
                            count_form=True)
    _checks("alias", out, json_path, "alias", 42 * len(seed_list), f"--seeds {seeds}")
    from ..verify import ALIAS_DIMS, ALIAS_PATTERNS, ENGINE_NAMES, alias_failures, run_alias

    with guarded("stateremat verify alias", out), progress_bar() as bar:
        summary = run_alias(out, seed_list, progress=bar)
    _emit(summary, json_path)
    _exit_on_failures("alias", alias_failures(summary, len(seed_list), len(ENGINE_NAMES),
                                              len(ALIAS_PATTERNS) * len(ALIAS_DIMS)))
