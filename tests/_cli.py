"""Helpers shared by the command-line tests: run the real ``stateremat`` app in process, and read
whether a process has a handler installed for a signal."""
from __future__ import annotations

from typer.testing import CliRunner

from stateremat.cli import app

runner = CliRunner()


def run_cli(*argv):
    """``stateremat ARGV...`` through typer's runner; never a traceback, never an exception other
    than the exit (a crash inside a command fails the test here, not as a wrong exit code)."""
    res = runner.invoke(app, [str(a) for a in argv])
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res


def catches_signal(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum`` (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            status = fh.read()
    except OSError:
        return False
    caught = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)
    return bool(caught >> (signum - 1) & 1)
