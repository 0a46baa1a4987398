"""The vectorised 3-D Pareto filter against a plain double loop, ties included."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from stateremat.planner._pareto import pareto_mask, pareto_mask_bruteforce, pareto_sweep


def _reference(r, q, c):
    """j is removed iff some i ≤ j in all three with (r, c) differing, or same (r, c) and i < j."""
    n = len(r)
    keep = []
    for j in range(n):
        dominated = any(r[i] <= r[j] and q[i] <= q[j] and c[i] <= c[j]
                        and ((r[i], c[i]) != (r[j], c[j]) or i < j) for i in range(n) if i != j)
        keep.append(not dominated)
    return np.array(keep)


_points = st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 4), min_size=n, max_size=n),
    st.lists(st.integers(0, 4), min_size=n, max_size=n),
    st.lists(st.integers(0, 4), min_size=n, max_size=n)))


@settings(max_examples=200, deadline=None)
@given(_points)
def test_sweep_and_broadcast_filters_equal_the_reference_with_many_ties(pts):
    r, q, c = (np.asarray(v, np.int64) for v in pts)
    c = c.astype(np.float64) / 4
    ref = _reference(r, q, c)
    np.testing.assert_array_equal(pareto_sweep(r, q, c), ref)
    np.testing.assert_array_equal(pareto_mask_bruteforce(r, q, c), ref)
    np.testing.assert_array_equal(pareto_mask(r, q, c), ref)


def test_sweep_on_large_random_sets():
    rng = np.random.default_rng(0)
    for n, levels in ((300, 3), (500, 200), (150, 150)):
        r, q = rng.integers(0, 1000, n), rng.integers(0, levels, n)
        c = rng.integers(0, 50, n) / 7.0
        np.testing.assert_array_equal(pareto_sweep(r, q, c), _reference(r, q, c))
        np.testing.assert_array_equal(pareto_mask(r, q, c), _reference(r, q, c))


def test_semantics_of_ties_and_combined_memory():
    # Exact duplicates: only the first (lexicographically smallest policy) survives.
    np.testing.assert_array_equal(pareto_mask(np.array([1, 1]), np.array([2, 2]), np.array([.5, .5])),
                                  [True, False])
    # Equal r and c, later index with smaller q: both kept (a later q can mask the difference).
    np.testing.assert_array_equal(pareto_mask(np.array([1, 1]), np.array([3, 2]), np.array([.5, .5])),
                                  [True, True])
    # Smaller combined memory but larger retained bytes does not dominate.
    np.testing.assert_array_equal(pareto_mask(np.array([4, 0]), np.array([0, 5]), np.array([1., 1.])),
                                  [True, True])
