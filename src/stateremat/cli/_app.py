"""The ``stateremat`` typer application and its command groups.

Each command lives in its own module of this package and registers itself on these
objects; the modules are imported by ``stateremat.cli``.
"""
from __future__ import annotations

import typer

app = typer.Typer(
    name="stateremat",
    help="State-aware activation recomputation: verify replay contracts, profile, plan, "
    "benchmark and report (arXiv 2611.00590).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
verify_app = typer.Typer(help="Semantic checks against the independent NumPy reference.",
                         no_args_is_help=True)
cohort_app = typer.Typer(help="Cohorts: Torch/JAX replay semantics; independent-process timing.",
                         no_args_is_help=True)
bench_app = typer.Typer(help="Cost runtime experiments: calibrate, pressure, fair control.",
                        no_args_is_help=True)
app_app = typer.Typer(help="End-to-end applications (dense-queue MoCo).", no_args_is_help=True)

app.add_typer(verify_app, name="verify")
app.add_typer(cohort_app, name="cohort")
app.add_typer(bench_app, name="bench")
app.add_typer(app_app, name="app")


def fail(message: str, code: int = 2) -> "typer.Exit":
    """Print ``message`` to stderr and return an Exit to raise (bad input, not a crash)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)
