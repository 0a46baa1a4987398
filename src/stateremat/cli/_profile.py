"""CLI command ``stateremat profile`` (registered on import).

A target ``pkg.module:factory`` (a user's own model) is profiled by the library's
:func:`stateremat.torch.profile` (``_target.py``). The built-in workloads (``feature_queue``,
``prototype_memory``, ``unrolled_recurrence``) and their profiler belong to the paper wing; they
are loaded inside the command, when it runs.
"""
from __future__ import annotations

from pathlib import Path

import typer

from .._shared.checks import check_device, check_memory, check_output_file, fail, in_range, nonempty_path
from .._shared.progress import progress_bar
from ._app import app
from ._target import target_source

_API = "stateremat profile"
#: Ranges of the built-in workloads' options (paper units), checked before any work.
MAX_STATE_MIB = 2**20  # 1 TiB at the paper's scale
MAX_LIVE = 1024
MAX_REPEATS = 1000


#: Options of the built-in workloads only (a ``pkg.module:factory`` target's model defines its own shapes).
WORKLOAD_ONLY = {"preset": "--preset", "activations": "--activations", "state_mib": "--state-mib",
                 "write_fraction": "--write-fraction", "live": "--live", "dtype": "--dtype"}
#: Options of a ``pkg.module:factory`` target only.
TARGET_ONLY = {"segments": "--segments"}


def _given(ctx: typer.Context, options: dict[str, str]) -> list[str]:
    """The flags among ``options`` the command line (or the environment) set, not their defaults."""
    # by name: typer may bring its own click, whose ParameterSource is another enum
    return [flag for name, flag in options.items()
            if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")]


def segment_rule(segments: str) -> str | list[str]:
    """``--segments``: comma-separated module paths (spaces around items stripped) or one pattern.

    Raises:
        typer.Exit: an empty item (``"a,,b"``, a trailing comma) or an empty value.
    """
    items = [item.strip() for item in segments.split(",")]
    if not all(items):
        raise fail(f"{_API}: --segments has an empty item in {segments!r}; expected comma-separated module paths "
                   "or one pattern. Tip: e.g. --segments 'layers.0,layers.1' or --segments 'layers.*'.")
    return items if len(items) > 1 else items[0]


@app.command("profile")
def profile_cmd(
    ctx: typer.Context,
    workload: str = typer.Argument(..., help="pkg.module:factory (your model: the factory returns {'model', "
                                   "'sample' or 'step_fn', optional 'optimizers', 'segments'}), or a built-in "
                                   "workload: feature_queue, prototype_memory or unrolled_recurrence"),
    out: Path = typer.Option(..., "--out", parser=nonempty_path,
                             help="profile card JSON to write (a regular file; not the target's module)"),
    preset: str = typer.Option("cpu", help="built-in workloads only: cpu (paper shapes / 1024), cpu-faithful "
                               "(cpu with state / 64), h100 (paper shapes) or tiny (paper shapes / 2^16, for tests)"),
    activations: str = typer.Option("large", help="built-in workloads only: large (4096/65536) or small (256/256), paper units"),
    state_mib: int = typer.Option(1024, callback=in_range(1, MAX_STATE_MIB, "the paper uses 64 and "
                                                          "1024"),
                                  help=f"built-in workloads only: state buffer MiB in paper units (scaled by the preset), 1 to "
                                  f"{MAX_STATE_MIB:,}"),
    write_fraction: float = typer.Option(0.001, callback=in_range(0, 1, "0.001 is sparse, 1 dense",
                                                                  lo_open=True),
                                         help="built-in workloads only: fraction of the buffer each segment writes, in (0, 1]"),
    live: int = typer.Option(16, callback=in_range(1, MAX_LIVE, "the paper uses 1, 16 and 64"),
                             help=f"built-in workloads only: live versions = segments writing the buffer, 1 to {MAX_LIVE:,}"),
    dtype: str = typer.Option("float32", help="built-in workloads only: float32 or float64"),
    device: str = typer.Option("cpu", help="cpu, cuda or cuda:N"),
    repeats: int = typer.Option(3, callback=in_range(1, MAX_REPEATS, "3 to 5"),
                                help=f"least timed runs per segment and option (minimum kept); for a "
                                f"target: timed steps per option (median kept); 1 to {MAX_REPEATS:,}"),
    segments: str = typer.Option(None, help="target only: segment paths (comma-separated) or a pattern "
                                            "such as 'model.layers.*'; default: the factory's, else the "
                                            "model's repeated block"),
) -> None:
    """Measure a profile card (r, q, c per segment and option; P) on this device (paper §4)."""
    check_output_file(_API, "--out", out,
                      inputs=[(workload, src) for src in [target_source(workload)] if src is not None])
    check_device(_API, device)
    if ":" in workload:
        ignored = _given(ctx, WORKLOAD_ONLY)
        if ignored:
            raise fail(f"{_API}: {', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} only to the "
                       f"built-in workloads, got {'it' if len(ignored) == 1 else 'them'} with the target {workload!r}, "
                       "whose factory defines the model, its shapes and dtype. Tip: drop "
                       f"{'it' if len(ignored) == 1 else 'them'}; change the model in the factory instead.")
        return _profile_target(workload, out, None if segments is None else segment_rule(segments), device, repeats)
    ignored = _given(ctx, TARGET_ONLY)
    if ignored:
        raise fail(f"{_API}: {', '.join(ignored)} applies only to a pkg.module:factory target, got it with the "
                   f"built-in workload {workload!r} (its segments are fixed). Tip: drop it.")
    from stateremat.paper.profile import profile_workload  # lazy: the built-in workloads are the paper's
    from stateremat.paper.workloads import preset_config

    from ..contract import format_bytes, save_card

    try:
        cfg = preset_config(preset, workload=workload, state_mib=state_mib,
                            write_fraction=write_fraction, live_versions=live,
                            activations=activations, dtype=dtype)
    except ValueError as exc:
        raise fail(f"{_API}: {exc}")
    check_memory(_API, f"profiling {workload} (--preset {preset} --state-mib {state_mib} --live "
                 f"{live} --activations {activations} --dtype {dtype}, one training step)",
                 cfg.estimated_peak_bytes, device, tip="use a smaller --state-mib or --live, "
                 "or --preset cpu")
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


def _profile_target(target: str, out: Path, segments: str | list[str] | None, device: str, repeats: int) -> None:
    from ..contract import format_bytes, save_card
    from ._target import profile_target

    try:
        card = profile_target(target, segments, device, repeats)
    except TypeError as exc:  # stateremat.torch refusing what the factory returned: bad input
        if not str(exc).startswith("stateremat"):
            raise  # the user's own code: its traceback says where
        raise fail(f"{_API}: {target} returned what profile refuses: {exc}") from None
    save_card(card, out)
    typer.echo(f"wrote {out}: {len(card.segments)} segments of {card.meta['model']}, "
               f"P = {format_bytes(card.persistent_bytes)}, memory: {card.meta['memory_method']}")
    for seg in card.segments:
        typer.echo(f"  {seg.name}: " + ", ".join(
            f"{o} r={format_bytes(c.retained_bytes)} q={format_bytes(c.temp_bytes)} c={c.time_s * 1e3:.2f} ms"
            for o, c in seg.options.items()))
