"""Segment names of a model: an explicit list, a pattern such as ``"model.layers.*"``, or the
model's repeated block (the default)."""
from __future__ import annotations

import fnmatch
import reprlib
from collections import defaultdict
from typing import Any, Sequence

from torch import nn

_API = "stateremat.torch"


def _match(pattern: str, model: nn.Module) -> list[str]:
    parts = pattern.split(".")
    return [name for name, _ in model.named_modules(remove_duplicate=False) if name and len(name.split(".")) == len(parts)
            and all(fnmatch.fnmatchcase(a, b) for a, b in zip(name.split("."), parts))]


def repeated_blocks(model: nn.Module) -> list[str]:
    """Paths of the model's repeated block: the most frequent class among the children of its
    ``nn.ModuleList`` / ``nn.Sequential`` containers that have parameters and submodules of their
    own (single layers such as ``nn.Linear`` only if there is no such block; ties: more
    parameters), in module order.

    Examples: ``model.layers.{i}`` of a Llama, ``layer{1..4}.{j}`` of a ResNet, ``blocks.{i}`` of a
    ViT, ``bert.encoder.layer.{i}`` of a BERT.
    """
    by_class: dict[type, list[str]] = defaultdict(list)
    for name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            for child_name, child in m.named_children():
                if any(True for _ in child.parameters()):
                    by_class[type(child)].append(f"{name}.{child_name}" if name else child_name)
    if not by_class:
        return []
    blocks = {c: p for c, p in by_class.items() if any(True for _ in model.get_submodule(p[0]).children())}
    by_class = blocks or by_class

    def weight(cls: type) -> tuple[int, int]:
        paths = by_class[cls]
        return len(paths), sum(p.numel() for p in model.get_submodule(paths[0]).parameters())

    best = max(by_class, key=weight)
    paths = by_class[best]
    return [p for p in paths if not any(p != q and p.startswith(q + ".") for q in paths)]


def check_submodules(model: nn.Module, names: list[str], api: str) -> None:
    """Raise ``ValueError`` (naming ``api``) for the first name that is not a submodule path."""
    for n in names:
        try:
            model.get_submodule(n)
        except AttributeError as e:
            raise ValueError(f"{api}: segment {n!r} is not a submodule of {type(model).__name__} ({e}). "
                             "Tip: segment names are module paths as in model.named_modules().") from None


def refuse_shared_segments(model: nn.Module, names: list[str], api: str, nested: bool = False) -> None:
    """Raise ``ValueError`` (naming ``api`` and both paths) if two segment paths name the same module
    object (``model[0] is model[2]``: one module has one checkpointed ``forward``, so the options
    would overwrite each other); with ``nested``, also if a segment's module lies inside another
    segment's module through another path (an alias of a nested segment)."""
    first: dict[int, str] = {}
    for n in names:
        other = first.setdefault(id(model.get_submodule(n)), n)
        if other != n:
            raise ValueError(f"{api}: segments {other!r} and {n!r} are the same module object "
                             f"({type(model.get_submodule(n)).__name__}); expected each segment to be a distinct "
                             "module (one module has one checkpointed forward, so one option would silently "
                             f"replace the other). Tip: list it once (e.g. {other!r}); every call of it is then "
                             "that segment, or give the model distinct copies.")
    if not nested:
        return
    for n in names:
        inside = {id(m): p for p, m in model.get_submodule(n).named_modules(remove_duplicate=False) if p}
        for other in names:
            if other != n and id(model.get_submodule(other)) in inside:
                path = f"{n}.{inside[id(model.get_submodule(other))]}"
                raise ValueError(f"{api}: segment {other!r} is also inside segment {n!r} (as {path!r}, the same "
                                 "module object); expected disjoint segments. Tip: choose one level, e.g. the "
                                 "blocks.")


def resolve_segments(model: nn.Module, segments: Any) -> list[str]:
    """Segment module paths of ``model`` in forward (module) order.

    Args:
        model: the model.
        segments: ``None`` (the repeated block, :func:`repeated_blocks`), a pattern string whose
            dot-separated parts are shell wildcards (``"model.layers.*"`` = every child of
            ``model.layers``; ``"layer?.*"`` = every block of a ResNet's four stages), a container
            module inside ``model`` (its children), or a list of module paths.

    Returns:
        Module paths, unique, none inside another.

    Raises:
        ValueError: a path that is not a submodule, an empty result, duplicates, ``""`` (the whole
            model), one segment inside another, or two paths of one module object.
        TypeError: ``segments`` of another type.
    """
    if segments is None:
        names = repeated_blocks(model)
        how = "the repeated block (segments=None)"
    elif isinstance(segments, str):
        names = _match(segments, model)
        how = f"pattern {segments!r}"
    elif isinstance(segments, nn.Module):
        path = next((n for n, m in model.named_modules() if m is segments), None)
        if path is None:
            raise ValueError(f"{_API}: segments is a {type(segments).__name__} that is not inside the model. "
                             "Tip: pass a container of the model, e.g. segments=model.model.layers.")
        names = [f"{path}.{c}" if path else c for c, _ in segments.named_children()]
        how = f"the children of {path or 'the model'}"
    elif isinstance(segments, Sequence):
        names = list(segments)
        how = "the list"
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise TypeError(f"{_API}: segments must be module paths (str), got "  # bounded: a
                            f"{reprlib.repr(bad[:3])}. "  # 5,000-deep list must not recurse
                            "Tip: names as in model.named_modules().")
    else:
        raise TypeError(f"{_API}: segments must be None, a pattern string, a container module or a list of "
                        f"module paths, got {type(segments).__name__}. Tip: segments='model.layers.*'.")
    if not names:
        raise ValueError(f"{_API}: {how} selects no submodule of {type(model).__name__}. "
                         "Tip: list the segment paths, e.g. segments=['layers.0', 'layers.1'].")
    if "" in names:
        raise ValueError(f"{_API}: segment '' is the whole model; expected submodule paths. "
                         "Tip: segments are parts of the model, e.g. its layers.")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{_API}: segment names must be unique, got {dup} more than once. "
                         "Tip: list each module once.")
    check_submodules(model, names, _API)
    nested = [(a, b) for a in names for b in names if a != b and a.startswith(b + ".")]
    if nested:
        raise ValueError(f"{_API}: segment {nested[0][0]!r} lies inside segment {nested[0][1]!r}; "
                         "expected disjoint segments. Tip: choose one level, e.g. the blocks.")
    refuse_shared_segments(model, names, _API, nested=True)
    order = {n: i for i, (n, _) in enumerate(model.named_modules(remove_duplicate=False))}
    return sorted(names, key=order.__getitem__)
