"""The records error: a run folder, sidecar or part that cannot be used as it is."""
from __future__ import annotations


class RecordsError(ValueError):
    """A records directory or file is unusable (wrong schema, mixed experiments, corrupt part).

    A ``ValueError`` (bad input: the library's ``stateremat`` command prints it as one
    ``error:`` line and exits 2, as the paper commands do), not a
    :class:`~stateremat.contract.ReplayError`: nothing here is a replay contract that cannot be
    honoured, and no code catches ``ReplayError`` (or ``RuntimeError``) to handle records
    errors. It lived in ``stateremat.contract`` as a ``ReplayError`` before: code that caught
    it as ``ValueError`` catches it still.
    """
