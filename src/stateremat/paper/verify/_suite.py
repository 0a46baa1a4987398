"""The finite verification suites as rows: one row per program and check (paper §6).

:func:`derivative_rows` and :func:`byte_rows` run every check of one program and return raw
rows (outcome, max error, coordinates, detection flag); they never aggregate. Summaries are
recomputed from stored rows by :mod:`._summary`.

Checks and outcomes (``Outcome``: M match, D divergence, unsupported):

* derivative suite: ``scalar_output`` (graph evaluation == bytes, exactly), ``gradient``
  (reverse eq. (1) vs forward Jacobian), ``final_storage_control`` (negative control; its
  outcome is D when it diverges, i.e. when it is detected), ``complex_step`` (every
  ``COMPLEX_STEP_EVERY``-th program).
* byte suite: ``snapshot_replay`` and ``region_undo`` (exact bytes and generator state),
  ``wrong_rng`` (negative control, detected when the state comparison fails).

Every row carries ``program_seed``, the JSON entropy list of the program's generator
(``np.random.default_rng(json.loads(program_seed))`` draws program ``i`` of the suite), so a
row can be reproduced on its own.
"""
from __future__ import annotations

import json
import math

import numpy as np

from ...contract import Outcome
from ..._shared.io import source_hash
from ...reference import (RANDOM_KINDS, complex_step_grad, execute, forward_jacobian_grad,
                         forward_with_snapshot, graph_output, region_undo_replay, reverse_grad,
                         same_state, scalar_output, snapshot_replay, unsupported_reason,
                         wrong_rng_state)
from ._gen import SUITE_CODES, byte_program, byte_segment, derivative_program

GRAD_TOL = 1e-13          # match tolerance of a gradient row (relative to max(1, |g|))
CONTROL_DETECT = 1e-8     # a control is detected when it differs by more than this
COMPLEX_STEP_EVERY = 8    # complex-step subset: programs i with i % 8 == 0


def rel_err(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """``(max |a-b|, max |a-b| / max(1, max |b|))``."""
    err = float(np.max(np.abs(a - b))) if len(a) else 0.0
    return err, err / max(1.0, float(np.max(np.abs(b))) if len(b) else 1.0)


def _row(p, suite, i, seed, check, outcome, max_error=math.nan, coordinates=0, detected=None,
         message="", h=None, bytes_differing=0, segment_random_ops=None):
    return {"suite": suite, "program": int(i), "check": check, "seed": int(seed),
            "program_seed": json.dumps([int(seed), SUITE_CODES[suite], int(i)]),
            "family": p.family, "dims": int(p.views[0].length), "n_ops": len(p.ops),
            "outcome": str(outcome), "max_error": float(max_error), "coordinates": int(coordinates),
            "detected": detected, "bytes_differing": int(bytes_differing), "message": message, "source_hash": h,
            "segment_random_ops": segment_random_ops}


def derivative_rows(seed: int, i: int) -> list[dict]:
    """Rows of derivative-suite program ``i``."""
    p = derivative_program(seed, i)
    h = source_hash(p.spec())
    run = execute(p)
    why = unsupported_reason(run)
    if why is not None:  # never expected in this suite; recorded, not hidden
        return [_row(p, "derivative", i, seed, c, Outcome.UNSUPPORTED, message=why, h=h)
                for c in ("scalar_output", "gradient", "final_storage_control")]
    out_b, out_g = scalar_output(run), graph_output(run)
    rows = [_row(p, "derivative", i, seed, "scalar_output", Outcome.M if out_b == out_g else Outcome.D,
                 abs(out_b - out_g), h=h)]
    ref = forward_jacobian_grad(run)
    g = reverse_grad(run)
    err, rel = rel_err(g, ref)
    rows.append(_row(p, "derivative", i, seed, "gradient", Outcome.M if rel <= GRAD_TOL else Outcome.D,
                     err, coordinates=len(ref), h=h))
    gc = reverse_grad(run, source="final")
    cerr, crel = rel_err(gc, ref)
    det = crel > CONTROL_DETECT
    rows.append(_row(p, "derivative", i, seed, "final_storage_control", Outcome.D if det else Outcome.M,
                     cerr, coordinates=len(ref), detected=det, h=h))
    if i % COMPLEX_STEP_EVERY == 0:
        cs = complex_step_grad(run)
        serr, srel = rel_err(cs, g)
        rows.append(_row(p, "derivative", i, seed, "complex_step",
                         Outcome.M if srel <= GRAD_TOL else Outcome.D, serr, coordinates=len(cs), h=h))
    return rows


def byte_rows(seed: int, i: int) -> list[dict]:
    """Rows of byte-suite program ``i`` (segment ``[s, e)`` from :func:`byte_segment`)."""
    p = byte_program(seed, i)
    h = source_hash(p.spec())
    s, e = byte_segment(seed, i, p)
    n_random = sum(op.kind in RANDOM_KINDS for op in p.ops[s:e])
    f = forward_with_snapshot(p, s, e)
    msg = f"segment [{s}, {e}) of {len(p.ops)} ops ({n_random} random), {p.nbytes} bytes"
    b, r = snapshot_replay(p, f)
    ok = same_state(b, r, f.b_e, f.r_e)
    rows = [_row(p, "byte", i, seed, "snapshot_replay", Outcome.M if ok else Outcome.D,
                 bytes_differing=np.sum(b != f.b_e), message=msg, h=h)]
    undone, (rb, rr), (db, dr) = region_undo_replay(p, f)
    ok = (np.array_equal(undone, f.b_s) and same_state(rb, rr, f.b_e, f.r_e)
          and same_state(db, dr, f.b_t, f.r_t))
    rows.append(_row(p, "byte", i, seed, "region_undo", Outcome.M if ok else Outcome.D,
                     bytes_differing=np.sum(undone != f.b_s) + np.sum(db != f.b_t), message=msg, h=h))
    b, r = snapshot_replay(p, f, rng_state=wrong_rng_state(f.r_s))
    det = not same_state(b, r, f.b_e, f.r_e)
    rows.append(_row(p, "byte", i, seed, "wrong_rng", Outcome.D if det else Outcome.M,
                     bytes_differing=np.sum(b != f.b_e), detected=det, segment_random_ops=n_random,
                     message=msg + ("; bytes equal, generator state differs"
                                    if det and np.array_equal(b, f.b_e) else ""), h=h))
    return rows


def finite_rows(suite: str, seed: int, i: int) -> list[dict]:
    """Rows of program ``i`` of ``suite`` (``"derivative"`` or ``"byte"``)."""
    return {"derivative": derivative_rows, "byte": byte_rows}[suite](seed, i)
