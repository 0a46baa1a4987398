"""Launching cohort processes: one fresh interpreter each, stopped cleanly however the run stops.

Local processes run from the parent's main thread (no helper threads), each in a work folder
of its own under the run folder's ``.tmp/`` (removed when its result is collected, and by the
next launch after a ``kill -9``). Every child asks the kernel to kill it when the parent dies
(``prctl(PR_SET_PDEATHSIG, SIGKILL)`` first thing in ``worker_main``, given the parent's pid
in :data:`PARENT_ENV`), so even a ``kill -9`` of the parent leaves no orphan running. A
SIGINT, SIGTERM or SIGHUP of the parent (or Ctrl-C to its process group) is turned into a stop
request (:class:`StopRequest`): nothing more is launched, running children get SIGTERM
(SIGKILL after :data:`GRACE_S`), and whatever had finished is still reported. Paper §11.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..._shared.io import atomic_write_bytes
from ..._shared.signals import ignore_stop_signals, install_stop_handlers, restore_stop_handlers
from ._process_worker import PARENT_ENV

STDERR_TAIL_CHARS = 4000
#: Seconds a stopped child gets between SIGTERM and SIGKILL.
GRACE_S = 5.0
_POLL_S = 0.05
#: Seconds to reach a Dask scheduler (and to hear its handshake) before giving up.
DASK_CONNECT_TIMEOUT_S = 5.0
#: Schemes of a ``--dask`` address string: only ``tcp``, whose scheduler handshake can be
#: checked here in seconds (tls/ws/wss/ucx need security or transport settings a string
#: cannot carry: pass a configured ``distributed.Client`` to :func:`run_process_cohort`).
DASK_SCHEMES = ("tcp",)
#: Dask schemes refused by name (``distributed`` comms that a string address cannot check).
_OTHER_DASK_SCHEMES = ("tls", "ws", "wss", "ucx", "inproc")
#: Largest first frame accepted as a Dask handshake (a real one is a few hundred bytes).
DASK_HANDSHAKE_MAX_BYTES = 1 << 16
_DASK_ADDRESS = re.compile(r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?"
                           r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d{1,5})")


def check_dask_address(address: str, api: str = "stateremat cohort processes",
                       timeout_s: float = DASK_CONNECT_TIMEOUT_S) -> None:
    """Refuse a malformed ``--dask`` address, or one where no Dask scheduler answers, within
    ``timeout_s`` seconds in all (before anything is measured or launched).

    The address is ``host:port`` or ``tcp://host:port`` (:data:`DASK_SCHEMES`); other schemes
    are refused (pass a configured ``distributed.Client`` to ``run_process_cohort`` for them).
    A ``tcp`` scheduler sends its handshake as soon as it accepts a connection: an 8-byte
    little-endian length, then that many bytes of frames holding a msgpack dict. Silence,
    a closed connection, or anything else (an SSH banner, an HTTP server, a length above
    :data:`DASK_HANDSHAKE_MAX_BYTES`) is refused.

    Raises:
        ValueError: naming the address, what was wrong and a tip.
    """
    tip = ("Tip: pass the address `dask scheduler` prints (e.g. tcp://10.0.0.5:8786), or omit "
           "--dask to run the processes on this machine.")
    m = _DASK_ADDRESS.fullmatch(str(address).strip())
    scheme = (m.group("scheme") or "tcp").lower() if m else None
    if m is None or scheme not in DASK_SCHEMES + _OTHER_DASK_SCHEMES \
            or not 1 <= int(m.group("port")) <= 65535:
        raise ValueError(f"{api}: --dask {address!r}: expected host:port or scheme://host:port "
                         f"(scheme {', '.join(DASK_SCHEMES)}; port 1 to 65535). {tip}")
    if scheme not in DASK_SCHEMES:
        raise ValueError(f"{api}: --dask {address!r}: scheme {scheme!r} is not supported; "
                         f"--dask takes tcp addresses only (host:port or tcp://host:port), the "
                         "ones whose scheduler can be checked before the cohort starts. Tip: for "
                         f"a {scheme} scheduler call run_process_cohort(..., dask_address=client) "
                         "from Python with a distributed.Client configured for it, or start the "
                         "scheduler with a tcp:// address.")
    host, port = m.group("host").strip("[]"), int(m.group("port"))
    where = f"{api}: --dask {address!r}"
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            head = _recv_exactly(conn, 8, deadline)
            n = int.from_bytes(head, "little")
            if not 0 < n <= DASK_HANDSHAKE_MAX_BYTES:
                raise _NotDask(f"it sent {head!r}, not a Dask handshake")
            _check_handshake(_recv_exactly(conn, n, deadline))
    except socket.gaierror as exc:
        raise ValueError(f"{where}: unknown host {host!r} ({exc.strerror or exc}). {tip}") from None
    except (TimeoutError, socket.timeout):
        raise ValueError(f"{where}: no Dask scheduler answered within {timeout_s:g} s. {tip}") \
            from None
    except _NotDask as exc:
        raise ValueError(f"{where}: no Dask scheduler answered there ({exc}). {tip}") from None
    except OSError as exc:
        raise ValueError(f"{where}: no Dask scheduler there ({type(exc).__name__}: "
                         f"{exc.strerror or exc}). {tip}") from None


class _NotDask(Exception):
    """Something answered, but not a Dask scheduler's handshake."""


def _recv_exactly(conn: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes from ``conn`` before ``deadline`` (``time.monotonic``)."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise _NotDask("it closed the connection " + (
                "without a handshake" if not buf else f"after {bytes(buf[:16])!r}"))
        buf += chunk
    return bytes(buf)


def _check_handshake(body: bytes) -> None:
    """Refuse ``body`` unless it is a Dask handshake: frames decoding to a dict."""
    try:
        from distributed.protocol import loads
        from distributed.protocol.utils import unpack_frames

        frames, missing = unpack_frames(body, partial=True)
        if missing:
            raise _NotDask("its handshake is longer than it said")
        msg = loads(frames, deserialize=False)
    except _NotDask:
        raise
    except Exception as exc:  # junk of any kind: never a traceback
        raise _NotDask(f"its first {len(body)} bytes are not a Dask handshake: "
                       f"{type(exc).__name__}") from None
    if not isinstance(msg, dict):
        raise _NotDask(f"its handshake is a {type(msg).__name__}, not a dict")


class CohortStopped(KeyboardInterrupt):
    """A stop signal ended an in-process cohort run: what finished is kept on disk.

    A ``KeyboardInterrupt`` (a generic ``except Exception`` does not swallow it), raised after the
    host's own signal handlers are back.

    Attributes:
        signum: the signal (``signal.SIGINT``, ``SIGTERM`` or ``SIGHUP``).
        summary: the run's summary dict (as :func:`run_process_cohort` returns it).
    """

    def __init__(self, signum: int, summary: dict[str, Any]) -> None:
        super().__init__(f"cohort run stopped by {signal.Signals(signum).name}; the rows of finished "
                         f"processes are kept in {summary.get('out_dir')} (rerun to resume)")
        self.signum = signum
        self.summary = summary


class StopRequest:
    """While active (a ``with`` block in the main thread), SIGINT/SIGTERM/SIGHUP set
    :attr:`signum` instead of interrupting; a second SIGINT raises ``KeyboardInterrupt``.

    Args:
        restore: put the host's handlers back on exit even after a stop (a library call that
            re-raises it); by default a stop leaves the stop signals ignored (the command reports
            and exits, uninterrupted).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, restore: bool = False) -> None:
        self.signum: int | None = None
        self.restore = restore
        self._old: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """A stop was asked for."""
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the children
            return  # the first signal names the stop
        self.signum = signum

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._old = install_stop_handlers(self._handle, self.SIGNALS)  # inherited-ignored ones stay ignored
        return self

    def __exit__(self, *exc) -> None:
        if self.restore:
            restore_stop_handlers(self._old)
        elif self.signum is not None or exc[0] is not None:
            ignore_stop_signals()  # stopping: the caller reports and exits, uninterrupted
        else:
            restore_stop_handlers(self._old)


class Child:
    """One launched cohort process: its work folder, its ``Popen`` and its start time.

    Args:
        args: worker arguments without ``--rows-out``/``--profile``/``--threads``.
        work: the child's own work folder (created; removed by :meth:`result`).
        worker_cmd: command prefix; default ``[sys.executable, "-m", "stateremat", "cohort",
            "process-worker"]``.
        cards: frozen profile cards ``{cell: card JSON text}``, written into ``work/profile``.
        threads: CPU threads of the child (``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` and
            ``--threads``); None leaves the environment as it is.
    """

    def __init__(self, args: Sequence[str], work: Path, worker_cmd: Sequence[str] | None,
                 cards: Mapping[str, str] | None, threads: int | None) -> None:
        cmd = list(worker_cmd or [sys.executable, "-m", "stateremat", "cohort", "process-worker"])
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.rows_out = self.work / "rows.parquet"
        extra = ["--rows-out", str(self.rows_out)]
        if cards:
            for cell, text in cards.items():
                atomic_write_bytes(self.work / "profile" / f"{cell}.json", text.encode())
            extra += ["--profile", str(self.work / "profile")]
        env = dict(os.environ, **{PARENT_ENV: str(os.getpid())})
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            extra += ["--threads", str(threads)]
        self._log = open(self.work / "output.txt", "wb")
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd + list(args) + extra, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def expired(self, timeout_s: float | None) -> bool:
        """Running for longer than ``timeout_s`` seconds."""
        return timeout_s is not None and time.perf_counter() - self.t0 > timeout_s

    def signal(self, signum: int) -> None:
        """Send ``signum`` if the child still runs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def result(self, status: str | None = None, note: str = "") -> dict[str, Any]:
        """Wait for the child and return its outcome; removes its work folder.

        Args:
            status: ``"timeout"`` or ``"interrupted"`` when the parent stopped it (a child that
                still finished with its rows is ``"ok"`` regardless); None: ``ok``/``failed``.
            note: appended to the output tail (why it was stopped).

        Returns:
            ``{"exit_code", "status", "stderr_tail", "wall_s", "hostname", "rows_parquet"}``.
        """
        code = self.proc.wait()
        wall = time.perf_counter() - self.t0
        self._log.close()
        out = (self.work / "output.txt").read_bytes().decode(errors="replace")
        if code < 0:  # no traceback from a signal: say which one
            out += f"\nkilled by signal {-code}"
        out += note
        data = self.rows_out.read_bytes() if code == 0 and self.rows_out.exists() else None
        shutil.rmtree(self.work, ignore_errors=True)
        status = "ok" if data is not None else (status or "failed")
        return {"exit_code": int(code), "status": status, "stderr_tail": out[-STDERR_TAIL_CHARS:],
                "wall_s": wall, "hostname": platform.node(), "rows_parquet": data}


def stop_children(children: Mapping[int, Child], grace_s: float = GRACE_S) -> None:
    """SIGTERM every running child, then SIGKILL those still running after ``grace_s``."""
    for ch in children.values():
        ch.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for ch in children.values():
        try:
            ch.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ch.signal(signal.SIGKILL)


def local_results(tasks: Sequence[tuple[int, list[str]]], jobs: int, work_dir: Path,
                  worker_cmd, timeout_s, cards, threads,
                  stop: StopRequest) -> Iterator[tuple[int, dict]]:
    """Run ``tasks`` (``(process, args)``) ``jobs`` at a time; yield ``(process, result)`` as
    each finishes.

    On a stop request nothing more is launched; running children are stopped
    (:func:`stop_children`) and yielded as ``interrupted`` (or ``ok`` if they finished with
    their rows meanwhile). If the consumer stops iterating or an exception is raised, running
    children are killed and their work folders removed.
    """
    pending = list(tasks)
    running: dict[int, Child] = {}
    try:
        while (pending or running) and not stop.requested:
            while pending and len(running) < jobs and not stop.requested:
                p, args = pending.pop(0)
                running[p] = Child(args, work_dir / f"process-{p}", worker_cmd, cards, threads)
            for p, ch in list(running.items()):
                if ch.proc.poll() is not None:  # (Ctrl-C reaches the children too: not failed)
                    yield p, running.pop(p).result("interrupted" if stop.requested else None)
                elif ch.expired(timeout_s):
                    ch.signal(signal.SIGKILL)
                    yield p, running.pop(p).result("timeout", f"\nkilled after {timeout_s} s")
            time.sleep(_POLL_S)
        if stop.requested:
            stop_children(running)
            name = signal.Signals(stop.signum).name
            while running:
                p, ch = running.popitem()
                yield p, ch.result("interrupted", f"\nstopped: the cohort received {name}")
    finally:
        stop_children(running, grace_s=0.0)
        for ch in running.values():
            ch.result("interrupted")


def run_one_process(args: Sequence[str], worker_cmd: Sequence[str] | None = None,
                    timeout_s: float | None = None,
                    cards: Mapping[str, str] | None = None,
                    threads: int | None = None) -> dict[str, Any]:
    """Launch one fresh interpreter for one cohort process, wait, and collect its rows.

    Runs wherever it is called (a Dask task on a worker, where ``sys.executable`` is the
    worker's interpreter); its work folder is a temporary folder there. Needs no shared file
    system: the rows come back as Parquet bytes. Arguments as for :class:`Child`;
    ``timeout_s`` kills the child after that many seconds (status ``timeout``).

    Returns:
        ``{"exit_code", "status" ("ok" | "failed" | "timeout"), "stderr_tail", "wall_s",
        "hostname", "rows_parquet" (bytes or None)}``.
    """
    with tempfile.TemporaryDirectory(prefix="stateremat-cohort-") as tmp:
        ch = Child(args, Path(tmp) / "work", worker_cmd, cards, threads)
        try:
            ch.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            ch.signal(signal.SIGKILL)
            return ch.result("timeout", f"\nkilled after {timeout_s} s")
        finally:
            if ch.proc.poll() is None:  # interrupted while waiting: never leave it running
                ch.signal(signal.SIGKILL)
                ch.result("interrupted")
        return ch.result()


def dask_results(tasks: Sequence[tuple[int, list[str]]], address: Any, worker_cmd, timeout_s,
                 cards, threads, stop: StopRequest) -> Iterator[tuple[int, dict]]:
    """Run ``tasks`` as Dask tasks (each launches a fresh interpreter on its worker).

    On a stop request the tasks not yet finished are cancelled (a task already running on a
    worker runs to its end there; its rows are not collected).
    """
    from distributed import Client

    own = not hasattr(address, "submit")
    try:
        client = (Client(address, set_as_default=False, timeout=DASK_CONNECT_TIMEOUT_S) if own
                  else address)
    except (OSError, TimeoutError) as exc:
        raise OSError(f"stateremat cohort processes: cannot connect to the Dask scheduler "
                      f"{address!r} ({type(exc).__name__}: {exc}). Tip: check that it is "
                      "running, or omit --dask to run the processes on this machine.") from None
    futures: dict[Any, int] = {}
    try:
        futures = {client.submit(run_one_process, a, worker_cmd, timeout_s, cards, threads,
                                 pure=False,
                                 key=f"stateremat-process-{p}-{os.getpid()}-{time.time_ns()}"): p
                   for p, a in tasks}
        while futures and not stop.requested:
            for fut in [f for f in futures if f.done()]:
                p = futures.pop(fut)
                try:
                    yield p, fut.result()
                except Exception as exc:  # the task itself died (worker lost): a failed attempt
                    yield p, {"exit_code": -1, "status": "failed", "stderr_tail":
                              f"dask task error: {type(exc).__name__}: {exc}"[-STDERR_TAIL_CHARS:],
                              "wall_s": float("nan"), "hostname": "unknown", "rows_parquet": None}
            time.sleep(_POLL_S)
    finally:
        if futures:
            client.cancel(list(futures))
        if own:
            client.close()
