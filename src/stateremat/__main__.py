"""``python -m stateremat``: the ``stateremat`` command.

A stop signal while the command line interface itself is still being imported prints one line
and exits ``128 + signal`` (``stateremat.cli.main`` takes over from there with the same
handling), never a traceback.
"""
import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_on_signal(signum, frame):
    """Signal handler: say which signal stopped the command, in one line, and exit
    ``128 + signal`` (``SystemExit``, so ``finally`` blocks and lock releases still run)."""
    sys.stderr.write(f"error: stateremat: stopped by {signal.Signals(signum).name}. Tip: rerun "
                     "the same command.\n")
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    for _s in STOP_SIGNALS:
        signal.signal(_s, stop_on_signal)
    from stateremat.cli import main

    main()
