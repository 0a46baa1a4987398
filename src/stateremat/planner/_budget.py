"""Budgets stated relative to a card's all-eager peak (paper §10, §12: frozen budget/eager ratios)."""
from __future__ import annotations

import math

from ..contract import OPTIONS, ProfileCard


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


def _fraction(budget) -> float | None:
    """The eager-peak fraction ``budget`` names (``0.6``, ``"60%"``), or ``None`` for a size."""
    if isinstance(budget, float) and not isinstance(budget, bool) and math.isfinite(budget) \
            and 0 < budget <= 1:
        return budget
    if isinstance(budget, str) and budget.strip().endswith("%"):
        text = budget.strip()[:-1].strip()
        try:
            pct = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            pct = math.nan
        if not math.isfinite(pct) or pct <= 0 or pct > 10_000:
            shown = budget if len(budget) <= 40 else budget[:40] + "..."
            raise ValueError(f"budget {shown!r}: expected a percentage of the all-eager peak in "
                             "(0%, 10000%], e.g. '60%'")
        return pct / 100.0
    return None


def all_eager_peak(card: ProfileCard, peak: str = "eq3") -> int:
    """Predicted all-eager peak of ``card`` in the ``peak`` model (bytes)."""
    if peak == "chain":
        from ._chain import chain_peak_bytes

        return chain_peak_bytes(card, [OPTIONS.baseline] * len(card.segments))
    from ._planners import all_eager

    return all_eager(card, 1).predicted_peak_bytes


def resolve_budget(card: ProfileCard, budget, peak: str, api: str) -> tuple[int, str | None]:
    """``(bytes, note)`` of a budget given as bytes, a size, or a fraction of the eager peak.

    A float in ``(0, 1]`` or a string ``"60%"`` is that fraction of the card's predicted
    all-eager peak in the ``peak`` model (the note says so); anything else is a size
    (:func:`stateremat.contract.parse_size`).

    Raises:
        ValueError: an unparsable budget, ``"fit"`` (it needs a device) or a bad percentage.
    """
    from ..contract import format_bytes, parse_size

    if isinstance(budget, str) and budget.strip().lower() == "fit":
        raise ValueError(f"{api}: budget 'fit' needs a device to measure free memory; the planner "
                         "has none. Tip: use stateremat.torch.auto_checkpoint(model, 'fit', ...) "
                         "or give bytes, a size ('8GiB') or a fraction of the eager peak ('60%').")
    try:
        frac = _fraction(budget)
        if frac is None:
            return parse_size(budget), None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{api}: bad budget_bytes {budget!r}: {exc}. Tip: bytes, a size such as "
                         "'8GiB', or a fraction of the all-eager peak (0.6 or '60%').") from None
    eager = all_eager_peak(card, peak)
    value = max(1, int(round(frac * eager)))
    return value, (f"budget {frac:.6g} × the all-eager {peak} peak {format_bytes(eager)} "
                   f"({eager} B) = {format_bytes(value)} ({value} B)")
