"""``stateremat profile pkg.module:factory``: profile a user's own model (library side, §4).

The factory is called without arguments and returns the model and its training step, as a dict
``{"model": m, "sample": batch}`` or ``{"model": m, "step_fn": fn, "optimizers": [opt]}``
(optionally ``"segments"``), or a tuple ``(model, sample_or_step_fn)``.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Mapping

_API = "stateremat profile"
_KEYS = ("model", "sample", "step_fn", "optimizers", "segments")


def _importable_here() -> None:
    if os.getcwd() not in sys.path:  # as `python -m` does: modules beside the caller are importable
        sys.path.insert(0, os.getcwd())


def target_source(target: str) -> str | None:
    """The file of ``pkg.module`` in a target ``pkg.module:factory`` (found without running the
    module itself; its parent packages are imported), or None (not a target, not found)."""
    import importlib.util

    module_name, sep, _ = target.partition(":")
    if not sep or not module_name:
        return None
    _importable_here()
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError, AttributeError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def load_target(target: str) -> dict[str, Any]:
    """Import ``pkg.module:factory``, call it and return its parts as a dict (see module doc).

    Raises:
        ValueError: a malformed target, a module or attribute that cannot be found, or a factory
            whose result is not one of the accepted forms.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr.isidentifier():
        raise ValueError(f"{_API}: expected a built-in workload name or a target 'pkg.module:factory', got "
                         f"{target!r}. Tip: e.g. stateremat profile mypkg.models:build --out CARD.json.")
    _importable_here()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{_API}: cannot import {module_name!r} ({e}). Tip: run from the folder that holds "
                         "it or install its package.") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{_API}: {module_name!r} has no callable {attr!r}; expected a factory returning the model "
                         "and a sample or step function. Tip: check the name after the colon.")
    got = factory()
    if isinstance(got, tuple) and len(got) == 2:
        model, step = got
        got = {"model": model, "step_fn" if callable(step) and not hasattr(step, "shape") else "sample": step}
    if not isinstance(got, Mapping) or "model" not in got or ("sample" in got) == ("step_fn" in got) \
            or set(got) - set(_KEYS):
        raise ValueError(f"{_API}: {target} returned {type(got).__name__}"
                         f"{' with keys ' + str(sorted(got)) if isinstance(got, Mapping) else ''}; expected a dict "
                         "with 'model' and exactly one of 'sample' and 'step_fn' (optional 'optimizers', "
                         "'segments'), or a tuple (model, sample_or_step_fn). Tip: see `stateremat profile --help`.")
    return dict(got)


def profile_target(target: str, segments: str | list[str] | None, device: str | None, repeats: int) -> Any:
    """The card of a target (``segments``, the parsed ``--segments``: a pattern or a list of
    module paths, wins over the factory's ``segments``)."""
    from stateremat.torch import profile

    parts = load_target(target)
    rule: Any = parts.get("segments")
    if segments is not None:
        rule = segments
    step = parts.get("step_fn", parts.get("sample"))
    return profile(parts["model"], rule, step, device=device, repeats=repeats,
                   optimizers=parts.get("optimizers", ()))
