"""``python -m stateremat``: the ``stateremat`` command.

A stop signal while the command line interface itself is still being imported prints one line
and exits ``128 + signal`` (``stateremat.cli.main`` takes over from there with the same
handling), never a traceback; a signal inherited as ignored (``nohup``) stays ignored.
"""
from stateremat._shared.signals import (
    ignore_stops_at_final_exit, install_stop_handlers, stop_on_signal,
)

if __name__ == "__main__":
    ignore_stops_at_final_exit()  # first of the exit handlers registered: it runs last
    install_stop_handlers(stop_on_signal)
    from stateremat.cli import main

    main()
