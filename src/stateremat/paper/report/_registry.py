"""Registry of reporters: one per records table, so ``stateremat report DIR`` can render any run.

A reporter takes the run folder and returns the paths it wrote (markdown, CSV, PNG, SVG).
Reporters read raw rows (``read_records``) and recompute every number from them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

Reporter = Callable[[Path], list[Path]]
REPORTERS: dict[str, Reporter] = {}


def register_reporter(table: str) -> Callable[[Reporter], Reporter]:
    """Decorator: register ``fn`` as the reporter for runs holding records table ``table``."""

    def deco(fn: Reporter) -> Reporter:
        REPORTERS[table] = fn
        return fn

    return deco


def tables_in(out_dir: str | Path) -> list[str]:
    """Records tables present in ``out_dir`` (folders that have a ``<table>.json`` sidecar)."""
    d = Path(out_dir)
    return sorted(p.stem for p in d.glob("*.json") if (d / p.stem).is_dir())
