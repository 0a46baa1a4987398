"""Budgets stated relative to a card's all-eager peak (paper §10, §12: frozen budget/eager ratios)."""
from __future__ import annotations

import math

from ..contract import ProfileCard


def eager_fraction_budget(card: ProfileCard, fraction: float) -> int:
    """A logical budget ``M = round(fraction × predicted all-eager peak)`` of ``card``, bytes.

    The paper froze its budgets on measured H100 profiles: 44 GiB is 44/46.063 of the
    large/sparse cell's eager peak (§10, Table 6) and the MoCo selection budget 1,024 MiB is
    1,024/1,389.35 of its (§12). A scaled preset whose fixed overheads do not shrink by the byte
    factor keeps the paper's *pressure* by keeping that ratio on its own measured card.

    Args:
        card: the profile card (its all-eager peak is ``P + Σ r_eager + max q_eager``).
        fraction: budget / eager peak, in ``(0, 1]`` for a budget that forces recomputation.

    Returns:
        The budget in bytes (int, > 0).

    Raises:
        ValueError: ``fraction`` is not a finite number > 0.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not math.isfinite(fraction) or fraction <= 0:
        raise ValueError(f"eager_fraction_budget: fraction must be a finite number > 0, got "
                         f"{fraction!r}. Tip: the paper's fair control uses 44 / 46.063.")
    from ._planners import all_eager

    eager_peak = all_eager(card, 1).predicted_peak_bytes
    return max(1, int(round(fraction * eager_peak)))
