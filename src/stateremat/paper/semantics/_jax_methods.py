"""Run one JAX program under one execution method and collect its observations.

Six methods of the paper's Table 2 (functional reference, ``jax.checkpoint`` of the
functional program, native in-place eager and under checkpoint, impure holder eager and
under checkpoint — the last two only for hidden-buffer families) plus the extension
``stateremat_jax_checkpoint`` (kept in its own records table). Gradients come from one
``jax.vjp`` whose pullback is applied twice. Invocation counts are Python executions of the
program body (JAX traces a checkpointed body once and replays its jaxpr).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ._compare import StageError
from ._families import HIDDEN_FAMILIES, STATEREMAT_JAX_METHOD, ProgramParams
from ._jax_programs import JAX_PROGRAMS, Holder, make_impure

def _np(a) -> np.ndarray:
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
        a = jax.random.key_data(a)
    return np.array(a)  # a leaked tracer raises here (observed as the 'state' stage)


def run_jax(method: str, p: ProgramParams, data: dict[str, np.ndarray],
            dtype: str) -> tuple[dict[str, np.ndarray], int]:
    """Execute program ``p`` under JAX ``method`` once (call inside ``jax.enable_x64(True)``).

    Args:
        method: a key of ``JAX_METHODS`` (see ``_families``) or :data:`STATEREMAT_JAX_METHOD`.
        p, data, dtype: as for :func:`run_torch`.

    Returns:
        ``(observations, invocation_count)`` as for :func:`run_torch`; ``rng`` holds the key
        data of the final PRNG key.

    Raises:
        StageError: JAX raised; ``.stage`` is ``forward``, ``backward_1``, ``backward_2`` or
            ``state`` (reading back the holder's state).
    """
    functional, inplace = JAX_PROGRAMS[p.family]
    x = jnp.asarray(data["x"], dtype=dtype)
    w = jnp.asarray(data["w"], dtype=dtype)
    state = {"key": jax.random.key(p.seed), "buf": jnp.asarray(data["buf"], dtype=dtype)}
    count = [0]
    holder = Holder(state["key"], state["buf"])
    final_state: Callable[[], dict] = lambda: state  # replaced by methods that update state
    stage = "forward"
    try:
        if method in ("functional_reference", "functional_checkpoint", STATEREMAT_JAX_METHOD):
            def prog(x_, w_):
                count[0] += 1
                return functional(x_, w_, state, p)
            if method == "functional_checkpoint":
                prog = jax.checkpoint(prog)
            elif method == STATEREMAT_JAX_METHOD:
                from stateremat.jax import checkpoint as sr_checkpoint

                def seg(st, x_, w_):
                    count[0] += 1
                    return functional(x_, w_, st, p)
                threaded = sr_checkpoint(seg)  # default admission checks (leaks, state)
                prog = lambda x_, w_: threaded(state, x_, w_)
            out, pullback, new_state = jax.vjp(prog, x, w, has_aux=True)
            final_state = lambda: new_state
        elif method in ("native_inplace_eager", "native_inplace_checkpoint"):
            def prog(x_, w_):
                count[0] += 1
                return inplace(x_, w_, state, p)
            if method == "native_inplace_checkpoint":
                prog = jax.checkpoint(prog)
            out, pullback = jax.vjp(prog, x, w)
        elif method in ("impure_holder_eager", "impure_holder_checkpoint"):
            impure = make_impure(functional)

            def prog(x_, w_):
                count[0] += 1
                return impure(x_, w_, holder, p)
            if method == "impure_holder_checkpoint":
                prog = jax.checkpoint(prog)
            out, pullback = jax.vjp(prog, x, w)
            final_state = lambda: {"key": holder.key, "buf": holder.buf}
        else:
            raise KeyError(f"stateremat semantics: unknown JAX method {method!r}")
        obs: dict[str, np.ndarray] = {"out": _np(out)}
        g = jnp.asarray(data["g"], dtype=dtype)
        for i in (1, 2):
            stage = f"backward_{i}"
            gx, gw = pullback(g)
            obs[f"grad_x_{i}"], obs[f"grad_w_{i}"] = _np(gx), _np(gw)
        stage = "state"
        st = final_state()
        if p.family in HIDDEN_FAMILIES:
            obs["state_buf"] = _np(st["buf"])
        obs["state_x"], obs["state_w"] = _np(x), _np(w)
        obs["rng"] = _np(st["key"])
    except KeyError:
        raise
    except Exception as exc:  # every framework exception is an observation (outcome R)
        raise StageError(stage, exc, count[0]) from exc
    return obs, count[0]
