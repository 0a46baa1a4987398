"""Rules across rows and runs (issue 28): a step below the run's steps, the infeasible marker
alone for its (cell, method), values constant where a run writes one, a part of another run
refused by its run id, and the report's mark parsed without last-wins duplicate keys.

Each case copies one committed run's table from ``results/cpu`` into a temporary folder and
changes one thing, as ``tests/test_records_identity.py`` does.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _cli import run_cli
from stateremat.contract import RecordsError
from stateremat.paper.records import PART_KEY, read_records

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "results" / "cpu"


def _copy(tmp: Path, run: str, *tables: str) -> Path:
    out = tmp / run
    out.mkdir(parents=True)
    for t in tables:
        shutil.copytree(CPU / run / t, out / t)
        shutil.copy(CPU / run / f"{t}.json", out / f"{t}.json")
    return out


def _parts(out: Path, table: str) -> list[Path]:
    return sorted((out / table).glob("part-*.parquet"))


def _rewrite(part: Path, change) -> None:
    """Rewrite ``part`` with ``change(df)``'s rows, keeping its schema and notes."""
    tbl = pq.read_table(part)
    df = change(tbl.to_pandas())
    pq.write_table(pa.Table.from_pandas(df, schema=tbl.schema, preserve_index=False), part)


def _refused(out: Path, table: str, *words: str) -> str:
    with pytest.raises(RecordsError) as err:
        read_records(out, table)
    msg = str(err.value)
    for w in words:
        assert w in msg, msg
    return msg


# ------------------------------------------------------------ 7. the report's mark
def test_a_report_mark_with_a_duplicate_key_is_refused(tmp_path):
    out = _copy(tmp_path, "verify-finite", "finite")
    dest = tmp_path / "rep"
    assert run_cli("report", out, "--out", dest).exit_code == 0
    mark = dest / ".report.json"
    doc = json.loads(mark.read_text())
    # the first "run" is another folder's, the last this run's: last-wins would accept it
    text = mark.read_text().replace('"run":', f'"run": {json.dumps(str(tmp_path / "x"))}, "run":', 1)
    mark.write_text(text)
    assert json.loads(text)["run"] == doc["run"]
    res = run_cli("report", out, "--out", dest)
    assert res.exit_code == 2, res.output
    assert ".report.json" in res.output and "twice" in res.output
