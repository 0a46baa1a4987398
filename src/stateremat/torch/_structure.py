"""Module structure and hook registrations a forward changes: what no replay can see as it was (issue 25).

A replay re-runs the forward's code against the world as the forward saw it: tensors, Python
values and module bindings are put back. What a forward *registers* is not: a hook it adds
behind a one-time flag (``if not self.ready: self.ready = True; w.register_hook(...)``) would be
added a second time by the replay (the flag replays as of the forward's start) and stay for
every later step; a one-shot hook that removes itself is gone for the replay; a child it
appends to a ``ModuleList``, a submodule it swaps after using it, a parameter or buffer it
registers, a parametrization (a class swap) cannot be had as of the forward's start without
duplicating the objects autograd accumulates into.

:class:`StructureWatch` records, when the forward begins, one flat list of cheap reads (types,
lengths, the keys of non-empty hook tables and the identities of each reached module's
children) over torch's global module hook tables, every reached module (``Reach.modules``:
its class, the number of its parameters and buffers, its forward/backward hook tables, its
children) and every reached tensor that is no input of the segment (its tensor hooks); at the
forward's end it reads them again and says what differs. A hook registered and removed inside
the forward, or one registered or removed between the forward and its backward, changes
nothing here (the replay runs the former again; hooks replay as the forward ended). The record
holds the reached modules' children until the forward ends, and nothing after.

The caller acts on the answer (``run_segment``): under ``state="auto"`` that one forward keeps
its activations (it runs as eager: no replay, nothing registered twice) and the next step,
structure unchanged, is checkpointed. Strict mode (activations already dropped) refuses a
forward that removed a hook (:meth:`StructureWatch.refuse_removed`: the replay would run
without it) and checks the replay (:meth:`StructureWatch.around_replay`): one that ends
otherwise than its forward did — its set-up ran a second time — is refused with
``ReplayError``; one guarded by ``is_replaying()`` or by something the replay sees as the
forward left it (``if not hasattr(self, "handle")``), or that registers again what the
declared bindings put back as of the forward's start, replays.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from torch.nn.modules import module as _module

from ._errors import ReplayError, UnsupportedError
from ._scan import describe, is_input_name

#: A module's hook tables: registering or removing a hook adds or drops a key in one of these
#: (the kwargs / always-called side tables only flag keys of the first two).
_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBALS = tuple(getattr(_module, f"_global{n}") for n in _TABLES if hasattr(_module, f"_global{n}"))
_WHAT = ("forward pre-hooks", "forward hooks", "backward pre-hooks", "backward hooks")


def _keys(t: Any) -> Any:
    # a table's keys (handle ids, never reused: exact), allocated only when it has any
    return (*t,) if t else 0


def _signature(modules: list, tensors: list, marks: list | None) -> list:
    """One flat list (one loop, no call per module: this runs twice per segment and step)."""
    sig: list = [_keys(t) for t in _GLOBALS]
    fp, f, bp, b = _TABLES
    for _, m in modules:
        if marks is not None:
            marks.append(len(sig))
        d = m.__dict__
        children, h1, h2, h3, h4 = d["_modules"], d.get(fp), d.get(f), d.get(bp), d.get(b)
        sig += (type(m), len(d["_parameters"]), len(d["_buffers"]), (*h1,) if h1 else 0, (*h2,) if h2 else 0,
                (*h3,) if h3 else 0, (*h4,) if h4 else 0, len(children))
        if children:
            sig += children.values()
    for _, t in tensors:
        if marks is not None:
            marks.append(len(sig))
        h1, h2 = t._backward_hooks, t._post_accumulate_grad_hooks
        sig += ((*h1,) if h1 else 0, (*h2,) if h2 else 0)
    return sig


class StructureWatch:
    """Module structure and hook registrations around one forward (see the module docstring).

    Args:
        modules: the reached ``(path, module)`` pairs (``Reach.modules``).
        tensors: the reached tensors (``Reach.tensors``); the segment's inputs are left out (a hook
            the replay registers on its detached inputs never runs).
    """

    def __init__(self, modules: list, tensors: dict) -> None:
        self.modules = modules
        self.tensors = [(n, t) for n, t in tensors.values() if not (isinstance(n, str) and is_input_name(n))]
        self._start: list | None = _signature(modules, self.tensors, None)

    def changes(self, keep: bool = False) -> tuple[str, ...]:
        """At the forward's end: what it changed (empty: nothing), described; the record is dropped,
        and what it reaches too unless ``keep`` (strict mode: the replay is checked against the
        forward's end, :meth:`around_replay`)."""
        start, self._start = self._start, None
        end = _signature(self.modules, self.tensors, None) if start is not None else None
        out = self._diff(start, end) if start is not None else ()
        if keep and out:
            self._end, self._removed, self._what = end, _hooks_of(start) - _hooks_of(end), "; ".join(out)
        else:
            self.modules, self.tensors = (), ()
        return out

    def _diff(self, before: list, now: list) -> tuple[str, ...]:
        if now == before:  # (identity first for each entry: no __eq__ of a module is called)
            return ()
        marks: list = []
        _signature(self.modules, self.tensors, marks)  # (offsets of ``now``'s parts)
        i = next((i for i, (a, b) in enumerate(zip(before, now)) if not (a is b or a == b)),
                 min(len(before), len(now)))
        return (_describe(self, marks, i, before, now),)

    def refuse_removed(self, name: str) -> None:
        """Strict mode, at the forward's end: a hook the forward removed (a one-shot hook) cannot be
        there for the replay, which would compute without it.

        Raises:
            UnsupportedError: naming what changed, with what to do.
        """
        if self._removed:
            raise UnsupportedError(
                f"stateremat.torch.checkpoint: segment {name!r} removed a hook in its forward ({self._what}): its "
                "replay would run without it and compute other saved tensors than the forward did (expected "
                "the hooks the forward began with to be there as it ends, got one removed). Tip: remove the "
                "hook outside the checkpointed segment (e.g. after backward), or run that step without "
                "checkpointing, or leave state= at its default (state='auto' runs such a forward as eager).")

    @contextlib.contextmanager
    def around_replay(self, name: str, inner: Any) -> Iterator[None]:
        """Strict mode, around the replay of a forward that changed its modules: a replay that leaves
        them otherwise than the forward did (its set-up ran a second time: a flag replays as of the
        forward's start) is refused before its recomputed tensors are used.

        Raises:
            ReplayError: naming what differs (the replay's change is not undone), with what to do.
        """
        with inner:
            yield
        again = self._diff(self._end, _signature(self.modules, self.tensors, None))
        if again:
            raise ReplayError(_message(name, again))


def _hooks_of(sig: list) -> set:
    """Every hook id in a signature (ids are never reused: one missing at the end was removed)."""
    return {k for e in sig if type(e) is tuple for k in e}


def _describe(w: StructureWatch, marks: list, i: int, start: list, end: list) -> str:
    """Name what changed at the first differing entry ``i`` (earlier parts are equal in both)."""
    k = sum(1 for m in marks if m <= i) - 1  # the part holding entry i
    if k < 0:
        return "torch's global module hooks (register_module_forward_hook / _backward_hook ...)"
    if k >= len(w.modules):
        name, _ = w.tensors[k - len(w.modules)]
        return f"the hooks of {describe(name)} (register_hook / register_post_accumulate_grad_hook)"
    path, m = w.modules[k]
    where = f"module {path!r}" if path else f"the segment's module ({type(m).__name__})"
    a, b = start[marks[k]:], end[marks[k]:]
    if a[0] is not b[0]:
        return f"{where}: its class ({a[0].__name__} -> {b[0].__name__}, e.g. register_parametrization)"
    if a[1] != b[1] or a[2] != b[2]:
        return f"{where}: its parameters or buffers (added or removed)"
    for j, what in enumerate(_WHAT):
        if a[3 + j] != b[3 + j]:
            return f"{where}: its {what} (registered or removed)"
    return f"{where}: its submodules (added, removed or rebound)"


def _message(name: str, changed: tuple[str, ...]) -> str:
    return (f"stateremat.torch.checkpoint: segment {name!r}: its replay left {'; '.join(changed)} otherwise "
            "than its forward did: the forward's set-up ran a second time (a flag it sets replays as of the forward's "
            "start), so the replay computed against other hooks or modules than the forward did (expected the "
            "replay to leave the module structure and hook registrations as the forward left them, got a "
            "change; it stays: remove it before retrying). Tip: guard the set-up with 'if not "
            "stateremat.torch.is_replaying():' (the replay then sees what the forward left), or run one step "
            "without checkpointing first, or leave state= at its default (state='auto' runs such a forward "
            "as eager, once).")
