"""The finite reference against hand-derived values, its tables, controls and boundaries."""
import subprocess
import sys

import numpy as np
import pytest

from stateremat.contract import UnsupportedError
from stateremat.paper.verify import byte_program, derivative_program
from stateremat.reference import (
    Op, Program, Region, View, complex_step_grad, execute,
    forward_jacobian_grad, forward_with_snapshot, graph_output, region_undo_replay, reverse_grad,
    same_state, scalar_output, snapshot_replay, unsupported_reason, wrong_rng_state,
)
from stateremat.reference._ops import ARITY, FLOAT_KINDS, FORWARD, INT_KINDS, JVP, N_COEF, VJP


def _shift_program(kind="tanh"):
    # F = [x0, x1, x2]; op: F[1:3] <- tanh(F[0:2]) in place with overlapping source (R1)
    regions = (Region("F", "f8", 3),)
    views = (View("lo", "f8", 0, 2), View("hi", "f8", 8, 2), View("all", "f8", 0, 3))
    return Program(regions, views, (Op(kind, "hi", ("lo",), (1.0, 0.0, 1.0)),), "all").validate()


def test_every_kind_has_forward_and_exactly_one_vjp_and_jvp_rule():
    assert set(FORWARD) == set(ARITY) == set(N_COEF)
    assert set(VJP) == set(JVP) == set(FLOAT_KINDS)
    assert FLOAT_KINDS | INT_KINDS == set(FORWARD) and not (FLOAT_KINDS & INT_KINDS)


@pytest.mark.parametrize("kind", sorted(FLOAT_KINDS))
def test_vjp_and_jvp_rules_agree_with_finite_differences(kind):
    g = np.random.default_rng(0)
    xs = [g.uniform(-1, 1, 5) for _ in range(ARITY[kind])]
    c = tuple(g.uniform(0.3, 1.0, N_COEF[kind]))
    eps = g.standard_normal(5)
    h = 1e-6
    for j in range(ARITY[kind]):
        plus = [x + (h if i == j else 0) for i, x in enumerate(xs)]
        minus = [x - (h if i == j else 0) for i, x in enumerate(xs)]
        fd = (FORWARD[kind](plus, c, eps) - FORWARD[kind](minus, c, eps)) / (2 * h)
        np.testing.assert_allclose(VJP[kind](xs, c, eps, np.ones(5))[j], fd, rtol=1e-6, atol=1e-8)
        dots = [np.eye(1)[[0] * 5] * (i == j) for i in range(ARITY[kind])]
        jvp = JVP[kind]([x[:, None] for x in xs], c, eps[:, None], dots)[:, 0]
        np.testing.assert_allclose(jvp, fd, rtol=1e-6, atol=1e-8)


def test_overlapping_write_reads_versions_before_the_write_R1():
    p = _shift_program()
    run = execute(p)
    x = p.initial_bytes().view("<f8")
    final = run.bytes_.view("<f8")
    # R1: element 2 is tanh(old x1), not tanh(tanh(x0)) as a sequential in-place loop would give
    np.testing.assert_array_equal(final, [x[0], np.tanh(x[0]), np.tanh(x[1])])
    assert final[2] != np.tanh(np.tanh(x[0]))
    w = p.loss_weights()
    want = np.array([w[0] + w[1] * (1 - np.tanh(x[0]) ** 2), w[2] * (1 - np.tanh(x[1]) ** 2), 0.0])
    for grad in (reverse_grad(run), forward_jacobian_grad(run), complex_step_grad(run)):
        np.testing.assert_allclose(grad, want, rtol=0, atol=1e-15)
    assert scalar_output(run) == graph_output(run)


def test_final_storage_control_is_wrong_on_the_hand_example():
    p = _shift_program()
    run = execute(p)
    x = p.initial_bytes().view("<f8")
    w = p.loss_weights()
    bad = reverse_grad(run, source="final")  # reads tanh(x0) where x1 was read
    assert bad[1] == pytest.approx(w[2] * (1 - np.tanh(np.tanh(x[0])) ** 2), abs=1e-15)
    assert abs(bad[1] - forward_jacobian_grad(run)[1]) > 1e-6


def test_gather_and_scatter_semantics_last_writer_wins():
    regions = (Region("F", "f8", 4), Region("I", "i8", 3))
    views = (View("F", "f8", 0, 4), View("src", "f8", 0, 3), View("dst", "f8", 8, 3),
             View("idx", "i8", 32, 3))
    ops = (Op("copy", "F", ("src",), (), "scatter", "idx"),)
    p = Program(regions, views, ops, "F").validate()
    b0 = p.initial_bytes()
    b0[32:56] = np.array([5, 1, 9], "<i8").view(np.uint8)  # positions 1, 1, 1 (mod 4)
    run = execute(p, b0)
    f0, f1 = b0[:32].view("<f8"), run.bytes_[:32].view("<f8")
    np.testing.assert_array_equal(f1, [f0[0], f0[2], f0[2], f0[3]])  # last j=2 wins at 1
    g = reverse_grad(run)
    np.testing.assert_allclose(g, forward_jacobian_grad(run), atol=1e-15)
    gather = Program(regions, views, (Op("copy", "dst", ("F",), (), "gather", "idx"),), "F").validate()
    run = execute(gather, b0)
    np.testing.assert_array_equal(run.bytes_[:32].view("<f8"), [f0[0], f0[1], f0[1], f0[1]])
    np.testing.assert_allclose(reverse_grad(run), forward_jacobian_grad(run), atol=1e-15)


def test_integer_bit_write_into_float_storage_is_unsupported_R8():
    regions = (Region("F", "f8", 4),)
    views = (View("F", "f8", 0, 4), View("Fi", "i8", 0, 2), View("a", "f8", 0, 2), View("b", "f8", 16, 2))
    ops = (Op("iaffine", "Fi", ("Fi",), (3, 1)), Op("tanh", "b", ("a",), (1.0, 0.0, 1.0)))
    run = execute(Program(regions, views, ops, "F").validate())
    assert "op 1 (tanh)" in unsupported_reason(run)
    for fn in (reverse_grad, forward_jacobian_grad, complex_step_grad):
        with pytest.raises(UnsupportedError, match="R8"):
            fn(run)
    # the same program without the bit write is differentiable
    run = execute(Program(regions, views, ops[1:], "F").validate())
    assert unsupported_reason(run) is None


def test_suite_programs_cover_the_declared_features():
    kinds, modes, dims, n_ops, strides = set(), set(), set(), set(), set()
    for i in range(64):
        p = derivative_program(0, i)
        kinds |= {o.kind for o in p.ops}
        modes |= {o.mode for o in p.ops}
        dims.add(p.views[0].length)
        n_ops.add(len(p.ops))
        assert any(o.kind == "noise" for o in p.ops)
        strides |= {v.stride for v in p.views}
        assert p.ops[-1].dst == p.ops[-1].srcs[0] and p.ops[-1].kind in ("tanh", "sin", "square")
    assert kinds == set(FORWARD) and modes == {"map", "gather", "scatter"}
    assert dims == {4, 8, 16} and n_ops == {8, 12, 16} and strides == {1, 2}
    dtypes = {v.dtype for i in range(16) for v in byte_program(0, i).views}
    assert dtypes == {"f8", "f4", "i8", "i4"}


def test_wrong_rng_replay_is_caught_only_with_the_rng_comparison_R3():
    # a segment without draws: the wrong generator state leaves the bytes equal (eq. 2 needs R)
    p = derivative_program(0, 3)
    no_draw = [k for k, o in enumerate(p.ops) if o.kind != "noise"]
    s = no_draw[0]
    f = forward_with_snapshot(p, s, s + 1)
    b, r = snapshot_replay(p, f, rng_state=wrong_rng_state(f.r_s))
    assert np.array_equal(b, f.b_e)
    assert not same_state(b, r, f.b_e, f.r_e)                     # safeguard: detected
    assert same_state(b, r, f.b_e, f.r_e, check_rng=False)        # safeguard removed: missed


def test_snapshot_replay_and_region_undo_reproduce_bytes_and_generator_state():
    p = byte_program(0, 5)
    f = forward_with_snapshot(p, 0, len(p.ops))
    full = execute(p)
    assert same_state(f.b_t, f.r_t, full.bytes_, full.rng_state)   # P(B0, R0) = (BT, RT)
    b, r = snapshot_replay(p, f)
    assert same_state(b, r, f.b_t, f.r_t)
    undone, replayed, redone = region_undo_replay(p, f)
    assert np.array_equal(undone, p.initial_bytes())
    assert same_state(*replayed, f.b_e, f.r_e) and same_state(*redone, f.b_t, f.r_t)
    # a journal missing the first write cannot undo to B0
    f.journal = f.journal[1:]
    undone, _, _ = region_undo_replay(p, f)
    assert not np.array_equal(undone, p.initial_bytes())


def test_invalid_programs_are_rejected_with_named_errors():
    regions = (Region("F", "f8", 2),)
    with pytest.raises(ValueError, match="ends at byte 24"):
        Program(regions, (View("v", "f8", 8, 2),), (), "v").validate()
    with pytest.raises(ValueError, match="does not fit an integer kind"):
        Program(regions, (View("v", "f8", 0, 2),), (Op("iaffine", "v", ("v",), (1, 0)),), "v").validate()
    with pytest.raises(ValueError, match="expected 1 srcs and 3 coefs"):
        Program(regions, (View("v", "f8", 0, 2),), (Op("tanh", "v", ("v",), (1.0,)),), "v").validate()


def test_finite_never_imports_torch_or_jax():
    code = ("import sys, stateremat.reference, stateremat.reference.engines, stateremat.cli; "
            "bad = [m for m in ('torch', 'jax') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_byte_segment_draws_so_a_wrong_generator_changes_what_replay_draws_R3():
    from stateremat.paper.verify._gen import byte_segment

    for i in range(48):
        p = byte_program(0, i)
        s, e = byte_segment(0, i, p)
        assert any(op.kind == "noise" for op in p.ops[s:e]), i
        f = forward_with_snapshot(p, s, e)
        seg = [r for r in execute(p, f.b_s, _gen(f.r_s), ops=p.ops[s:e], start=s, graph=False).records
               if r.eps is not None]
        bad = [r for r in execute(p, f.b_s, _gen(wrong_rng_state(f.r_s)), ops=p.ops[s:e], start=s,
                                  graph=False).records if r.eps is not None]
        assert not np.array_equal(seg[0].eps, bad[0].eps)  # the replay itself draws differently
        assert not same_state(*snapshot_replay(p, f, wrong_rng_state(f.r_s)), f.b_e, f.r_e)


def _gen(state):
    g = np.random.Generator(np.random.PCG64())
    g.bit_generator.state = state
    return g


def _tail_with_a_draw():
    for i in range(64):
        p = byte_program(0, i)
        for s in range(len(p.ops) - 1):
            if any(op.kind == "noise" for op in p.ops[s + 1:]):
                return p, forward_with_snapshot(p, s, s + 1)
    raise AssertionError("no byte program with a draw after its first op")


def test_region_undo_redo_reproduces_the_generator_and_catches_a_corrupt_rng_record_R3():
    import dataclasses

    p, f = _tail_with_a_draw()
    _, _, redone = region_undo_replay(p, f)
    assert same_state(*redone, f.b_t, f.r_t)
    n_seg = f.e - f.s
    k = next(j for j in range(n_seg, len(f.journal)) if f.journal[j].eps is not None)
    entry = f.journal[k]
    wrong = wrong_rng_state(entry.rng_before)
    corruptions = {
        "rng_after": dataclasses.replace(entry, rng_after=wrong),
        "rng_before": dataclasses.replace(entry, rng_before=wrong),
        "eps": dataclasses.replace(entry, eps=entry.eps + 1e-3),
    }
    for what, bad in corruptions.items():
        journal = list(f.journal)
        journal[k] = bad
        _, _, (b, r) = region_undo_replay(p, dataclasses.replace(f, journal=journal))
        assert np.array_equal(b, f.b_t), what           # the bytes alone would still pass
        assert not same_state(b, r, f.b_t, f.r_t), what  # the replayed draws catch it
