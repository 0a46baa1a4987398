"""A refused concurrent launch writes nothing (issue 16, kind 3).

Another process holds the run folder (as a running cohort or bench does, through
``stateremat.paper.records.lock_run``); a second launch on the same ``--out`` must be refused
before it writes a byte: no profile card, no cached card, no sidecar, no temp file.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from stateremat.cli import app

HOLDER = ("import sys, time; from stateremat.paper.records import lock_run; lock_run(sys.argv[1]); "
          "print('locked', flush=True); time.sleep(120)")


def _tree(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture()
def held(tmp_path):
    """A run folder with a finished-looking card in it, locked by another process."""
    out = tmp_path / "run"
    for sub in ("profile", "cards"):
        (out / sub).mkdir(parents=True)
        (out / sub / "large_sparse.json").write_text('{"a card": "of the first run"}')
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield out, _tree(out)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize("argv", [
    ["cohort", "processes", "--experiment", "fair44", "--processes", "2", "--preset", "tiny"],
    ["bench", "fair", "--preset", "tiny"],
    ["bench", "pressure", "--preset", "tiny"],
    ["verify", "finite", "--programs", "2"],
    ["cohort", "semantics", "--seeds", "0:1", "--no-progress"],
    ["app", "moco", "--preset", "tiny", "--seeds", "1:2", "--methods", "eager"],
    ["report"],
])
def test_a_refused_second_launch_changes_nothing(held, argv):
    out, before = held
    args = [*argv, str(out)] if argv == ["report"] else [*argv, "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "another process is writing into" in res.output and "Tip:" in res.output
    assert _tree(out) == before
