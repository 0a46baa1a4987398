"""CLI commands: moco (registered on import)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stateremat._shared.checks import in_range, nonempty_path

from ._app import app_app, check_out_dir, fail, fail_from, guarded, run_owns
from ._limits import MAX_MOCO_SEEDS, MAX_SEED, MAX_THREADS, parse_seeds
from ..._shared.progress import progress_bar


def parse_methods(api: str, text: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """``--methods a,b``: a non-empty list of known methods, each named once.

    Raises:
        typer.Exit: (code 2) on an empty list, an empty item, a duplicate or an unknown name.
    """
    chosen = tuple(m.strip() for m in text.split(","))
    tip = f"Tip: name each of {', '.join(known)} at most once, or omit --methods for all seven."
    if not any(chosen) or "" in chosen:
        raise fail(f"{api}: --methods {text!r} names an empty method; expected a comma-separated "
                   f"subset of the seven methods. {tip}")
    dup = sorted({m for m in chosen if chosen.count(m) > 1})
    if dup:
        raise fail(f"{api}: --methods {text!r} names {', '.join(dup)} more than once; each "
                   f"(seed, method) is one run and one row. {tip}")
    bad = [m for m in chosen if m not in known]
    if bad:
        raise fail(f"{api}: unknown methods {bad}; expected a subset of {list(known)}. {tip}")
    return chosen


@app_app.command("moco")
def moco(
    preset: str = typer.Option("cpu", help="tiny | cpu | paper (paper: GPU + CIFAR-100 --data)."),
    seeds: str = typer.Option("2701:2703", help=f"Half-open seed range A:B (one seed N: "
                              f"N:N+1; a bare N is refused); seeds in "
                              f"[0, {MAX_SEED}], at most {MAX_MOCO_SEEDS:,}."),
    out: Path = typer.Option(..., parser=nonempty_path, help="Run folder (resumable: rerun with the same --out)."),
    data: Optional[Path] = typer.Option(None, parser=nonempty_path, help="Dataset folder: the extracted "
                                        "cifar-100-python folder (or its parent), or a folder of "
                                        "Fashion-MNIST IDX .gz files; which one is detected from "
                                        "the file names. Default: the Debian package's "
                                        "Fashion-MNIST files."),
    dataset: Optional[str] = typer.Option(None, help="Override the preset's (and --data's "
                                          "detected) dataset: fashion-mnist | cifar-100 | digits."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda (default: cuda when present)."),
    methods: Optional[str] = typer.Option(None, help="Comma-separated subset of the seven methods, "
                                          "each at most once (default: all seven)."),
    threads: Optional[int] = typer.Option(
        None, callback=in_range(1, MAX_THREADS, "1 is fastest on a shared, oversubscribed "
                                "machine; omit it for the preset's"),
        help=f"torch intra-op threads, 1 to {MAX_THREADS:,} (1 is fastest on a shared, "
        "oversubscribed machine); recorded in the rows."),
) -> None:
    """Dense-queue MoCo application: seven methods per seed, linear probe, summary.json (§12)."""
    from dataclasses import replace

    from ..moco import METHODS, PRESETS, failed_runs, resolve_device, run_moco
    from ..workloads import detect_dataset

    api = "stateremat app moco"
    if preset not in PRESETS:
        raise fail(f"{api}: unknown --preset {preset!r}; expected one of {sorted(PRESETS)}. "
                   "Tip: use cpu here, paper on a GPU with --data.")
    seed_list = parse_seeds(api, "--seeds", seeds, MAX_MOCO_SEEDS)
    chosen = METHODS if methods is None else parse_methods(api, methods, METHODS)
    try:   # before anything is written: torch would raise later, mid-run
        resolve_device(device)
    except ValueError as exc:
        raise fail_from(api, exc)
    check_out_dir(api, out, owns=run_owns("moco", extra=("cards", "scores")))
    if data is not None and not data.is_dir():
        raise fail(f"{api}: --data {str(data)!r} is not a folder. Tip: pass the extracted "
                   "cifar-100-python folder or a folder of Fashion-MNIST IDX .gz files.")
    cfg = PRESETS[preset]
    if dataset is not None:
        cfg = replace(cfg, dataset=dataset)
    elif data is not None:
        found = detect_dataset(data)
        if found is not None and found != cfg.dataset:
            typer.echo(f"note: --data {data} holds {found}; using it (pass --dataset to override)",
                       err=True)
            cfg = replace(cfg, dataset=found)
    try:
        with guarded(api, out), progress_bar() as bar:
            summary = run_moco(cfg, seed_list, out, data=data, device=device, methods=chosen,
                               threads=threads, progress=bar)
    except (FileNotFoundError, ValueError) as exc:
        raise fail_from(api, exc)
    entries = summary["methods"]
    n_ok = sum(e["status"] == "ok" for e in entries)
    typer.echo(f"dataset {summary['dataset']}: {n_ok}/{len(entries)} method runs "
               f"finished; identical_within_seed={summary['identical_within_seed']} "
               f"(methods compared per seed: {summary['methods_compared']}); "
               f"summary: {Path(out) / 'summary.json'}")
    for m, ss in (summary.get("not_compared") or {}).items():   # uneven coverage: say so
        typer.echo(f"note: {m}: seed{'s' if len(ss) > 1 else ''} {', '.join(map(str, ss))} not "
                   f"in the comparison: other methods lack {'them' if len(ss) > 1 else 'it'} "
                   f"(methods are compared over seeds {summary['seeds_compared']})", err=True)
    for f in failed_runs(out):   # recorded in the rows; said here so nobody has to dig
        first = (str(f["error"] or "").strip().splitlines() or [""])[0]
        typer.echo(f"failed: seed {f['seed']} {f['method']}: {f['error_type']}: {first}", err=True)
    for e in entries:
        if e["status"] == "score file mismatch":
            typer.echo(f"score file mismatch: seed {e['seed']} {e['method']}: "
                       f"{out}/scores/seed-{e['seed']}/{e['method']}.npy is missing or differs "
                       "from its row's hash. Tip: rerun with --seeds and --methods naming it to "
                       "redo that run.", err=True)
    if n_ok < len(entries) or summary["identical_within_seed"] is False:
        raise typer.Exit(1)
