"""The ``stateremat`` typer application: library commands here, paper commands loaded lazily.

The library registers ``profile`` and ``plan`` on :data:`app`. The paper wing's commands
(:data:`PAPER_COMMANDS`) are looked up in ``stateremat.paper.cli`` only when one of them is
asked for (or the command list is shown), so ``stateremat plan`` needs neither pandas nor the
paper wing (DESIGN.md, "Two wings").
"""
from __future__ import annotations

import functools

import typer
from typer.core import TyperGroup

#: Commands of the paper wing, in the order ``stateremat --help`` lists them.
PAPER_COMMANDS = ("main", "verify", "cohort", "bench", "app", "report")


@functools.lru_cache(maxsize=1)
def _paper_group():
    from stateremat.paper.cli import paper_app  # lazy: the paper wing needs the [paper] extra

    return typer.main.get_command(paper_app)


class _Root(TyperGroup):
    """The root group: its own commands, then the paper wing's, resolved on first use."""

    def list_commands(self, ctx) -> list[str]:
        return [*PAPER_COMMANDS, *(c for c in super().list_commands(ctx) if c not in PAPER_COMMANDS)]

    def get_command(self, ctx, cmd_name: str):
        if cmd_name in PAPER_COMMANDS:
            return _paper_group().get_command(ctx, cmd_name)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    cls=_Root,
    name="stateremat",
    help="State-aware activation recomputation: verify replay contracts, profile, plan, "
    "benchmark and report (arXiv 2611.00590).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain one-line usage errors: "Error: Invalid value for '--x': ..."
)
