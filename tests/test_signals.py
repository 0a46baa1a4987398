"""Stop signals: a signal inherited as ignored stays ignored (``nohup``, ``cmd &``), and once a
stop has begun further stop signals do not cut the cleanup short (attack findings 6 and 7)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _cli import catches_signal
from stateremat._shared.signals import (
    STOP_SIGNALS, ignore_stop_signals, install_stop_handlers, restore_stop_handlers,
)

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture()
def saved_handlers():
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    yield
    for s, h in old.items():
        signal.signal(s, h)


def _handler(signum, frame):  # pragma: no cover - never delivered
    pass


def test_install_leaves_ignored_signals_ignored_and_restore_keeps_a_begun_stop(saved_handlers):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    old = install_stop_handlers(_handler)
    assert signal.SIGHUP not in old and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is _handler and signal.getsignal(signal.SIGTERM) is _handler
    restore_stop_handlers(old)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    old = install_stop_handlers(_handler)
    ignore_stop_signals()  # a stop began
    restore_stop_handlers(old)
    stopping = signal.getsignal(signal.SIGINT)
    assert stopping not in (_handler, signal.default_int_handler) and callable(stopping)
    assert signal.getsignal(signal.SIGTERM) is stopping and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert install_stop_handlers(_handler) == {}  # nothing is installed over a begun stop


_catches = catches_signal


def _start(out: Path, ignore: tuple = (), programs: int = 400) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    # ignored here, so inherited as ignored (as nohup does); no preexec_fn: forking a process
    # that has JAX loaded warns
    old = {s: signal.signal(s, signal.SIG_IGN) for s in ignore}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "stateremat", "verify", "finite", "--programs", str(programs),
                                 "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    deadline = time.monotonic() + 60
    while not _catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.005)
    return proc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signame", ["SIGHUP", "SIGINT"])
def test_a_signal_inherited_as_ignored_does_not_stop_the_run(tmp_path, signame):
    signum = getattr(signal, signame)
    proc = _start(tmp_path / "run", ignore=(signum,))
    time.sleep(1.0)  # mid-run, inside the command's own stop handling
    assert proc.poll() is None, "the run ended before the signal: make it longer"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err.decode()
    assert "stopped by" not in err.decode()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("second", ["SIGTERM", "SIGINT", "SIGHUP"])
@pytest.mark.parametrize("when", ["startup", "mid_run"])
def test_a_second_signal_during_the_stop_is_ignored(tmp_path, second, when):
    # long enough that the stop always lands mid-run (it ends the run at ~1 s either way): a run that
    # had just finished exited 0 from its exit handlers, the stop named but not its status
    proc = _start(tmp_path / "run", programs=4000)
    time.sleep(1.0 if when == "mid_run" else 0.0)  # startup: while the paper wing imports
    assert proc.poll() is None, "the run ended before the signal: make it longer"
    proc.send_signal(signal.SIGINT)
    time.sleep(0.005)
    proc.send_signal(getattr(signal, second))
    out, err = proc.communicate(timeout=120)
    err = err.decode()
    assert "Traceback" not in err and "Exception ignored" not in err and "race condition" not in err, err
    assert err.count("stopped by") == 1, err
    # both may be pending when Python next runs handlers (it runs them in signal-number order):
    # the one it handled first names the stop and sets the exit status
    named = next(s for s in ("SIGHUP", "SIGINT", "SIGTERM") if f"stopped by {s}" in err)
    assert named in ("SIGINT", second) and proc.returncode == 128 + getattr(signal, named), err


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs pthread_sigmask")
def test_two_signals_pending_at_once_give_one_line_and_no_race_warning():
    """Both delivered before Python runs a handler (blocked, then unblocked together): the first
    handled names the stop; the second finds the stop begun (no second line, no "Signal N ignored
    due to race condition")."""
    code = ("import os, signal, time\n"
            "from stateremat._shared.signals import install_stop_handlers, stop_on_signal\n"
            "install_stop_handlers(stop_on_signal)\n"
            "both = [signal.SIGINT, signal.SIGTERM]\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, both)\n"
            "for s in both: os.kill(os.getpid(), s)\n"
            "signal.pthread_sigmask(signal.SIG_UNBLOCK, both)\n"
            "time.sleep(5)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 128 + signal.SIGINT, res.stderr  # handled in signal-number order
    assert res.stderr.count("stopped by") == 1 and "race condition" not in res.stderr, res.stderr
