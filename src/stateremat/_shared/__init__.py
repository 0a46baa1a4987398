"""Private helpers the library's command line and the paper wing share; not an API.

No face exports these (``stateremat.cli`` exports its app and entry point, ``stateremat.contract``
the contract). This is the one private package other packages may import from, module by module
(``tests/test_layout.py`` allows it by name); it imports no other stateremat package but the
contract (and :mod:`.io` and :mod:`.signals` only numpy and the standard library):

- :mod:`.io`: atomic file writes, JSON and source hashes, git revision, package version, UTC
  clock, load average and the provenance every record carries (the contract's card writes and
  hashes through it; ``import stateremat`` loads it for the version);
- :mod:`.signals`: SIGINT/SIGTERM/SIGHUP handling for long commands and their workers;

- :mod:`.checks`: the checks every command makes before any work (output paths, devices, memory
  estimates, ranges), :func:`~.checks.fail` and :data:`~.checks.MAX_SEED` (typer);
- :mod:`.progress`: what a runner reports while it works (:class:`~.progress.Progress`), the one
  progress bar that draws it (rich, on stderr) and the stop flag the bar checks after each unit.
"""
