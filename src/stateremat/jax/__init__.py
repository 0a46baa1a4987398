"""stateremat.jax: functional state-threading checkpoint with admission checks (DESIGN.md).

Optional extra: importing this package needs ``jax``; importing ``stateremat`` does not.
"""
from ._checkpoint import checkpoint as checkpoint

__all__ = ["checkpoint"]
