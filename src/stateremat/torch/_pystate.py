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

from stateremat.contract import UnsupportedError, rule


def _is_transformers_cache(obj: Any) -> bool:
    return any(c.__name__ == "Cache" and c.__module__.startswith("transformers")
               for c in type(obj).__mro__)


def python_state_arguments(args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """``(argument, object)`` for each transformers ``Cache`` among ``args``/``kwargs`` (top level)."""
    found = [(f"positional argument {i}", a) for i, a in enumerate(args) if _is_transformers_cache(a)]
    found += [(f"keyword argument {k!r}", v) for k, v in kwargs.items() if _is_transformers_cache(v)]
    return found


def refuse_python_state(api: str, segment: str, args: tuple, kwargs: dict) -> None:
    """Raise :class:`UnsupportedError` if a KV cache object reaches a segment that will replay.

    Args:
        api: the public API in the message (``"stateremat.torch.apply_plan"``).
        segment: the segment's name (module path).
        args, kwargs: the segment's arguments.

    Raises:
        UnsupportedError: naming the cache's type, the argument and the segment.
    """
    found = python_state_arguments(args, kwargs)
    if not found:
        return
    where, cache = found[0]
    raise UnsupportedError(
        f"{api}: segment {segment!r} received a transformers {type(cache).__name__} as its {where}; "
        f"the replay in backward would update that KV cache a second time ({rule('R2')}), and a "
        "Python-level cache cannot be declared as state. Expected no cache object in a "
        "checkpointed segment's arguments. Tip: train with use_cache=False, e.g. "
        "model(input_ids, labels=labels, use_cache=False) or model.config.use_cache = False.")
