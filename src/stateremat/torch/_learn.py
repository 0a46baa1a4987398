"""``state="auto"``: the state a segment writes, found without declarations (issue 25).

Per thread, two sets of tensors (held weakly):

- *seen*: every tensor an auto segment reached while its forward ran with every op watched;
- *written*: those such a forward wrote in place (declared on write, before the write) and those
  a later forward was found to have written at its end.

An auto segment whose reach holds a tensor not yet seen (its first step, or a tensor created
since) runs like ``on_undeclared="declare"``: every op is watched and each pre-existing tensor is
snapshotted whole just before its first write. A segment that reaches only seen tensors declares
the written ones it reaches up front, with its own preserver, and runs without the watch; its
forward keeps its saved tensors until it ends. If the watch's end check then finds a write to a
tensor not declared (a branch taken for the first time), that tensor is learned and this one
forward keeps its activations (it runs as eager would: no replay, no second write). Nothing is
replayed against state it did not preserve.

The segment's own inputs and tensors with an autograd history (activations) are no state: they
never make a segment run watched, and a write to an input keeps its clear error.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

import torch

from ._compat import has_storage
from ._scan import Declared, describe, is_input_name
from ._storage import storage_key

#: The ``state=`` value that finds the state itself (the default).
AUTO = "auto"


class _TensorSet:
    """Tensors by identity, held weakly (a tensor's ``==`` is elementwise: no ``WeakSet``)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def __contains__(self, t: torch.Tensor) -> bool:
        r = self._refs.get(id(t))
        return r is not None and r() is t

    def add(self, t: torch.Tensor) -> None:
        if t in self:
            return
        i, refs = id(t), self._refs

        def gone(ref: weakref.ref) -> None:
            if refs.get(i) is ref:
                del refs[i]

        refs[i] = weakref.ref(t, gone)

    def __len__(self) -> int:
        return len(self._refs)


class Learned:
    """What auto segments of one thread have seen and found written (see the module docstring)."""

    def __init__(self) -> None:
        self.seen = _TensorSet()
        self.written = _TensorSet()

    @staticmethod
    def _state(r_tensors: dict) -> Iterable[tuple[Any, torch.Tensor]]:
        for name, t in r_tensors.values():
            if t.grad_fn is None and not (isinstance(name, str) and is_input_name(name)):
                yield name, t

    def needs_watch(self, r_tensors: dict) -> bool:
        """Does the reach hold state no watched forward has seen yet?"""
        return any(t not in self.seen for _, t in self._state(r_tensors))

    def declared(self, r_tensors: dict) -> Declared:
        """The written tensors among the reached ones, declared (scan names, one group each)."""
        return Declared(tensors=[(describe(n), t, id(t)) for n, t in self._state(r_tensors) if t in self.written])

    def see(self, r_tensors: dict, touched: set) -> None:
        """A watched forward ended: every state tensor it reached and passed to an op is seen
        (one it only reached — another chunk's buffer — stays unseen: its own forward is watched)."""
        for _, t in self._state(r_tensors):
            if not has_storage(t) or storage_key(t) in touched:
                self.seen.add(t)

    def learn(self, tensors: Iterable[torch.Tensor]) -> None:
        """These tensors were written by an auto segment's forward: declare them from now on."""
        for t in tensors:
            self.written.add(t)
            self.seen.add(t)


def learned(rt: Any) -> Learned:
    """The runtime's :class:`Learned` (created on first use)."""
    lr = getattr(rt, "learned", None)
    if lr is None:
        lr = rt.learned = Learned()
    return lr


def begin(rt: Any, r_tensors: dict) -> tuple[Declared, str]:
    """An auto segment's forward begins: its declared state and watch mode (``"declare"``: every
    op watched, this step; ``"learn"``: declared up front, a write found at the end is a gap)."""
    lr = learned(rt)
    mode = "declare" if lr.needs_watch(r_tensors) else "learn"
    if not rt.forward:  # outermost: note what a watched forward touches (_mode.StrictMode fills it)
        rt.touched = set() if mode == "declare" else None
    elif mode == "declare" and rt.touched is None:
        rt.touched = set()
    return lr.declared(r_tensors), mode


def end(rt: Any, r_tensors: dict, mode: str, watch: Any, frame: Any) -> None:
    """An auto segment's forward ended: learn what it wrote; a gap makes this forward eager."""
    lr = learned(rt)
    lr.learn([*watch.promoted, *watch.gaps])
    if mode == "declare":
        lr.see(r_tensors, rt.touched or set())
        if not rt.forward[:-1]:  # the outermost watched forward ends: stop noting
            rt.touched = None
    else:
        frame.settle(eager=bool(watch.gaps))
