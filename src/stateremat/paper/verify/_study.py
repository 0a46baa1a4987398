"""The 1,200-program semantic study and the joint-alias study as raw rows (paper §7, Table 3).

:func:`check_recovery` runs one engine on one program: forward under the engine, then two
full backward passes from the live final state. A recovery *matches* (outcome M) only if

* every op's recovered operand values, byte offsets and noise equal the stored operation of
  the original forward, bit for bit;
* the segment-start bytes it rebuilt equal ``B_a`` on every byte it vouches for (which must
  include every byte the segment reads) — checked view by view, so all aliases agree — and
  its generator state equals ``R_a``;
* its generator state ``R_a`` reproduces the segment's recorded draws (the noise it
  returns) and ends at the next segment's generator state (``R_T`` after the last);
* where it vouches for the whole start state, the executor replaying the segment from it
  (with the recorded noise) reaches the next segment's start bytes (``B_T`` after the last);
* the live storage and generator equal ``(B_T, R_T)`` after every recovery (R5);
* both backward passes give bit-identical gradients within ``GRAD_TOL`` of the forward
  Jacobian.

Some equalities are structural for some engines (the engine's copy was taken at the moment
the truth was): each row's ``structural_checks`` names them (engine ``structural`` plus
``restored_bytes`` when a recovery returned a copied start state); they are recorded, not
counted as independent evidence.
"""
from __future__ import annotations

import json
import math

import numpy as np

from ...contract import Outcome
from ..._shared.io import source_hash
from ...reference import DTYPES, complex_step_grad, execute, forward_jacobian_grad, unsupported_reason
from ...reference.engines import ENGINES, backward, forward, make_engine
from ._families import FAMILIES, family_program, integer_write_variant
from ._suite import GRAD_TOL, rel_err

ENGINE_NAMES = tuple(ENGINES)
COMPLEX_STEP_EVERY = 12   # semantic study: complex step on programs i % 12 == 0 (100 of 1,200)
ALIAS_PATTERNS = FAMILIES
ALIAS_DIMS = (32, 64)
SEMANTIC_ROWS = {"queue": (64, 128), "prototype": (8, 16), "recurrence": (8, 16)}


def admission(p, run) -> str | None:
    """Why the engines cannot differentiate ``p`` (R8), or ``None``."""
    why = unsupported_reason(run)
    if why is None:
        bad = [v.name for v in p.views if v.dtype == "f8" and v.offset_bytes % 8]
        if bad:
            why = f"misaligned float64 views {bad} are outside the engines' address-based backward"
    return why


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _draws_reproduce(state: dict, eps_list, end_state: dict) -> bool:
    """``state`` draws exactly the noise ``eps_list`` (per op, ``None``: no draw), ending at ``end_state``."""
    g = np.random.Generator(np.random.PCG64())
    g.bit_generator.state = state
    for eps in eps_list:
        if eps is not None and not np.array_equal(g.standard_normal(len(eps)), eps):
            return False
    return g.bit_generator.state == end_state


def _replays_to(p, start: np.ndarray, a: int, b: int, truth: dict, end: np.ndarray) -> bool:
    """The executor replaying ``[a, b)`` from ``start`` with recorded noise ends at ``end``."""
    noise = {k: truth[k].eps for k in range(a, b) if truth[k].eps is not None}
    frozen = np.random.Generator(np.random.PCG64(0))
    run = execute(p, start, frozen, ops=p.ops[a:b], start=a, noise=noise, track=False)
    return bool(np.array_equal(run.bytes_, end))


def check_recovery(p, segments, engine, ref: np.ndarray) -> dict:
    """Run ``engine`` (an :class:`Engine` built for ``p``) and check every recovery; one row dict."""
    fw = forward(p, engine)
    truth = {r.k: r for r in fw.run.records}
    fails: list[str] = []
    restored, copied = [], []
    n_seg = len(segments)

    def on_recovery(seg, rec):
        a, b = segments[seg]
        first_pass = len(restored) < n_seg
        restored.append(rec.start_bytes is not None)
        copied.append(rec.start_is_copy)
        for k in range(a, b):
            r, t = rec.reads[k], truth[k]
            if not (all(map(_same, r.xs, t.xs)) and all(map(np.array_equal, r.src_offsets, t.src_offsets))
                    and np.array_equal(r.dst_offsets, t.dst_offsets)
                    and ((r.eps is None and t.eps is None) or np.array_equal(r.eps, t.eps))):
                fails.append(f"reads of op {k}")
        if rec.start_bytes is not None:
            need = np.concatenate([truth[k].read_byte_offsets() for k in range(a, b)])
            if not rec.start_mask[need].all():
                fails.append(f"segment {seg} does not vouch for bytes it reads")
            for v in p.views:  # alias storage: every typed view over the vouched bytes
                where = (v.element_offsets(np.arange(v.length))[:, None] + np.arange(v.itemsize)).ravel()
                m = rec.start_mask[where]
                if not np.array_equal(rec.start_bytes[where][m], fw.seg_start_bytes[seg][where][m]):
                    fails.append(f"restored bytes of view {v.name} at segment {seg}")
            end_b = fw.seg_start_bytes[seg + 1] if seg + 1 < n_seg else fw.b_t
            if first_pass and rec.start_mask.all() and not _replays_to(p, rec.start_bytes, a, b, truth, end_b):
                fails.append(f"replay from the restored start of segment {seg} misses the next state")
        if rec.rng_state is not None:
            if rec.rng_state != fw.seg_start_rng[seg]:
                fails.append(f"generator state at segment {seg}")
            end_r = fw.seg_start_rng[seg + 1] if seg + 1 < n_seg else fw.r_t
            if not _draws_reproduce(rec.rng_state, [rec.reads[k].eps for k in range(a, b)], end_r):
                fails.append(f"generator state at segment {seg} does not reproduce its draws")
        if not np.array_equal(live, fw.b_t) or gen.bit_generator.state != fw.r_t:
            fails.append(f"live state after recovering segment {seg} (R5)")

    live = fw.b_t.copy()
    gen = np.random.Generator(np.random.PCG64())
    gen.bit_generator.state = fw.r_t
    grads = [backward(p, engine, live, gen, fw.run.input_offsets, on_recovery) for _ in range(2)]
    repeat_ok = np.array_equal(grads[0], grads[1])
    if not repeat_ok:
        fails.append("repeated backward differs")
    err, rel = rel_err(grads[0], ref)
    if rel > GRAD_TOL:
        fails.append(f"gradient error {err:.3g}")
    structural = set(engine.structural) | ({"restored_bytes"} if any(copied) else set())
    return {"engine": engine.name, "outcome": str(Outcome.M if not fails else Outcome.D),
            "structural_checks": ",".join(sorted(structural)),
            "max_error": err, "repeat_ok": bool(repeat_ok), "start_state_checked": bool(any(restored)),
            "retained_bytes": int(engine.retained_bytes),
            "workspace_bytes": int(engine.workspace_bytes), "message": "; ".join(dict.fromkeys(fails))[:500]}


def _base_row(p, segments, h, **kw) -> dict:
    """A row's common columns; ``program_seed`` (JSON list) is the entropy of the program's
    generator, ``np.random.default_rng(json.loads(program_seed))``, so a row reproduces alone.
    The alias table keys on ``dim`` and so has no separate ``dims`` column."""
    width = {} if "dim" in kw else {"dims": int(p.view("X").length)}
    return {"family": p.family, **width, "n_ops": len(p.ops),
            "n_segments": len(segments), "state_bytes": p.nbytes, "source_hash": h,
            "coordinates": 0, "max_error": math.nan, "retained_bytes": 0, "workspace_bytes": 0,
            "repeat_ok": None, "start_state_checked": None, "structural_checks": "", "message": "",
            **kw}


def semantic_entropy(seed: int, i: int) -> list[int]:
    """Generator entropy of semantic-study program ``i`` (stored as ``program_seed``)."""
    return [int(seed), 3, int(i)]


def alias_entropy(seed: int, pattern: str, dim: int) -> list[int]:
    """Generator entropy of joint-alias input ``(seed, pattern, dim)`` (stored as ``program_seed``)."""
    return [int(seed), 4, ALIAS_PATTERNS.index(pattern), int(dim)]


def semantic_program(seed: int, i: int):
    """Program ``i`` of the semantic study: family ``i % 3``, width 4/8, 3–5 segments.

    Queue programs hold a large queue (64/128 rows) written sparsely (one key per step), the
    regime where a region journal should retain far less than whole checkpoints.
    """
    g = np.random.default_rng(semantic_entropy(seed, i))
    family = FAMILIES[i % 3]
    return family_program(family, int(g.choice([4, 8])), int(g.choice([3, 4, 5])), g,
                          rows=int(g.choice(SEMANTIC_ROWS[family])))


def engine_rows(seed: int, i: int) -> list[dict]:
    """Rows of semantic-study program ``i``: one per engine, plus complex step on the subset."""
    p, segments = semantic_program(seed, i)
    h = source_hash(p.spec())
    run = execute(p)
    key = {"seed": seed, "program": i, "program_seed": json.dumps(semantic_entropy(seed, i))}
    why = admission(p, run)
    if why is not None:  # recorded, never assigned a gradient
        return [_base_row(p, segments, h, **key, check="recovery", engine=n,
                          outcome=str(Outcome.UNSUPPORTED), message=why) for n in ENGINE_NAMES]
    ref = forward_jacobian_grad(run)
    rows = [_base_row(p, segments, h, **key, check="recovery",
                      **check_recovery(p, segments, make_engine(n, p, segments), ref))
            for n in ENGINE_NAMES]
    if i % COMPLEX_STEP_EVERY == 0:
        err, rel = rel_err(complex_step_grad(run), ref)
        rows.append(_base_row(p, segments, h, **key, check="complex_step", engine="",
                              outcome=str(Outcome.M if rel <= GRAD_TOL else Outcome.D),
                              max_error=err, coordinates=len(ref)))
    return rows


def alias_program(seed: int, pattern: str, dim: int):
    """Joint-alias input ``(seed, pattern, dim)``: 4 segments x 4 ops with aliases."""
    g = np.random.default_rng(alias_entropy(seed, pattern, dim))
    return family_program(pattern, dim, 4, g, alias=True, rows=4)


def stored_operations_ok(p, run) -> bool:
    """Stored operations expose byte offsets and before/after values that chain B0 -> BT."""
    b = p.initial_bytes()
    for r in run.records:
        where = r.dst_offsets[:, None] + np.arange(DTYPES[r.dst_dtype].itemsize)
        if not np.array_equal(b[where], r.old_bytes):
            return False
        b[where] = r.new_bytes
    return bool(np.array_equal(b, run.bytes_))


def alias_rows(seed: int, pattern: str, dim: int) -> list[dict]:
    """Rows of one joint-alias input: 5 engine recoveries, stored operations, unsupported variant."""
    p, segments = alias_program(seed, pattern, dim)
    h = source_hash(p.spec())
    run = execute(p)
    key = {"seed": seed, "pattern": pattern, "dim": dim,
           "program_seed": json.dumps(alias_entropy(seed, pattern, dim))}
    why = admission(p, run)
    rows = []
    if why is not None:
        rows += [_base_row(p, segments, h, **key, check="recovery", engine=n,
                           outcome=str(Outcome.UNSUPPORTED), message=why) for n in ENGINE_NAMES]
    else:
        ref = forward_jacobian_grad(run)
        rows += [_base_row(p, segments, h, **key, check="recovery",
                           **check_recovery(p, segments, make_engine(n, p, segments), ref))
                 for n in ENGINE_NAMES]
    rows.append(_base_row(p, segments, h, **key, check="stored_operations", engine="",
                          outcome=str(Outcome.M if stored_operations_ok(p, run) else Outcome.D),
                          coordinates=len(run.records)))
    q = integer_write_variant(p)
    qrun = execute(q)
    qwhy = admission(q, qrun)
    rows.append(_base_row(q, segments, source_hash(q.spec()), **key, check="integer_write_gradient",
                          engine="", outcome=str(Outcome.UNSUPPORTED if qwhy else Outcome.D),
                          message=qwhy or "integer bit write was not refused (R8 violated)"))
    return rows
