"""Functional state-threading checkpoint for JAX (paper §5; DESIGN.md layer ``jax``).

JAX arrays are immutable, so the replay contract is honoured by construction once state is
an explicit input and output: replay of ``fn(state, *args)`` sees the original state
(R2) and PRNG key (R3) because they are its arguments, and it ends with the state it
returned (R4); nothing outside is touched, so the update happens exactly once (R5). What
remains is admission: refusing functions that hide state (R7) or change its structure (R4).
"""
from __future__ import annotations

import functools
import gc
import weakref
from typing import Any, Callable

import jax

from ..contract import ReplayError, UndeclaredStateError, rule


def _describe(tree: Any) -> str:
    leaves = jax.tree_util.tree_leaves(tree)
    return f"{jax.tree_util.tree_structure(tree)} with leaves " + ", ".join(
        f"{getattr(v, 'dtype', type(v).__name__)}{list(getattr(v, 'shape', ()))}" for v in leaves)


def _check_state(name: str, state: Any, new_state: Any) -> None:
    if jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(new_state):
        raise UndeclaredStateError(
            f"stateremat.jax.checkpoint({name}): the returned state has structure "
            f"{jax.tree_util.tree_structure(new_state)}, expected the input state's "
            f"{jax.tree_util.tree_structure(state)} ({rule('R4')}). Tip: return every state "
            "entry, updated or not, and add new state to the state you pass in.")
    for old, new in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(new_state)):
        if (getattr(old, "shape", None), getattr(old, "dtype", None)) != \
                (getattr(new, "shape", None), getattr(new, "dtype", None)):
            raise ReplayError(
                f"stateremat.jax.checkpoint({name}): a state leaf changed from "
                f"{_describe(old)} to {_describe(new)}; replay needs state of fixed shape "
                f"and dtype ({rule('R4')}). Tip: cast the update to the state's dtype.")


def _find_leaks(trace_refs: list) -> list:
    """Tracers of the segment's own trace still alive after it ended (hidden state, R7).

    Mirrors :func:`jax.checking_leaks` without its costs (that flag disables the compile
    cache and explains leaks by walking ``gc.get_referrers`` for minutes in a large heap):
    a finished trace that nothing references is freed at once, so the common case costs one
    weakref lookup; only a live trace pays for ``gc.collect``.
    """
    leaked = []
    for ref in trace_refs:
        if ref() is None:
            continue
        gc.collect()  # a trace kept alive only by reference cycles is not a leak
        trace = ref()
        if trace is not None:
            leaked += [o for o in gc.get_referrers(trace) if isinstance(o, jax.core.Tracer)]
            del trace
    return leaked


def checkpoint(fn: Callable[..., tuple[Any, Any]], *, policy: Callable | None = None,
               prevent_cse: bool = True, check_leaks: bool = True
               ) -> Callable[..., tuple[Any, Any]]:
    """Checkpoint a segment that threads its state explicitly.

    Args:
        fn: the segment, ``fn(state, *args, **kwargs) -> (out, new_state)``. ``state`` is any
            pytree of arrays (hidden buffers, a PRNG key from ``jax.random.key``); ``new_state``
            must have the same structure, shapes and dtypes. Activations of ``fn`` are not
            kept for backward; they are recomputed from ``state`` and ``args``.
        policy: a ``jax.checkpoint_policies`` policy naming residuals to keep (default: none).
        prevent_cse: passed to :func:`jax.checkpoint`.
        check_leaks: after each trace of ``fn``, check that no traced value of it outlived the
            trace, i.e. that ``fn`` did not store one in a Python object (hidden state, R7).
            Costs a weakref lookup when nothing leaked.

    Returns:
        ``wrapped(state, *args, **kwargs) -> (out, new_state)``, differentiable with respect
        to ``args`` and the floating leaves of ``state``.

    Raises:
        UndeclaredStateError: ``fn`` leaked a traced value into Python state (R7), or returned
            state of a different structure than it received (R4).
        ReplayError: ``fn`` did not return an ``(out, new_state)`` pair, or a state leaf
            changed shape or dtype (R4).

    Danger:
        State that ``fn`` reads from a closure or global without writing it is treated as a
        constant; it is not checked. A hidden write of a value that is not traced (a Python
        number, a constant array) is invisible to the leak check. The check reads JAX's
        private ``Tracer._trace``; where it is missing, the check is skipped. Pass everything
        the segment reads and writes in ``state``.

    References:
        Paper §3 (eq. 2) and §5 (JAX functional checkpoint).
    """
    name = getattr(fn, "__name__", type(fn).__name__)
    trace_refs: list = []

    def probed(state: Any, *args: Any, **kwargs: Any):
        if check_leaks:
            for leaf in jax.tree_util.tree_leaves((state, args, kwargs)):
                trace = getattr(leaf, "_trace", None)
                if trace is not None:
                    trace_refs.append(weakref.ref(trace))
                    break
        return fn(state, *args, **kwargs)

    remat = jax.checkpoint(probed, prevent_cse=prevent_cse, policy=policy)

    @functools.wraps(fn)
    def wrapped(state: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        trace_refs.clear()
        result = remat(state, *args, **kwargs)
        leaked = _find_leaks(trace_refs)
        trace_refs.clear()
        if leaked:
            shapes = ", ".join(str(getattr(t, "aval", type(t).__name__)) for t in leaked[:3])
            raise UndeclaredStateError(
                f"stateremat.jax.checkpoint({name}): the segment stored {len(leaked)} traced "
                f"value(s) ({shapes}) outside its return value, i.e. it writes hidden state "
                f"({rule('R7')}). Tip: pass that state in `state` and return its new value as "
                "`new_state` instead of assigning it to an object.")
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ReplayError(
                f"stateremat.jax.checkpoint({name}): expected the segment to return "
                f"(out, new_state), got {type(result).__name__}"
                f"{f' of length {len(result)}' if isinstance(result, tuple) else ''}. "
                "Tip: return `out, state` even when the state is unchanged.")
        _check_state(name, state, result[1])
        return result

    return wrapped
