"""``state="auto"``: the state a segment writes, found without declarations (issue 25).

Per thread, two sets of tensors (held weakly):

- *seen*: every tensor an auto segment reached while its forward ran with every op watched;
- *written*: those such a forward wrote in place (declared on write, before the write) and those
  a later forward was found to have written at its end.

An auto segment whose reach holds a tensor not yet seen (its first step, or a tensor created
since) runs like ``on_undeclared="declare"``: every op is watched and each pre-existing tensor is
declared just before its first write, with the segment's preserver (a journal keeps that write
too). A segment that reaches only seen tensors declares the written ones it reaches up front and
runs without the watch. Either way its forward keeps its saved tensors until it ends: if the
watch's end check then finds a write no dispatch saw (a branch taken for the first time, a
``.data =`` rebinding), that tensor is learned and this one forward keeps its activations (it
runs as eager would: no replay, no second write). Its replay runs watched, so a write the
forward did not make is refused before it happens, and :func:`refuse_changed_reads` refuses a
replay whose forward read a tensor that code first seen writing it wrote since.

The segment's own inputs and tensors with an autograd history (activations) are no state: they
never make a segment run watched, and a write to an input keeps its clear error.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

import torch

from ._compat import DisableTorchFunctionSubclass, has_storage
from ._errors import ReplayError
from ._scan import Declared, describe, is_input_name, is_list_entry
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
        self.skipped = _TensorSet()  # reached but untouched by one watched forward

    @staticmethod
    def _state(r_tensors: dict) -> Iterable[tuple[Any, torch.Tensor]]:
        for name, t in r_tensors.values():
            if t.grad_fn is None and not (isinstance(name, str) and is_input_name(name)):
                yield name, t

    def needs_watch(self, r_tensors: dict) -> bool:
        """Does the reach hold state no watched forward has seen yet? (A tensor in a list — a log
        the model appends to each step — does not count: a first write to one is a gap.)"""
        return any(t not in self.seen for n, t in self._state(r_tensors)
                   if not is_list_entry(n))

    def declared(self, r_tensors: dict) -> Declared:
        """The written tensors among the reached ones, declared (scan names, one group each)."""
        return Declared(tensors=[(describe(n), t, id(t)) for n, t in self._state(r_tensors) if t in self.written])

    def see(self, r_tensors: dict, touched: set) -> None:
        """A watched forward ended: every state tensor it reached and passed to an op is seen. One
        it only reached (another chunk's buffer) stays unseen once, so the forward that uses it is
        watched too; untouched by a second watched forward (an eval BatchNorm's batch counter), it
        is seen: a later first write is then a gap, handled at that forward's end."""
        for _, t in self._state(r_tensors):
            if not has_storage(t) or storage_key(t) in touched or t in self.skipped:
                self.seen.add(t)
            else:
                self.skipped.add(t)

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
        watch.touched = frozenset(rt.touched or ())  # what this forward read: refuse_changed_reads
        lr.see(r_tensors, rt.touched or set())
        if not rt.forward[:-1]:  # the outermost watched forward ends: stop noting
            rt.touched = None
    # an iterator it advanced (_iterators), hooks or structure it changed (_structure): no replay
    frame.settle(eager=bool(watch.gaps or watch.iters.advanced or watch.restructured))


def refuse_changed_reads(rt: Any, watch: Any, name: str) -> None:
    """Before an auto segment's replay: refuse it if a tensor it reached without preserving it
    (not known to be written when its forward began) was written since, by code the default saw
    write it for the first time (another segment, a branch taken late): the replay would read
    other bytes than its forward did. A watched forward checks only the tensors it passed to an op.

    Raises:
        ReplayError: naming the tensors (they are preserved wherever reached from the next step).
    """
    written = learned(rt).written
    touched = getattr(watch, "touched", None)
    with DisableTorchFunctionSubclass():
        hit = [describe(n) for n, t, _ in watch.scan
               if t in written and t._version != watch.expected.get(id(t), t._version)
               and (touched is None or not has_storage(t) or storage_key(t) in touched)]
    if hit:
        raise ReplayError(
            f"stateremat.torch.checkpoint: segment {name!r} read {', '.join(hit)} in its forward, and "
            "that was written in place after that forward and before this backward by code seen writing "
            "it for the first time (state='auto' learns a write on the step it first happens); this "
            "segment kept no copy, so its replay cannot read the bytes its forward read (R2). The tensor "
            "is preserved wherever it is reached from the next forward on (expected the bytes the "
            "forward read, got bytes written since). Tip: put the tensor back as it was before this step "
            "and rerun the step (this step's forward already wrote it once, and the parameters' gradients "
            "may be partial: zero them); to be exact from the first step, declare it where it is read "
            "(checkpoint(fn, ..., state=[tensor]): a step run without checkpointing teaches the default "
            "nothing)."
        )
