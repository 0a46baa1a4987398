"""Iterators and generators a segment reaches: a run that advances one cannot be replayed (issue 25).

A forward that calls ``next()`` on a pre-existing iterator or generator (``x * next(g)``) gets
the next value; its replay in backward would call ``next()`` again and get the value after
(silently wrong gradients, and the iterator one step ahead of eager). No preserver can put a
generator back, so the forward is watched: :class:`IteratorWatch` records, when a run (the
forward, or a replay) begins, where each iterator the scan reached stands, and says at its end
which ones it advanced:

- builtin sequence iterators (``iter(list)``, ``iter(tuple)``, ``reversed(list)``,
  ``iter(range)``, ``iter(str)``, ``iter(bytes)``, ``iter(bytearray)``): the index their
  ``__reduce__`` reports (none once exhausted);
- dict and set iterators (``iter(d.values())``, ``iter(d.items())``, ``iter(s)``): their
  ``__length_hint__``, which counts down on each step (a dict resized under one reads as advanced);
- ``enumerate``: its count; ``itertools.count``: its repr (the next value);
- generators, coroutines (``async def``, advanced by ``coro.send(None)``; a ``types.coroutine``
  function's is a generator) and async generators (``agen.asend(None).send(None)``): a
  ``sys.setprofile`` hook, installed only while a run that reaches a live one runs, sees each
  resume of its frame (a ``'call'`` event, the only sound sign of a
  resume: it may stop at the same ``yield`` with the same locals); a Python profile function
  already installed is called on from it and put back after. A generator closed or finished
  shows in its state. The hook is a Python call per call event of the run (measured: a segment of
  eight 32-wide Linear+ReLU blocks, 4.7 ms a step, took 1.9 ms more CPU time, forward and replay
  hooked); only runs that reach a live generator pay it (``sys.monitoring``'s per-code resume
  events, Python 3.12, would not: not used, the library supports 3.11);
- other iterators of ``builtins``, ``itertools`` and ``collections`` (``zip``, ``map``,
  ``filter``, ``cycle``, ``islice``, ``chain``, a deque's iterator, ...) show no position: they
  count as advanced by every run that reaches them (so does a live generator while a C-level
  profiler — ``cProfile``, ``torch.profiler(with_stack=True)`` — holds the thread's profile hook,
  or when code in the run replaced the hook: its resumes cannot be seen).

The watch (``_watch``) acts on the answer: under ``state="auto"`` a forward that advanced one keeps
its activations (it runs as eager: no replay), strict mode refuses it, and a replay that advanced
one (a path its forward did not take) raises ``ReplayError``.

Danger:
    An iterator the scan does not reach (deeper than its depth, inside standard-library objects;
    a user's Python module is followed through the attribute names its code loads),
    one advanced from another thread, an ``asend()``/``athrow()`` awaitable held apart from its async
    generator, and files and sockets (their position is the OS's) are not watched.
"""
from __future__ import annotations

import contextlib
import itertools
import operator
import sys
import threading
import types
from typing import Any, Callable, Iterator

from stateremat.contract import rule

from ._errors import ReplayError

_OPAQUE = object()  # a position nobody can read: counted as advanced


def _index(it: Any) -> Any:
    return it.__reduce__()[2:]  # (index,) while live, () once exhausted (the sequence dropped)


def _remaining(it: Any) -> Any:
    return it.__length_hint__()


def _enumerate_count(it: Any) -> Any:
    return it.__reduce__()[1][1]


def _opaque(it: Any) -> Any:
    return _OPAQUE


_d = {0: 0}
#: Exact type -> how its position is read.
_KNOWN: dict[type, Callable[[Any], Any]] = {
    **{type(x): _index for x in (iter([]), iter(()), reversed([]), iter(range(1)), iter(range(2**64, 2**64 + 1)),
                                  iter(""), iter("\u00e9"), iter(b""), iter(bytearray()))},
    **{type(x): _remaining for x in (iter(_d), iter(_d.values()), iter(_d.items()), reversed(_d),
                                      reversed(_d.values()), reversed(_d.items()), iter(set()))},
    enumerate: _enumerate_count,
    itertools.count: repr,
}
del _d
#: Modules whose iterators show no position (``zip``, ``map``, ``itertools.cycle``, ...).
_OPAQUE_MODULES = frozenset({"builtins", "itertools", "_collections", "collections"})
_WATCHED: dict[type, bool] = {}  # type -> is it watched (cached)
#: Resumable types (their frame's resumes are seen by the profile hook) -> ``(frame, running, code,
#: what it is called)``: a generator's, a coroutine's and an async generator's attributes.
_RESUMABLE: dict[type, tuple[Callable[[Any], Any], Callable[[Any], bool], Callable[[Any], Any], str]] = {
    t: (operator.attrgetter(f"{p}_frame"), operator.attrgetter(f"{p}_running"), operator.attrgetter(f"{p}_code"), name)
    for t, p, name in ((types.GeneratorType, "gi", "generator"), (types.CoroutineType, "cr", "coroutine"),
                       (types.AsyncGeneratorType, "ag", "async generator"))}


def _resumable_state(g: Any) -> tuple[bool, Any]:
    """``(finished or closed, where it stands)``: a start, close or finish changes it (an async
    generator has no ``ag_suspended``: its frame's last instruction)."""
    frame = _RESUMABLE[type(g)][0](g)
    if frame is None:
        return True, None
    return False, g.gi_suspended if type(g) is types.GeneratorType else getattr(g, "cr_suspended", frame.f_lasti)


def is_watched_iterator(v: Any) -> bool:
    """Is ``v`` an iterator or generator whose advance :class:`IteratorWatch` must see? (Called by the
    scan on values no earlier check took: one dict lookup per type after the first.)"""
    t = type(v)
    w = _WATCHED.get(t)
    if w is None:
        w = _WATCHED[t] = t in _RESUMABLE or t in _KNOWN or (
            t.__module__ in _OPAQUE_MODULES and hasattr(t, "__next__"))
    return w


def describe_iterator(it: Any) -> str:
    """``generator 'make.<locals>.gen'``, ``coroutine 'step'``, ``async generator 'feed'``,
    ``list_iterator``, ``itertools.cycle object``."""
    t = type(it)
    if t in _RESUMABLE:
        return f"{_RESUMABLE[t][3]} {it.__qualname__!r}"
    return f"{t.__name__}" if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__} object"


# -- the resume hook (one per thread, shared by nested runs) ------------------------------------

class _Hook:
    """The thread's profile hook while runs watch generators: code -> ``(generator, resumed ids of
    the run watching it)`` (by code, not frame: a resume is the one whose generator — or coroutine,
    async generator — is running)."""

    def __init__(self) -> None:
        self.codes: dict[Any, list[tuple[Any, Callable[[Any], bool], set]]] = {}
        self.users = 0
        self.prev: Any = None
        self.fn: Any = None
        self.blind = False  # a C-level profiler holds the hook: resumes cannot be seen


_local = threading.local()


def _hook() -> _Hook:
    h = getattr(_local, "hook", None)
    if h is None:
        h = _local.hook = _Hook()
    return h


def _install(h: _Hook) -> None:
    prev = sys.getprofile()
    if prev is not None and not isinstance(prev, (types.FunctionType, types.MethodType)):
        h.blind = True  # (cProfile, torch's tracer: its C callback cannot be called on, nor put back)
        return
    codes = h.codes

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            watched = codes.get(frame.f_code)
            if watched is not None:
                for g, running, resumed in watched:
                    if running(g):
                        resumed.add(id(g))
        if prev is not None:
            prev(frame, event, arg)

    h.prev, h.fn, h.blind = prev, profile, False
    sys.setprofile(profile)


def _uninstall(h: _Hook) -> bool:
    """Put the previous profile function back; False if code in the run replaced ours (events missed)."""
    if h.fn is None:
        return not h.blind
    ours = sys.getprofile() is h.fn
    if ours:
        sys.setprofile(h.prev)
    h.prev = h.fn = None
    return ours


class IteratorWatch:
    """The iterators and generators one segment reaches (``found``: scan id -> ``(scan name,
    iterator)``), and which of them its forward (:attr:`advanced`) and its last replay
    (:attr:`replayed`) advanced.

    Each entry of those lists is ``(where, what, why)``: ``where`` the scan's name (``captured
    variable 'g'``), ``what`` its kind (:func:`describe_iterator`), ``why`` how the advance was
    seen (or that it cannot be: an opaque iterator, a hidden generator counts as advanced).
    """

    def __init__(self, found: dict[int, tuple[Any, Any]]) -> None:
        self.items = list(found.values())
        self.advanced: list[tuple[str, str, str]] = []
        self.replayed: list[tuple[str, str, str]] = []

    def forward(self) -> contextlib.AbstractContextManager:
        """Around the forward's function: fills :attr:`advanced` (free when nothing is reached)."""
        return self._run(self.advanced) if self.items else contextlib.nullcontext()

    def replay(self, inner: contextlib.AbstractContextManager) -> contextlib.AbstractContextManager:
        """Around a replay (``inner``: its mode, entered first): fills :attr:`replayed`."""
        return self._replay(inner) if self.items else inner

    @contextlib.contextmanager
    def _replay(self, inner: contextlib.AbstractContextManager) -> Iterator[None]:
        with inner, self._run(self.replayed):
            yield

    def refuse_replay(self, segment: str, warn: Callable[[str], None] | None = None) -> None:
        """After a replay: refuse one that advanced a reached iterator its forward did not (with
        ``warn``, strict mode's ``on_undeclared="warn"``, warn instead).

        Raises:
            ReplayError: naming each (what, where, how seen), with the tip to pass the value in.
        """
        if not self.replayed:
            return
        if warn is not None:  # (its forward may have advanced them too: warned then)
            warn(f"stateremat.torch.checkpoint: segment {segment!r}: its replay advanced {_listed(self.replayed)} "
                 "(on_undeclared='warn': the replay advances what its forward advanced a second time, and reads "
                 f"other values than the forward did; {rule('R2')}). Tip: {TIP}.")
            return
        raise ReplayError(
            f"stateremat.torch.checkpoint: segment {segment!r}: its replay advanced {_listed(self.replayed)}, "
            "which existed before the segment and which its forward did not advance (a path that depends on "
            "something other than the segment's inputs and state: is_replaying(), a Python value changed "
            "since the forward); the replay read a value its forward did not, so its activations differ from "
            f"the forward's ({rule('R2')}), and the iterator now stands past where eager leaves it (expected a "
            f"replay that advances no pre-existing iterator, got {len(self.replayed)}). Tip: {TIP}; or make "
            "the segment's path depend only on its inputs and state.")

    @contextlib.contextmanager
    def _run(self, out: list) -> Iterator[None]:
        out.clear()
        gens = [(n, g) for n, g in self.items if type(g) in _RESUMABLE and _RESUMABLE[type(g)][0](g) is not None
                and not _RESUMABLE[type(g)][1](g)]
        others = [(n, it, _KNOWN.get(type(it), _opaque)) for n, it in self.items if type(it) not in _RESUMABLE]
        before = [reader(it) for _, it, reader in others]
        states = [_resumable_state(g) for _, g in gens]
        resumed: set[int] = set()
        h = _hook() if gens else None
        if h is not None:
            if h.users == 0:
                _install(h)
            h.users += 1
            for _, g in gens:
                _, running, code, _ = _RESUMABLE[type(g)]
                h.codes.setdefault(code(g), []).append((g, running, resumed))
        try:
            yield
        finally:
            seen = True if h is None else _leave(h, gens, resumed)
            for (n, g), state in zip(gens, states):
                if not seen:
                    out.append((n, describe_iterator(g), "its resumes cannot be seen: another profile hook "
                                "holds the thread (a C-level profiler, or code in the run replaced ours)"))
                elif id(g) in resumed:
                    out.append((n, describe_iterator(g), "resumed by next(), send() or throw()"))
                elif _resumable_state(g) != state:
                    out.append((n, describe_iterator(g), "started, closed or finished"))
            for (n, it, reader), b in zip(others, before):
                if reader is _opaque:
                    out.append((n, describe_iterator(it), "its position cannot be read, so a run that reaches it "
                                "counts as advancing it"))
                elif reader(it) != b:
                    out.append((n, describe_iterator(it), f"moved from position {_show(b)} to {_show(reader(it))}"))


def _leave(h: _Hook, gens: list, resumed: set) -> bool:
    """A run stops watching ``gens``; the hook goes when its last user does. False: resumes were not seen."""
    codes = (_RESUMABLE[type(g)][2](g) for _, g in gens)
    for code in {id(c): c for c in codes}.values():  # (generators of one function share one)
        watched = [w for w in h.codes[code] if w[2] is not resumed]
        if watched:
            h.codes[code] = watched
        else:
            del h.codes[code]
    blind = h.blind
    h.users -= 1
    if h.users == 0:
        return _uninstall(h) and not blind
    return not blind and sys.getprofile() is h.fn


#: What a segment that needs a value from an iterator does instead (tests follow it).
TIP = ("call next() outside the segment and pass the value as an argument, e.g. checkpoint(f, x, next(it)) "
       "with def f(x, value) (a coroutine: v = coro.send(None) outside it, then checkpoint(f, x, v))")


def _listed(items: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{what} ({where}: {why})" for where, what, why in items)


def advanced_message(segment: str, items: list[tuple[str, str, str]]) -> str:
    """The strict-mode refusal of a forward that advanced (``items``: :attr:`IteratorWatch.advanced`)."""
    return (f"stateremat.torch.checkpoint: segment {segment!r} advanced {_listed(items)}, which existed before "
            "the segment; its replay in backward would advance it again and read the next value instead of the "
            f"one this forward read ({rule('R2')}), and no preserver can put an iterator or generator back "
            f"(expected no pre-existing iterator advanced inside a checkpointed segment, got {len(items)}). "
            f"Tip: {TIP}; or leave state= at its default (state='auto' keeps the activations of a forward that "
            "advances one: exact, as eager).")


def _show(pos: Any) -> str:
    if pos == ():
        return "exhausted"
    return str(pos[0]) if isinstance(pos, tuple) else str(pos)
