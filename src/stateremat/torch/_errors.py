"""The errors ``stateremat.torch`` raises: the contract's classes, also torch's ``CheckpointError``.

Code written for ``torch.utils.checkpoint`` catches ``CheckpointError``; code written for
stateremat catches ``stateremat.ReplayError`` (or a subclass). Each class below is both.
"""
from __future__ import annotations

from stateremat import contract

from . import _compat
from ._compat import CheckpointError


class ReplayError(contract.ReplayError, CheckpointError):
    """A replay contract cannot be honoured (also a ``torch.utils.checkpoint.CheckpointError``)."""


class UndeclaredStateError(contract.UndeclaredStateError, ReplayError):
    """An in-place write hit state that was not declared (R7)."""


class ReplayDivergenceError(contract.ReplayDivergenceError, ReplayError):
    """``verify=True``: recomputation produced different saved tensors (R4)."""


class UnsupportedError(contract.UnsupportedError, ReplayError):
    """Declared state outside the supported domain (R8)."""


_compat.UNSUPPORTED.append(UnsupportedError)  # what _compat's refusals raise (it sits below this module)
