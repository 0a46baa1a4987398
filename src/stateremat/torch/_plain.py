"""Python bindings the replay must read as of the forward: the Transaction's third room.

A forward may rebind what a dict, a plain object, a class, a module's globals or a module
attribute holds: a Python scalar (``self.t = self.t + 1``, a spiking neuron's step), a tensor in
a container (``ctx.key = k``, a Megatron-style RNG tracker's ``states[name] =
torch.get_rng_state()``), an object in a dict or a plain object (``box["s"] = State(...)``, a
cache made lazily). Its replay would read the new value and, for an update, make it a second
time. In data-flow order:

- forward: :func:`plain_starts` records, as the forward begins, every such slot the segment
  reaches that holds a tensor or a Python scalar, and the other values of reached dicts, plain
  objects and modules' own attributes; at the forward's end :meth:`PlainBindings.settle` keeps
  the slots that were rebound or added (to anything but a hook's handle, which replays as its
  hooks do: as the forward ended);
- restore: :meth:`PlainBindings.as_of_forward` binds each to its value at the forward's start;
- reinstate: each gets back the value it held before the replay.

A forward that calls ``stateremat.torch.is_replaying()`` guards its own updates (``if not
is_replaying(): self.t += 1``): its slots are bound to the forward's *end* value instead (what an
update guarded before its use leaves for the computation), and a replay that rebinds one anyway
is refused with :class:`ReplayError` (it may have computed with a value the forward did not
see). An update after the value's last use needs no guard.

A slot is ``(holder, key)``: the holder is a dict (a container, a module's ``__dict__`` or
``_buffers``, an object's ``vars()``, module globals), a list (a tensor entry by index), a class
or a ``weakref`` mapping (an entry of a ``WeakValueDictionary`` / ``WeakKeyDictionary``, as a
dict's: a key the forward adds is absent during the replay, whatever it holds). A set's
membership (a ``set``'s, a ``WeakSet``'s: ``seen.add(self)``) replays as of the forward too: what
the forward added is absent during the replay, what it removed is back. A list's Python scalars are not state here:
``counter = [0]; counter[0] += 1`` is how code counts calls, replays included (torch's own tests
do), as a list's appends are.
"""
from __future__ import annotations

import contextlib
import types
from typing import Any, Iterator

import torch
from torch.utils.hooks import RemovableHandle

from ._errors import ReplayError
from ._scan import MODULE_INTERNALS, Reach, weak_kind

_ABSENT = object()  # a slot that is not bound at all
#: Containers a segment keeps from its forward to its backward are objects the garbage collector's
#: oldest generation scans (each one kept across a collection is promoted there, and enough of
#: them trigger a full collection): empty ones are these shared immutable empties (or ``()``).
EMPTY_SET: frozenset = frozenset()

#: Immutable Python values a slot may hold as state (a step counter, a scale, a flag).
SCALARS = (bool, int, float, complex, str, bytes, type(None))


def _table(holder: Any) -> Any:
    """The dict (or a class's mapping) a slot of ``holder`` lives in."""
    if isinstance(holder, (dict, type, list, types.CellType)) or weak_kind(holder) == "mapping":
        return holder
    return vars(holder)  # (a plain object's, or a weakref.proxy's referent's)


def _keys(table: Any) -> Any:
    """A table's keys as a set (a dict's view; a weak mapping's live keys, held until the forward's end)."""
    return table.keys() if isinstance(table, dict) else set(table.keys())


def _members(s: Any) -> set:
    """A set's or ``WeakSet``'s members, as a new set."""
    return set(s)


def _refill(s: Any, members: set) -> None:
    """Make ``s`` (a set or ``WeakSet``) hold exactly ``members``."""
    s.clear()
    s.update(members)


def slot_id(holder: Any, key: Any) -> tuple[int, Any]:
    """Identity of the slot ``holder[key]`` / ``holder.key`` (objects by their ``vars()``)."""
    return id(_table(holder)), key


def _get(holder: Any, key: Any) -> Any:
    if type(holder) is dict:  # (the common case: a module's or object's __dict__, first)
        return holder.get(key, _ABSENT)
    if isinstance(holder, list):
        return holder[key] if key < len(holder) else _ABSENT
    if type(holder) is types.CellType:  # a closure variable (``nonlocal acc; acc = acc + 1``)
        try:
            return holder.cell_contents
        except ValueError:
            return _ABSENT
    return (vars(holder) if isinstance(holder, type) else _table(holder)).get(key, _ABSENT)


def _put(holder: Any, key: Any, value: Any) -> None:
    if isinstance(holder, list):
        if value is not _ABSENT and key < len(holder):
            holder[key] = value
    elif type(holder) is types.CellType:
        if value is not _ABSENT:
            holder.cell_contents = value
        else:
            try:
                del holder.cell_contents
            except ValueError:
                pass
    elif isinstance(holder, type):  # a class's mapping is read-only: go through the class
        if value is not _ABSENT:
            setattr(holder, key, value)
        elif key in vars(holder):
            delattr(holder, key)
    elif value is _ABSENT:
        holder.pop(key, None)
    else:
        holder[key] = value


def _same(a: Any, b: Any) -> bool:
    """The same binding: the same object, or an equal scalar of the same type (``1`` is not ``1.0``)."""
    return a is b or (type(a) is type(b) and isinstance(a, SCALARS) and a == b)


#: Values no plain binding holds: tensors (slots, ModuleState's) and hooks' handles (see :func:`_handle`).
_NOT_PLAIN = (torch.Tensor, RemovableHandle)


def _handle(v: Any) -> bool:
    """A hook's handle (``if not hasattr(self, "h"): self.h = m.register_forward_hook(...)``): the
    hooks replay as the forward ended (ModuleState's), so the handle does too — bound as of the
    forward's start, the replay would register the hook a second time."""
    return isinstance(v, RemovableHandle)


def plain_starts(r: Reach, module_tensors: bool = False) -> tuple[list, list, list]:
    """As the forward begins: ``(holder, key, value)`` of every slot the segment reaches that holds
    a tensor, a Python scalar or an object — tensors bound in lists, dicts, weak mappings, plain
    objects, classes and module globals (:attr:`Reach.slots`), the scalars of reached dicts, weak
    mappings, plain objects and module attributes, the other values of reached dicts, plain objects
    and modules' own attributes; with ``module_tensors`` (``state="auto"``) also the reached
    modules' buffers and tensor attributes (parameters are the framework's: FSDP swaps them) —;
    ``(table, its keys)`` of those tables (a key the forward adds is absent during the replay); and
    ``(set, its members)`` of every reached set and ``WeakSet``."""
    out: dict[tuple[int, Any], tuple[Any, Any, Any]] = {}
    for _, holder, key, t in r.slots:
        table = _table(holder)
        out[(id(table), key)] = (table, key, t)
    tables: list[Any] = []
    for _, m in r.modules:  # one pass over each module's own attributes
        d = m.__dict__
        tables.append(d)
        if module_tensors:
            b = m._buffers
            for k, v in b.items():
                if isinstance(v, torch.Tensor):
                    out[(id(b), k)] = (b, k, v)
        for k, v in d.items():
            if isinstance(v, torch.Tensor):
                if module_tensors:
                    out[(id(d), k)] = (d, k, v)
            elif isinstance(v, SCALARS):
                if k != "training":  # modules' flags: ModuleState's
                    out.setdefault((id(d), k), (d, k, v))
            elif k not in MODULE_INTERNALS and not isinstance(v, _NOT_PLAIN):  # (hook tables: ModuleState's)
                out.setdefault((id(d), k), (d, k, v))
    n_modules = len(tables)
    sets = []
    for c in r.mutables:
        if isinstance(c, dict):
            tables.append(c)
        elif isinstance(c, set):
            sets.append(c)
        elif not isinstance(c, list):  # (a list's tensor entries: slots)
            kind = weak_kind(c)  # (a weakref.proxy's attributes: its referent's vars())
            (sets if kind == "set" else tables).append(c if kind in ("set", "mapping") else vars(c))
    for table in tables[n_modules:]:
        # an object bound in a dict or a plain object (``box["s"] = State(...)``; a module's own
        # attribute above, ``self.state = State(...)``) is a binding too; not a weak mapping's (held
        # here, its value would outlive its referents), nor a hook's handle (see :func:`_handle`)
        if type(table) is not dict:
            for k, v in table.items():
                if isinstance(v, SCALARS):
                    out.setdefault((id(table), k), (table, k, v))
            continue
        for k, v in table.items():
            if isinstance(v, SCALARS):
                if k != "training":  # modules' flags: ModuleState's
                    out.setdefault((id(table), k), (table, k, v))
            elif not isinstance(v, _NOT_PLAIN):
                out.setdefault((id(table), k), (table, k, v))
    for glb, name in r.scalar_globals:  # global STEP; STEP += 1
        v = glb.get(name, _ABSENT)
        if v is _ABSENT or isinstance(v, SCALARS):
            out.setdefault((id(glb), name), (glb, name, v))
    return list(out.values()), [(t, set(t)) for t in tables], [(c, _members(c)) for c in sets]


class PlainBindings:
    """Slots of :func:`plain_starts`, replayed as of the forward.

    Every recorded slot is bound for the replay to the value the forward read (its start value),
    so a value rebound between the forward and the backward (a counter the head advances,
    ``Dropout.p`` changed between micro-batches) does not reach the replay either; a key the
    forward added (``self.calls = getattr(self, "calls", 0) + 1``) is absent during the replay, and
    a set the forward changed (``seen.add(self)``) holds its start members during the replay.

    Args:
        starts: ``(slots, tables, sets)`` from :func:`plain_starts`, taken as the forward began.

    Attributes:
        bound: ``(holder, key, value the replay reads)`` of each recorded slot.
        changed: those the forward itself rebound (or added).
        keys: :func:`slot_id` of the changed slots (the watch does not refuse them).
        sets: ``(set, members the replay reads, members at the forward's end)`` of the sets the
            forward changed.
        guarded: the forward called ``is_replaying()`` (its changed slots replay as of its end;
            a replay rebinding one is refused).
    """

    def __init__(self, starts: tuple[list[tuple[Any, Any, Any]], list[tuple[Any, set]], list[tuple[Any, set]]]
                 ) -> None:
        self.starts, self.tables, self.set_starts = starts
        self.sets: list[tuple[Any, set, set]] = []
        self.bound: list[tuple[Any, Any, Any]] = []
        self.changed: list[tuple[Any, Any, Any]] = []
        self.keys: set[tuple[int, Any]] = set()
        self.guarded = False

    def settle(self, guarded: bool) -> None:
        """After the forward: note what it rebound (``guarded``: it called ``is_replaying()``)."""
        entries = [(h, k, v, _get(h, k)) for h, k, v in self.starts]
        for t, keys in self.tables:
            if len(t) != len(keys) or _keys(t) != keys:
                entries += [(t, k, _ABSENT, _get(t, k)) for k in _keys(t) - keys]
        self.bound, self.changed = [], []
        for h, k, v, e in entries:
            if _handle(e):
                continue
            if _same(v, e):
                self.bound.append((h, k, v))
            else:
                self.bound.append((h, k, e if guarded else v))
                self.changed.append(self.bound[-1])
        self.keys = frozenset((id(h), k) for h, k, _ in self.changed) or EMPTY_SET  # (kept till backward)
        self.sets = []
        for c, start in self.set_starts:  # (a set compares without a copy; a WeakSet's members are copied)
            if len(c) != len(start) or (c != start if isinstance(c, set) else _members(c) != start):
                end = _members(c)
                self.sets.append((c, end if guarded else start, end))
        self.guarded = guarded
        self.starts, self.tables, self.set_starts = (), (), ()
        self.changed, self.sets = self.changed or (), self.sets or ()

    @contextlib.contextmanager
    def as_of_forward(self) -> Iterator[None]:
        """Bind each recorded slot as of the forward for the replay; reinstate the current values after.

        Raises:
            ReplayError: a guarded forward's replay rebound a slot the forward had rebound too.
        """
        if not (self.bound or self.sets):
            yield
            return
        before = [(h, k, _get(h, k)) for h, k, _ in self.bound]
        for (h, k, v), (_, _, now) in zip(self.bound, before):
            if not _same(now, v):
                _put(h, k, v)
        members = [(c, _members(c)) for c, _, _ in self.sets]
        for (c, want, _), (_, now) in zip(self.sets, members):
            if now != want:
                _refill(c, want)
        again: list[tuple[Any, Any, Any]] = []
        try:
            yield
            if self.guarded:
                again = [(h, k, v) for h, k, v in self.changed if not _same(_get(h, k), v)]
                again += [(c, "the members of a set", c) for c, _, end in self.sets if _members(c) != end]
        finally:
            for h, k, v in before:
                if not _same(_get(h, k), v):
                    _put(h, k, v)
            for c, was in members:
                if _members(c) != was:
                    _refill(c, was)
        if again:
            _, k, v = again[0]
            raise ReplayError(
                f"stateremat.torch.checkpoint: the replay rebound {k!r} (it held a {type(v).__name__} at the "
                "forward's end) although the forward guards its updates with is_replaying(): the "
                "recomputation may have used a value the forward did not see, so its gradients cannot be "
                f"trusted (expected the replay to leave {k!r} as the forward left it, got a new value; it is "
                f"put back as it was before the replay). Tip: guard this update with 'if not "
                "stateremat.torch.is_replaying():' too, or drop the guards (an unguarded update replays "
                f"with its value at the forward's start), or keep {k!r} in a tensor buffer updated in place.")
