"""stateremat: state-aware activation recomputation.

Replay contracts, preservation engines, a transactional PyTorch checkpoint and a joint
checkpoint planner (arXiv 2611.00590). ``stateremat.torch`` and ``stateremat.jax`` are
optional extras; importing ``stateremat`` needs neither (nor the paper wing's pandas).
"""
from .contract import (
    OPTIONS as OPTIONS, Option as Option, Outcome as Outcome, ProfileCard as ProfileCard,
    ProfileCardError as ProfileCardError, ReplayDivergenceError as ReplayDivergenceError,
    ReplayError as ReplayError, RULES as RULES, UndeclaredStateError as UndeclaredStateError,
    UnsupportedError as UnsupportedError, load_card as load_card, save_card as save_card,
)
from ._shared.io import package_version as _package_version
from .planner import PlanResult as PlanResult, plan as plan

__version__ = _package_version()

__all__ = [
    "OPTIONS", "Option", "Outcome", "PlanResult", "ProfileCard", "ProfileCardError",
    "RULES", "ReplayDivergenceError", "ReplayError", "UndeclaredStateError", "UnsupportedError",
    "__version__", "load_card", "plan", "save_card",
]
