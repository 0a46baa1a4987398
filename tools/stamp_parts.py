"""Stamp records parts written before parts named their table and run (one-off migration).

Usage: ``python tools/stamp_parts.py RUN_OR_RESULTS_FOLDER...``

For each run folder found under the given folders (a ``<table>.json`` sidecar beside its
``<table>/`` rows folder), every ``part-*.parquet`` without the ``stateremat.part`` note gets
it: the table, the sidecar's run config and run id, as ``RecordStore.append`` now writes. Only schema
metadata is added: rows, columns and types are unchanged (checked before each part is
replaced, atomically). Parts already stamped are left alone. Use it only on folders whose
parts are all their own run's: the note is what tells a copied-in part apart afterwards.
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

from stateremat._shared.io import atomic_write_bytes
from stateremat.paper.records import PART_KEY, part_identity


def stamp_run(sidecar: Path) -> int:
    """Stamp the unstamped parts of ``sidecar``'s table; returns how many were stamped."""
    table, rows = sidecar.stem, sidecar.parent / sidecar.stem
    doc = json.loads(sidecar.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("table") != table or "config" not in doc:
        return 0  # not a records sidecar
    config = doc["config"]
    done = 0
    for part in sorted(rows.glob("part-*.parquet")):
        tbl = pq.read_table(part)
        meta = dict(tbl.schema.metadata or {})
        if PART_KEY in meta:
            continue
        meta[PART_KEY] = part_identity(table, config, doc.get("run_id"))
        stamped = tbl.replace_schema_metadata(meta)
        buf = io.BytesIO()
        pq.write_table(stamped, buf)
        again = pq.read_table(io.BytesIO(buf.getvalue()))
        assert again.schema.remove_metadata() == tbl.schema.remove_metadata() and again.to_pandas().equals(tbl.to_pandas())  # NaN == NaN here
        atomic_write_bytes(part, buf.getvalue())
        done += 1
    return done


def main(folders: list[str]) -> int:
    total = 0
    for top in map(Path, folders):
        for sidecar in sorted(top.rglob("*.json")):
            if (sidecar.parent / sidecar.stem).is_dir() and any(
                    (sidecar.parent / sidecar.stem).glob("part-*.parquet")):
                n = stamp_run(sidecar)
                total += n
                if n:
                    print(f"{sidecar.parent / sidecar.stem}: stamped {n} part(s)")
    print(f"stamped {total} part(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["results"]))
