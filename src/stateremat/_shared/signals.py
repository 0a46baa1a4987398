"""Stop signals (SIGINT, SIGTERM, SIGHUP) for the ``stateremat`` command and its runs.

Two rules every handler here keeps: a signal the process inherited as ignored stays ignored
(``nohup`` ignores SIGHUP, a shell ignores SIGINT for a background job ``cmd &``), and once a
stop has begun, further stop signals are ignored, so the cleanup that keeps finished work and
the one-line message are not cut short by a second Ctrl-C or a supervisor's SIGTERM.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import Any, Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def install_stop_handlers(handler: Callable[[int, Any], Any], signals: tuple = STOP_SIGNALS) -> dict[int, Any]:
    """Set ``handler`` for each of ``signals`` that is not ignored now (nor stopping); returns
    the previous handlers of those it set, for :func:`restore_stop_handlers`.

    Raises:
        ValueError: called off the main thread (as ``signal.signal``).
    """
    old = {}
    for s in signals:
        if signal.getsignal(s) not in (signal.SIG_IGN, _stopping):
            old[s] = signal.signal(s, handler)
    return old


def _stopping(signum: int, frame: Any) -> None:
    """The handler once a stop has begun: does nothing. (Not ``SIG_IGN`` while Python code still
    runs: a signal already pending when the handler changes would print "Signal N ignored due to
    race condition"; at exit :func:`_ignore_at_exit` switches to ``SIG_IGN``, because Python
    resets its own handlers to the default, deadly one while it finalizes.)"""


def _ignore_at_exit() -> None:
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is _stopping:
            signal.signal(s, signal.SIG_IGN)


def _ignore_at_final_exit() -> None:
    # Python's finalization puts a stop signal whose handler is a Python function (ours, or
    # its own SIGINT handler) back to the default, deadly action: a signal landing then kills
    # the finished process with no message. Ignored instead, the process keeps its status.
    for s in STOP_SIGNALS:
        if signal.getsignal(s) not in (signal.SIG_IGN, signal.SIG_DFL, None):
            signal.signal(s, signal.SIG_IGN)


_final_exit_registered = False


def ignore_stops_at_final_exit() -> None:
    """Once the command's exit handlers have run, ignore stop signals: a signal landing while
    the interpreter finalizes (its handlers reset to the default one) would otherwise kill
    the finished process with no message and a negative status. Until then they are handled
    as before (:func:`stop_on_signal` exits ``128 + signal`` from an exit handler).

    Called once, as early as possible (exit handlers run last registered first, so this one
    runs after those registered later): by ``python -m stateremat`` and the console script.
    """
    global _final_exit_registered
    if not _final_exit_registered:
        _final_exit_registered = True
        atexit.register(_ignore_at_final_exit)


def restore_stop_handlers(old: dict[int, Any]) -> None:
    """Put back the handlers :func:`install_stop_handlers` returned, unless a stop has begun
    (then they stay ignored until the process exits). Main thread only (``ValueError``)."""
    for s, h in old.items():
        if signal.getsignal(s) not in (signal.SIG_IGN, _stopping):
            signal.signal(s, h)


def ignore_stop_signals() -> None:
    """A stop has begun: ignore every stop signal from now on (main thread only; elsewhere a
    no-op). Signals inherited as ignored stay ``SIG_IGN``."""
    try:
        for s in STOP_SIGNALS:
            if signal.getsignal(s) is not signal.SIG_IGN:
                signal.signal(s, _stopping)
    except ValueError:  # not the main thread
        return
    atexit.unregister(_ignore_at_exit)
    atexit.register(_ignore_at_exit)


def _outside_main_code(frame: Any) -> bool:
    """Whether ``frame`` runs outside the main program: in an exit handler (``atexit``) or
    the interpreter's thread shutdown, where Python ignores a ``SystemExit`` (it prints it and
    keeps the exit status it had). The main program's outermost frame is the ``__main__``
    module's own code, or ``runpy``'s for ``python -m``."""
    import runpy

    while frame is not None and frame.f_back is not None:
        frame = frame.f_back
    if frame is None:
        return False
    code = frame.f_code
    return not (code.co_name == "<module>" or code.co_filename == runpy.__file__)


def stop_on_signal(signum: int, frame: Any) -> None:
    """Signal handler: say which signal stopped the command, in one line, and exit
    ``128 + signal`` (``SystemExit``, so ``finally`` blocks and lock releases still run).

    A signal landing while a finished command runs its exit handlers (or the interpreter
    shuts its threads down) exits ``128 + signal`` at once (``os._exit``, after flushing
    standard output and error): there Python would ignore ``SystemExit`` and exit 0, though
    the stop was said."""
    ignore_stop_signals()
    sys.stderr.write(f"error: stateremat: stopped by {signal.Signals(signum).name}. Tip: rerun "
                     "the same command.\n")
    if _outside_main_code(frame):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed or gone at exit
                pass
        os._exit(128 + signum)
    raise SystemExit(128 + signum)
