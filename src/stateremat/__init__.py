"""stateremat: state-aware activation recomputation.

Replay contracts, preservation engines, a transactional PyTorch checkpoint and a joint
checkpoint planner (arXiv 2611.00590). ``stateremat.torch`` and ``stateremat.jax`` are
optional extras; importing ``stateremat`` needs neither.
"""
from importlib.metadata import PackageNotFoundError as _PNF, version as _version

from .contract import (
    Outcome as Outcome,
    ProfileCardError as ProfileCardError,
    ReplayDivergenceError as ReplayDivergenceError,
    ReplayError as ReplayError,
    RULES as RULES,
    UndeclaredStateError as UndeclaredStateError,
    UnsupportedError as UnsupportedError,
)

try:
    __version__ = _version("stateremat")
except _PNF:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
