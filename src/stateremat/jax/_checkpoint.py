"""Functional state-threading checkpoint for JAX (paper §5; DESIGN.md layer ``jax``).

JAX arrays are immutable, so the replay contract is honoured by construction once state is
an explicit input and output: replay of ``fn(state, *args)`` sees the original state
(R2) and PRNG key (R3) because they are its arguments, and it ends with the state it
returned (R4); nothing outside is touched, so the update happens exactly once (R5). What
remains is admission: refusing functions that hide state (R7) or change its structure (R4).
"""
from __future__ import annotations

import functools
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


def checkpoint(fn: Callable[..., tuple[Any, Any]], *, policy: Callable | None = None,
               prevent_cse: bool = True, check_leaks: bool | str = "first"
               ) -> Callable[..., tuple[Any, Any]]:
    """Checkpoint a segment that threads its state explicitly.

    Args:
        fn: the segment, ``fn(state, *args, **kwargs) -> (out, new_state)``. ``state`` is any
            pytree of arrays (hidden buffers, a PRNG key from ``jax.random.key``); ``new_state``
            must have the same structure, shapes and dtypes. Activations of ``fn`` are not
            kept for backward; they are recomputed from ``state`` and ``args``.
        policy: a ``jax.checkpoint_policies`` policy naming residuals to keep (default: none).
        prevent_cse: passed to :func:`jax.checkpoint`.
        check_leaks: trace ``fn`` under :func:`jax.checking_leaks` so a function that stores
            a traced value in a Python object (hidden state, R7) is refused at call time:
            ``"first"`` (default) on the first call only, ``True`` on every call, ``False``
            never. Leak checking disables JAX's compile cache for that call (about 0.5 s
            for a small segment on CPU), hence checking once by default.

    Returns:
        ``wrapped(state, *args, **kwargs) -> (out, new_state)``, differentiable with respect
        to ``args`` and the floating leaves of ``state``.

    Raises:
        UndeclaredStateError: ``fn`` leaked a traced value into Python state (R7), or returned
            state of a different structure than it received (R4).
        ReplayError: ``fn`` did not return an ``(out, new_state)`` pair, or a state leaf
            changed shape or dtype (R4).

    Danger:
        With ``check_leaks="first"``, a segment that writes hidden state only on some calls
        (data-dependent Python control flow) is caught only if the first call does.
        State that ``fn`` reads from a closure or global without writing it is treated as a
        constant; it is not checked. Pass everything the segment reads and writes in ``state``.

    References:
        Paper §3 (eq. 2) and §5 (JAX functional checkpoint).
    """
    name = getattr(fn, "__name__", type(fn).__name__)
    if check_leaks not in (True, False, "first"):
        raise ValueError(f"stateremat.jax.checkpoint: check_leaks must be True, False or "
                         f"'first', got {check_leaks!r}. Tip: use the default 'first'.")
    remat = jax.checkpoint(fn, prevent_cse=prevent_cse, policy=policy)
    calls = [0]

    @functools.wraps(fn)
    def wrapped(state: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        calls[0] += 1
        try:
            if check_leaks is True or (check_leaks == "first" and calls[0] == 1):
                with jax.checking_leaks():
                    result = remat(state, *args, **kwargs)
            else:
                result = remat(state, *args, **kwargs)
        except Exception as exc:
            if "Leaked trace" not in str(exc):
                raise
            raise UndeclaredStateError(
                f"stateremat.jax.checkpoint({name}): the segment stored a traced value outside "
                f"its return value, i.e. it writes hidden state ({rule('R7')}). JAX reported: "
                f"{str(exc).splitlines()[0]}. Tip: pass that state in `state` and return its "
                "new value as `new_state` instead of assigning it to an object.") from exc
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ReplayError(
                f"stateremat.jax.checkpoint({name}): expected the segment to return "
                f"(out, new_state), got {type(result).__name__}"
                f"{f' of length {len(result)}' if isinstance(result, tuple) else ''}. "
                "Tip: return `out, state` even when the state is unchanged.")
        _check_state(name, state, result[1])
        return result

    return wrapped
