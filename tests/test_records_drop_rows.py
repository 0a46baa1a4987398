"""RecordStore.drop_rows reads each part as read_records does (att27b): a part with a non-UTF-8
name, which read() accepts, is rewritten (it was refused, with a tip to delete it); a named pipe
named like a part is refused at once (drop_rows blocked forever waiting for a writer)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stateremat.paper.records import RecordStore, RecordsError, read_records

TABLE = "scratch_drop"


def _two_parts(d: Path) -> tuple[RecordStore, list[Path]]:
    RecordStore(d, TABLE, key=["k"]).append([{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    s = RecordStore(d, TABLE, key=["k"])
    s.append([{"k": 3, "v": "c"}])
    return s, sorted((d / TABLE).glob("part-*.parquet"))


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS refuses non-UTF-8 file names")
def test_drop_rows_rewrites_a_part_with_a_non_utf8_name(tmp_path):
    store, parts = _two_parts(tmp_path)
    odd = parts[0].with_name(os.fsdecode(b"part-\xff" + parts[0].name[5:].encode()))
    os.rename(parts[0], odd)
    assert sorted(read_records(tmp_path, TABLE)["k"]) == [1, 2, 3]
    assert store.drop_rows(lambda df: df["k"] == 1) == 1
    assert sorted(read_records(tmp_path, TABLE)["k"]) == [2, 3]


def test_drop_rows_refuses_a_named_pipe_at_once(tmp_path):
    fifo = tmp_path / TABLE / "part-00000000T000000-1-000000.parquet"
    code = textwrap.dedent(f"""
        import os
        from stateremat.paper.records import RecordsError, RecordStore
        s = RecordStore({str(tmp_path)!r}, {TABLE!r}, key=["k"])
        s.append([{{"k": 1, "v": "a"}}, {{"k": 2, "v": "b"}}])
        os.mkfifo({str(fifo)!r})
        try:
            s.drop_rows(lambda df: df["k"] == 1)
        except RecordsError as exc:
            print("REFUSED", exc)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("drop_rows blocked on a named pipe named like a part")
    assert "REFUSED" in out.stdout and "named pipe" in out.stdout, out.stdout + out.stderr
    assert str(fifo) in out.stdout
