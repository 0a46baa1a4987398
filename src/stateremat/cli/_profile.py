"""CLI command ``stateremat profile`` (registered on import).

A target ``pkg.module:factory`` (a user's own model) is profiled by the library's
:func:`stateremat.torch.profile` (``_target.py``). The built-in workloads (``feature_queue``,
``prototype_memory``, ``unrolled_recurrence``) and their profiler belong to the paper wing; they
are loaded inside the command, when it runs.
"""
from __future__ import annotations

from pathlib import Path

import typer

from ._app import app, fail


@app.command("profile")
def profile_cmd(
    workload: str = typer.Argument(..., help="pkg.module:factory (your model: the factory returns {'model', "
                                   "'sample' or 'step_fn', optional 'optimizers', 'segments'}), or a built-in "
                                   "workload: feature_queue, prototype_memory or unrolled_recurrence"),
    out: Path = typer.Option(..., "--out", help="profile card JSON to write"),
    preset: str = typer.Option("cpu", help="cpu (paper shapes / 1024) or h100 (paper shapes)"),
    activations: str = typer.Option("large", help="large (4096/65536) or small (256/256), paper units"),
    state_mib: int = typer.Option(1024, help="state buffer MiB in paper units (scaled by the preset)"),
    write_fraction: float = typer.Option(0.001, help="fraction of the buffer each segment writes"),
    live: int = typer.Option(16, help="live versions = segments writing the buffer"),
    dtype: str = typer.Option("float32", help="float32 or float64"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    repeats: int = typer.Option(3, help="least timed runs per segment and option (minimum kept); "
                                        "for a target: timed steps per option (median kept)"),
    segments: str = typer.Option(None, help="target only: segment paths (comma-separated) or a pattern "
                                            "such as 'model.layers.*'; default: the factory's, else the "
                                            "model's repeated block"),
) -> None:
    """Measure a profile card (r, q, c per segment and option; P) on this device (paper §4)."""
    if ":" in workload:
        return _profile_target(workload, out, segments, device, repeats)
    from stateremat.paper.cli import progress_bar  # lazy: the built-in workloads are the paper's
    from stateremat.paper.profile import profile_workload
    from stateremat.paper.workloads import preset_config

    from ..contract import format_bytes, save_card

    if repeats < 1:
        raise fail(f"stateremat profile: --repeats must be >= 1, got {repeats}. Tip: the default 3 "
                   "keeps the minimum of three timed runs.")
    try:
        cfg = preset_config(preset, workload=workload, state_mib=state_mib,
                            write_fraction=write_fraction, live_versions=live,
                            activations=activations, dtype=dtype)
    except ValueError as exc:
        raise fail(str(exc))
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise fail("--device cuda: no CUDA device is visible. Tip: use --device cpu here.")
    with progress_bar() as bar:
        task = bar.task(f"profiling {workload} ({preset})", total=cfg.segments)
        card = profile_workload(cfg, device, repeats=repeats,
                                on_segment=lambda done, n: task.update(completed=done))
    save_card(card, out)
    seg = card.segments[-1]
    typer.echo(f"wrote {out}: {len(card.segments)} segments, P = {format_bytes(card.persistent_bytes)}, "
               f"memory: {card.meta['memory_method']}")
    for o, c in seg.options.items():
        typer.echo(f"  {seg.name}.{o}: r = {format_bytes(c.retained_bytes)}, "
                   f"q = {format_bytes(c.temp_bytes)}, c = {c.time_s * 1e3:.2f} ms")


def _profile_target(target: str, out: Path, segments: str | None, device: str, repeats: int) -> None:
    from ..contract import format_bytes, save_card
    from ._target import profile_target

    if repeats < 1:
        raise fail(f"stateremat profile: --repeats must be >= 1, got {repeats}. Tip: 3 to 5 timed steps.")
    card = profile_target(target, segments, device, repeats)
    save_card(card, out)
    typer.echo(f"wrote {out}: {len(card.segments)} segments of {card.meta['model']}, "
               f"P = {format_bytes(card.persistent_bytes)}, memory: {card.meta['memory_method']}")
    for seg in card.segments:
        typer.echo(f"  {seg.name}: " + ", ".join(
            f"{o} r={format_bytes(c.retained_bytes)} q={format_bytes(c.temp_bytes)} c={c.time_s * 1e3:.2f} ms"
            for o, c in seg.options.items()))
