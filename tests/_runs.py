"""Copies of committed runs (``results/cpu/<run>``) for tests that edit or move their parts."""
from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "results" / "cpu"


def copy_run(tmp: Path, run: str, *tables: str) -> Path:
    """``results/cpu/<run>``'s ``tables`` (rows folder + sidecar) under ``tmp/<run>``."""
    out = tmp / run
    out.mkdir(parents=True)
    for t in tables:
        shutil.copytree(CPU / run / t, out / t)
        shutil.copy(CPU / run / f"{t}.json", out / f"{t}.json")
    return out
