"""The vectorised 3-D Pareto filter against an O(N²) reference, ties included."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from stateremat.planner._pareto import pareto_mask, pareto_mask_bruteforce

_points = st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 4), min_size=n, max_size=n),
    st.lists(st.integers(0, 4), min_size=n, max_size=n),
    st.lists(st.integers(0, 4), min_size=n, max_size=n)))


@settings(max_examples=300, deadline=None)
@given(_points)
def test_pareto_mask_equals_bruteforce_with_many_ties(pts):
    r, q, c = (np.asarray(v, np.int64) for v in pts)
    c = c.astype(np.float64) / 4
    np.testing.assert_array_equal(pareto_mask(r, q, c), pareto_mask_bruteforce(r, q, c))


def test_pareto_mask_large_random_and_semantics():
    rng = np.random.default_rng(0)
    r, q = rng.integers(0, 1000, 800), rng.integers(0, 50, 800)
    c = rng.random(800)
    keep = pareto_mask(r, q, c)
    np.testing.assert_array_equal(keep, pareto_mask_bruteforce(r, q, c))
    # Exact duplicates: only the first (lexicographically smallest policy) survives.
    np.testing.assert_array_equal(pareto_mask(np.array([1, 1]), np.array([2, 2]), np.array([.5, .5])),
                                  [True, False])
    # Equal r and c, later index with smaller q: both kept (a later q can mask the difference).
    np.testing.assert_array_equal(pareto_mask(np.array([1, 1]), np.array([3, 2]), np.array([.5, .5])),
                                  [True, True])
    # Smaller combined memory but larger retained bytes does not dominate.
    np.testing.assert_array_equal(pareto_mask(np.array([4, 0]), np.array([0, 5]), np.array([1., 1.])),
                                  [True, True])
