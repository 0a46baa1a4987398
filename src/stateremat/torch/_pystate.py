"""Python-level state among a segment's arguments that a replay cannot restore (R2).

A transformers ``Cache`` (``DynamicCache``, ``StaticCache``, ...) is a Python object whose
``update`` appends the layer's keys and values. Replaying a layer that received one appends them
a second time, and the backward then fails far from the cause (a shape error inside the replay).
:func:`refuse_python_state` finds such objects among the arguments at the first forward and
raises an error that names the cache and the argument. Recognised without importing
transformers: any instance of a class called ``Cache`` defined in ``transformers.cache_utils``.
"""
from __future__ import annotations

from typing import Any

from stateremat.contract import rule

from ._errors import UnsupportedError


def _is_transformers_cache(obj: Any) -> bool:
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers")
               for c in type(obj).__mro__)


def python_state_arguments(args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """``(argument, object)`` for each transformers ``Cache`` among ``args``/``kwargs`` (top level)."""
    found = [(f"positional argument {i}", a) for i, a in enumerate(args) if _is_transformers_cache(a)]
    found += [(f"keyword argument {k!r}", v) for k, v in kwargs.items() if _is_transformers_cache(v)]
    return found


def cache_fingerprint(cache: Any) -> tuple:
    """What a cache's ``update`` changes: each layer's tensors (identity and version counter)."""
    layers = getattr(cache, "layers", None) or [cache]
    return tuple(tuple((k, id(v), v._version) for k, v in vars(layer).items() if hasattr(v, "_version"))
                 for layer in layers)


def refuse_python_state(api: str, segment: str, args: tuple, kwargs: dict, run: Any = None) -> Any:
    """Refuse a transformers KV cache (``Cache``) that a checkpointed segment would update (R2).

    Args:
        api: the public API named in the message (``"stateremat.torch.apply_plan"``).
        segment: the segment's name (module path).
        args, kwargs: the segment's arguments (top level is searched).
        run: ``None`` — refuse any cache among the arguments before the segment runs; or a
            function running the segment (for segments said to only read their cache) — run it
            and refuse if a cache's tensors were rebound or written.

    Returns:
        ``run()``'s result (``None`` without ``run``).

    Raises:
        UnsupportedError: naming the cache's type, the argument and the segment, with the tip to
            train with ``use_cache=False``.
    """
    found = python_state_arguments(args, kwargs)
    if run is None:
        if found:
            raise UnsupportedError(cache_message(api, segment, *found[0], "received"))
        return None
    before = [cache_fingerprint(c) for _, c in found]
    out = run()
    for (where, cache), fp in zip(found, before):
        if cache_fingerprint(cache) != fp:
            raise UnsupportedError(cache_message(api, segment, where, cache, "updated"))
    return out


def cache_message(api: str, segment: str, where: str, cache: Any, verb: str) -> str:
    return (f"{api}: segment {segment!r} {verb} a transformers {type(cache).__name__} as its {where}; "
            f"the replay in backward would update that KV cache a second time ({rule('R2')}), and a "
            "Python-level cache cannot be declared as state. Expected no cache object that a "
            "checkpointed segment updates. Tip: train with use_cache=False, e.g. "
            "model(input_ids, labels=labels, use_cache=False) or model.config.use_cache = False.")
