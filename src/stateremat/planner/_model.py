"""The static policy model (paper §4, eq. 3) as dense per-segment cost tables.

Every solver (DP, exhaustive, MILP, fixed policies) reads the same :class:`CostTables`, so
they optimise literally the same numbers: minimise ``Σ_i c[i, o_i]`` subject to
``P + Σ_i r[i, o_i] + max_i q[i, o_i] ≤ M``. The tables have one column per option of
:data:`stateremat.contract.OPTIONS`, in registry order, read when the tables are built.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..contract import OPTIONS, RECOMPUTE_ONLY, ProfileCard, ProfileCardError, internal_assert

#: Placeholder bytes for an absent option in min/max reductions. Cards cap every size at
#: ``MAX_BYTES`` = 2^53 and their total peak below 2^62 (``ProfileCard``), so no real value
#: or sum of real values reaches it, and sums of a few placeholders stay below int64's 2^63.
_ABSENT = 2**62

#: Largest ``Σ_i max_o c`` the solvers work with (seconds). A card's times are finite but may be
#: as large as 1.8e308; their sums (and the DP's Lagrangian products ``λ r``) would overflow.
#: Such a card's times are divided by a power of two (exact: order and ties are kept) until their
#: largest sum is at most this; reported times are scaled back and may then be ``inf``.
MAX_TIME_SUM_S = 2.0**64


def _time_scale(c: np.ndarray, valid: np.ndarray) -> float:
    """Power of two to divide ``c`` by so that ``Σ_i max_o c ≤`` :data:`MAX_TIME_SUM_S`."""
    top = float(np.where(valid, c, 0.0).max())
    if top == 0.0:
        return 1.0
    # Σ_i max_o c ≤ n · top < 2^(e + ceil(log2 n)) with top < 2^e; no float sum is formed.
    e = math.frexp(top)[1] + max(int(c.shape[0]) - 1, 0).bit_length()
    shift = e - 64
    return 1.0 if shift <= 0 else math.ldexp(1.0, shift)


@dataclass(frozen=True)
class CostTables:
    """Per-segment option costs as arrays; invalid (absent or excluded) options are masked.

    Args:
        names: segment names, length ``n``.
        persistent_bytes: ``P``.
        r: retained bytes, ``(n, k)`` int64, one column per option (``k = len(option_names)``).
        q: temporary bytes, ``(n, k)`` int64.
        c: seconds, ``(n, k)`` float64.
        valid: ``(n, k)`` bool, option allowed for that segment in this model.
        option_names: the option of each column (:data:`stateremat.contract.OPTIONS` order when
            built; a lower column wins ties).
        fallback_segments: segments where a state-agnostic model had no ``recompute_only``
            entry and used ``whole``'s true costs instead.
        time_scale: ``c`` holds the card's seconds divided by this power of two (1.0 unless
            the card's times are so large that their sums could overflow float64, see
            :data:`MAX_TIME_SUM_S`); multiply a time of these tables by it to get seconds.
        chain_base, chain_outside: live bytes at the first segment's entry and the peaks
            outside the segments, for the chain peak model (:func:`chain_parts`).
    """

    names: list[str]
    persistent_bytes: int
    r: np.ndarray
    q: np.ndarray
    c: np.ndarray
    valid: np.ndarray
    option_names: tuple[str, ...]
    fallback_segments: tuple[str, ...] = ()
    time_scale: float = 1.0
    chain_base: int = 0
    chain_outside: int = 0

    def seconds(self, time: float) -> float:
        """A time of these tables in seconds (``inf`` when past float range)."""
        return float(time) * self.time_scale if self.time_scale != 1.0 else float(time)

    @property
    def n(self) -> int:
        """Number of segments."""
        return len(self.names)

    @property
    def k(self) -> int:
        """Number of option columns."""
        return len(self.option_names)

    def option_list(self, codes) -> list[str]:
        """Option names of ``codes`` (column indices, one per segment)."""
        return [self.option_names[int(k)] for k in codes]


def cost_tables(card: ProfileCard, options: tuple[str, ...] | None = None,
                omit_preservation: bool = False) -> CostTables:
    """Build the cost tables a planner sees.

    Args:
        card: the profile card.
        options: subset of the registered options (:data:`stateremat.contract.OPTIONS`) the
            planner may choose; ``None``: all of them.
        omit_preservation: state-agnostic view: ``whole`` costs are replaced by the card's
            ``recompute_only`` entry (replay without preservation) where present.

    Returns:
        :class:`CostTables` with ``len(OPTIONS)`` columns; an option is invalid where the card
        omits it (e.g. ``region`` for segments without declared state).

    Raises:
        ValueError: unknown option names or an empty option set.
        ProfileCardError: ``card`` is not a ProfileCard, or a field no longer passes the
            card's checks (:meth:`~stateremat.contract.ProfileCard.validate`).
    """
    if not isinstance(card, ProfileCard):
        raise ProfileCardError(f"planner: expected a ProfileCard, got {type(card).__name__}. "
                               "Tip: load one with stateremat.contract.load_card(path).")
    card.validate()  # a value forced in after construction is refused, never planned on
    names = OPTIONS.names  # read now: a test may have registered an option
    options = names if options is None else tuple(options)
    bad = [o for o in options if o not in names]
    if bad or not options:
        raise ValueError(f"planner: options must be a non-empty subset of {list(names)}, "
                         f"got {list(options)}. Tip: {RECOMPUTE_ONLY} is a cost view, not an option.")
    n, k_opts = len(card.segments), len(names)
    r = np.zeros((n, k_opts), np.int64)
    q = np.zeros((n, k_opts), np.int64)
    c = np.zeros((n, k_opts), np.float64)
    valid = np.zeros((n, k_opts), bool)
    fallback = []
    for i, seg in enumerate(card.segments):
        for k, o in enumerate(names):
            if o not in options or o not in seg.options:
                continue
            cost = seg.options[o]
            if omit_preservation and o == OPTIONS.control:
                if RECOMPUTE_ONLY in seg.options:
                    cost = seg.options[RECOMPUTE_ONLY]
                else:
                    fallback.append(seg.name)
            r[i, k], q[i, k], c[i, k], valid[i, k] = (cost.retained_bytes, cost.temp_bytes,
                                                      cost.time_s, True)
        if not valid[i].any():
            raise ValueError(f"planner: segment {seg.name!r} has none of the options "
                             f"{list(options)} (it has {list(seg.options)}). Tip: include eager "
                             "or whole in the option set; region is optional per segment.")
    internal_assert(int(max(r.max(), q.max(), card.persistent_bytes)) < _ABSENT,
                    "card sizes above the placeholder passed ProfileCard's size cap")
    scale = _time_scale(c, valid)
    if scale != 1.0:
        c = c / scale  # exact (a power of two), barring subnormal underflow of tiny times
    return CostTables(card.segment_names, card.persistent_bytes, r, q, c, valid, names,
                      tuple(fallback), scale, *chain_parts(card))


def chain_parts(card: ProfileCard) -> tuple[int, int]:
    """``(base, outside)`` bytes of the chain model from ``card.meta["persistent"]``.

    Raises:
        ProfileCardError: a recorded part is not an integer number of bytes in ``[0, 2^53]``.
    """
    parts = card.meta.get("persistent", {})
    if not isinstance(parts, dict):
        parts = {}

    def get(key: str, default: int) -> int:
        v = parts.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**53:
            raise ProfileCardError(
                f"profile card: meta.persistent.{key}: expected an integer number of bytes in "
                f"[0, 2^53], got {type(v).__name__} {v!r}. Tip: the profiler writes it; "
                "re-profile, or remove meta.persistent to plan with base = persistent_bytes.")
        return v

    base = get("first_segment_entry_bytes", card.persistent_bytes)
    outside = max(get("before_first_segment_peak_bytes", 0), get("after_backward_peak_bytes", 0),
                  get("before_first_segment_backward_peak_bytes", 0))  # the stem's backward
    return base, outside


def max_peak_bytes(tables: CostTables) -> int:
    """Largest ``P + Σ r + max q`` any policy can have (bytes, Python int, no overflow)."""
    r = np.where(tables.valid, tables.r, 0)
    q = np.where(tables.valid, tables.q, 0)
    return tables.persistent_bytes + sum(int(v) for v in r.max(axis=1)) + int(q.max())


def clamp_budget(tables: CostTables, budget_bytes: int) -> int:
    """``budget_bytes`` clamped to ``[-1, max_peak_bytes]``: the same feasible set, no overflow.

    Every budget at or above the largest possible peak admits every policy and every negative
    budget admits none, so solvers may work with the clamped value in int64 arithmetic.
    """
    return max(-1, min(int(budget_bytes), max_peak_bytes(tables)))


def left_fold_sum(values) -> float:
    """Sum in segment order, the way the DP accumulates (bitwise-reproducible across solvers)."""
    total = 0.0
    for v in values:
        total += float(v)
    return total


def evaluate(tables: CostTables, codes) -> tuple[int, float]:
    """Predicted ``(peak_bytes, time_s)`` of a policy (option codes per segment) in ``tables``.

    Raises:
        ValueError: if a code selects an option that is invalid for its segment.
    """
    codes = np.asarray(codes, dtype=np.int64)
    rows = np.arange(tables.n)
    if codes.shape != (tables.n,) or not tables.valid[rows, codes].all():
        raise ValueError(f"planner: policy {codes.tolist()} selects an option that this model "
                         "does not allow. Tip: the card omits region for some segments.")
    peak = tables.persistent_bytes + int(tables.r[rows, codes].sum()) + int(tables.q[rows, codes].max())
    return peak, left_fold_sum(tables.c[rows, codes])


def min_peak(tables: CostTables) -> tuple[int, np.ndarray]:
    """Exact minimum of ``P + Σ r + max q`` over all policies, and one policy attaining it.

    Sweeps the threshold ``T`` on the maximum temporary bytes over every distinct ``q``: at
    each ``T`` every segment takes its smallest-``r`` option with ``q ≤ T``. Independent of the
    DP (used to report ``min_feasible_peak_bytes`` even when the DP is truncated).

    Returns:
        ``(peak_bytes, codes)``; among equal-``r`` options a segment takes the faster one.
    """
    n = tables.n
    big = _ABSENT
    r = np.where(tables.valid, tables.r, big)
    q = np.where(tables.valid, tables.q, big)
    order = np.argsort(q, axis=1, kind="stable")
    qs = np.take_along_axis(q, order, 1)
    stair = np.minimum.accumulate(np.take_along_axis(r, order, 1), axis=1)  # min r with q ≤ qs
    # Events: at T = qs[i, j] segment i's min r drops from stair[i, j-1] to stair[i, j].
    delta = np.diff(stair, axis=1, prepend=0)
    t0 = int(qs[:, 0].max())  # smallest T at which every segment has an admissible option
    ev_q, ev_d = qs.ravel(), delta.ravel()
    live = ev_q < big
    base_mask = np.zeros_like(ev_q, dtype=bool)
    base_mask[::tables.k] = True  # first event of each segment: its initial min r (always ≤ t0)
    ev_order = np.argsort(ev_q, kind="stable")
    ev_q, ev_d, ev_first, live = ev_q[ev_order], ev_d[ev_order], base_mask[ev_order], live[ev_order]
    keep = live & ((ev_d != 0) | ev_first)
    ev_q, ev_d = ev_q[keep], ev_d[keep]
    total_r = np.cumsum(ev_d)
    last_of_q = np.r_[ev_q[1:] != ev_q[:-1], True]  # state after all events at that q
    cand_t, cand_r = ev_q[last_of_q], total_r[last_of_q]
    ok = cand_t >= t0
    cand_peak = tables.persistent_bytes + cand_r[ok] + cand_t[ok]
    best = int(np.argmin(cand_peak))
    t_star = int(cand_t[ok][best])
    # Reconstruct: per segment the smallest r with q ≤ T*, ties by time then code.
    allowed = tables.valid & (tables.q <= t_star)
    key_r = np.where(allowed, tables.r, big)
    codes = np.empty(n, np.int64)
    for i in range(n):
        cand = np.flatnonzero(key_r[i] == key_r[i].min())
        codes[i] = cand[np.argmin(tables.c[i, cand])]
    peak, _ = evaluate(tables, codes)
    internal_assert(peak == int(cand_peak[best]),
                    f"min_peak reconstruction {peak} != sweep {int(cand_peak[best])}")
    return peak, codes
