"""Hypothesis: every engine recovers arbitrary programs under arbitrary segmentations."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from stateremat.reference import execute, forward_jacobian_grad
from stateremat.paper.verify._study import admission, check_recovery
from stateremat.reference.engines import ENGINES, RegionEngine, make_engine
from test_finite_properties import programs


def _segments(n_ops, cuts):
    bounds = sorted({0, n_ops, *[c % n_ops for c in cuts]})
    return list(zip(bounds[:-1], bounds[1:]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(aliases=False), st.lists(st.integers(0, 100), max_size=4))
def test_every_engine_matches_the_reference_on_random_programs(p, cuts):
    segs = _segments(len(p.ops), cuts)
    run = execute(p)
    assert admission(p, run) is None
    ref = forward_jacobian_grad(run)
    for name in ENGINES:
        row = check_recovery(p, segs, make_engine(name, p, segs), ref)
        assert row["outcome"] == "M", (name, row["message"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(aliases=False))
def test_own_writes_only_journal_fails_exactly_when_later_writes_destroy_needed_bytes_R6(p):
    segs = [(k, k + 1) for k in range(len(p.ops))]  # one op per segment
    run = execute(p)
    states = [p.initial_bytes()]
    for r in run.records:  # B_0 .. B_T from the stored operations
        b = states[-1].copy()
        b[r.write_byte_offsets()] = r.new_bytes.ravel()
        states.append(b)
    predicted = False
    for s, r in enumerate(run.records):
        need = np.setdiff1d(r.read_byte_offsets(), r.write_byte_offsets())
        predicted |= bool((states[s][need] != states[-1][need]).any())
    ref = forward_jacobian_grad(run)
    bad = check_recovery(p, segs, RegionEngine(p, segs, cover_later_writes=False), ref)
    assert (bad["outcome"] == "D") == predicted
    assert check_recovery(p, segs, RegionEngine(p, segs), ref)["outcome"] == "M"
