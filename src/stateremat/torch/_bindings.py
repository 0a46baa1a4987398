"""Module bindings, views and training flags as of the forward: the Transaction's second room.

A replay must read what the forward read. Between forward and backward, and inside the forward
itself, a module attribute may be rebound (``self.m = self.m + 1``, ``register_buffer``), a
tensor may change its view of the same bytes (``t_()``, ``as_strided_()``, ``.data =
t.view(dtype)``) and a module may change its training flag. In data-flow order:

- forward: :class:`ModuleState` records the reached modules' training flags, the declared
  modules' bindings (:class:`Bindings`) and the views of the reached tensors (:func:`view_records`);
  at the forward's end, every reached module's bindings (:func:`note_end_bindings`) and forward
  hooks, with torch's global ones (:func:`hook_records`);
- restore (the replay, :meth:`ModuleState.as_of_forward`): the forward's end bindings
  (:func:`end_bindings_as_of`) and hooks (:func:`hooks_as_of`), then as of its start the flags
  (:func:`_modes_as_of`), the views
  (:func:`moved_views`, :func:`views_as_of`) and the declared bindings
  (:meth:`Bindings.as_of_forward_start`), also those of the segments nested in it
  (:meth:`ModuleState.adopt`);
- reinstate: every binding, view and flag as it was before the replay.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from ._compat import DisableTorchFunctionSubclass, forward_hook_tables, global_forward_hook_tables, has_storage, \
    library_ops
from ._errors import UnsupportedError
from ._framework import framework_swap
from ._plain import EMPTY_SET, PlainBindings, plain_starts
from ._scan import Declared, Reach, tensor_slots


_ABSENT = object()  # a slot that is not bound at all


def _slot_get(m: nn.Module, d: str, k: str) -> Any:
    return getattr(m, d).get(k, _ABSENT)


def put_binding(table: dict, key: str, present: bool, value: Any) -> None:
    """Bind ``key`` in a module's table (``_parameters``, ``_buffers``, ``__dict__``,
    ``_modules``) to ``value``, or remove it when ``present`` is false."""
    if present:
        table[key] = value
    else:
        table.pop(key, None)


def _slot_set(m: nn.Module, d: str, k: str, v: Any) -> None:
    """Set (``v`` a value, None included) or remove (``v`` is ``_ABSENT``) a module's parameter/buffer/attribute slot."""
    put_binding(getattr(m, d), k, v is not _ABSENT, v)


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr() if has_storage(t) else None
    except RuntimeError:  # a wrapper subclass's storage has no data
        return None


def view_records(tensors: Any) -> list[tuple]:
    """Each tensor's view of its storage: ``(tensor, offset, size, stride, dtype, storage address)``;
    tensors with an autograd history are left out (a segment's inputs, saved separately; holding
    them would tie the graph to the segment)."""
    out = []
    with DisableTorchFunctionSubclass():
        for t in tensors:
            ptr = _storage_ptr(t) if t.grad_fn is None else None
            if ptr is not None:
                out.append((t, t.storage_offset(), t.size(), t.stride(), t.dtype, ptr))
    return out


def moved_views(records: list[tuple]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The recorded tensors whose view of the *same* storage changed since (``t_()``,
    ``as_strided_()``, ``.data = t.view(dtype)``), each with a tensor of the recorded view (a
    storage rebinding is not a view change: the replay refuses it for declared state)."""
    out = []
    with DisableTorchFunctionSubclass():
        for t, off, size, stride, dtype, ptr in records:
            if (t.storage_offset() != off or t.size() != size or t.stride() != stride or t.dtype != dtype) \
                    and _storage_ptr(t) == ptr:
                with library_ops():
                    out.append((t, torch.empty(0, dtype=dtype, device=t.device).set_(
                        t.untyped_storage(), off, size, stride)))
    return out


@contextlib.contextmanager
def views_as_of(swaps: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """Give each tensor of ``swaps`` the paired view (``.data``) for the block, its own after."""
    if not swaps:
        yield
        return
    with library_ops():
        now = [(t, t.detach()) for t, _ in swaps]
    with torch.no_grad():
        for t, orig in swaps:
            t.data = orig
    try:
        yield
    finally:
        with torch.no_grad():
            for t, v in now:
                t.data = v



def slot_starts(m: nn.Module) -> tuple:
    """What ``m``'s slots hold at the forward's start, as shallow copies (cheap): its unregistered
    attributes, buffers and parameters; read by :func:`tensor_bound` after the forward."""
    return m, m.__dict__.copy(), m._buffers.copy(), m._parameters.copy()


def tensor_bound(starts: list[tuple], ends: dict[int, dict]) -> list[tuple[nn.Module, str, str, Any]]:
    """``(module, table, key, start value)`` of each slot that held a non-tensor at the forward's
    start (``self.v = 0.0``, ``self.h = None``, a buffer registered as ``None``) and a tensor at its
    end: the replay binds the start value again (it is immutable or not state), then the tensor.

    Args:
        starts: :func:`slot_starts` of the modules, taken as the forward began.
        ends: ``id(module) -> tensor_slots(module)`` taken after the forward, if any.
    """
    out = []
    for m, attrs, bufs, params in starts:
        tables = {"__dict__": attrs, "_buffers": bufs, "_parameters": params}
        for (d, k), v in (ends[id(m)] if id(m) in ends else tensor_slots(m)).items():
            if v is not None and k in tables[d] and not isinstance(tables[d][k], torch.Tensor):
                out.append((m, d, k, tables[d][k]))
    return out


class Bindings:
    """Which tensor each declared module attribute names, and which storage each declared tensor uses.

    A forward that rebinds (``self.m = self.m + 1``, ``register_buffer("m", ...)``) or swaps
    storage (``self.m.data = ...``) changes what the replay would read; the replay runs with the
    forward-start bindings, which are reinstated afterwards.
    """

    def __init__(self, modules: list[tuple[str, nn.Module]], tensors: list[torch.Tensor],
                 slots: list[tuple[nn.Module, str, str, Any]] = (), reached: list[nn.Module] = (),
                 start_slots: dict[int, dict] | None = None) -> None:
        self.mods = list({id(m): m for _, mod in modules for m in mod.modules()}.values())
        # declared and reached modules' slots as the forward starts: one holding a non-tensor then
        # (self.v = 0.0) and a tensor after is bound to its start value for the replay (tensor_bound)
        self.starts = [slot_starts(m) for m in {id(m): m for m in [*self.mods, *reached]}.values()]
        self.plain_keys: set[tuple[int, str, str]] = set()
        known = start_slots or {}  # (tensor_slots of the modules the scan met, as the forward starts)
        self.slots = [(m, d, k, v) for m in self.mods
                      for (d, k), v in (known.get(id(m)) or tensor_slots(m)).items()] + list(slots)
        self.data: list[tuple] = []
        self.add_tensors(tensors)
        self.rebound: list[tuple[nn.Module, str, str, Any]] = []
        self.swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.geometry: list[tuple] = []  # view_records of the declared tensors after the forward

    def add_tensors(self, tensors: list[torch.Tensor]) -> None:
        """Note where ``tensors`` (declared now: at the forward's start, or promoted before their
        first write) keep their bytes: a later ``set_``/``.data =`` is swapped back for the replay."""
        with DisableTorchFunctionSubclass():
            self.data = [*self.data, *((t, st, t.storage_offset(), t.size(), t.stride(), t.data_ptr(), st.data_ptr(), t.dtype)
                          for t in tensors if has_storage(t) for st in (t.untyped_storage(),))]

    def settle(self, now: dict[int, dict] | None = None) -> None:
        """After the forward: note what changed (nothing kept when nothing did).

        Args:
            now: ``id(module) -> tensor_slots(module)`` already taken after the forward, if any.
        """
        now = now or {}
        self.rebound = [(m, d, k, v) for m, d, k, v in self.slots
                        if _slot_get(m, d, k) is not v and not framework_swap(d, v, _slot_get(m, d, k))]
        plain = tensor_bound(self.starts, now)
        self.plain_keys = {(id(m), d, k) for m, d, k, _ in plain}
        start = {(id(m), d, k) for m, d, k, _ in self.slots} | self.plain_keys
        self.rebound += plain + [(m, d, k, _ABSENT) for m in self.mods
                         for (d, k) in (now[id(m)] if id(m) in now else tensor_slots(m))
                         if (id(m), d, k) not in start]  # created by the forward (a lazy buffer)
        with DisableTorchFunctionSubclass():
            moved = [e for e in self.data if e[0].data_ptr() != e[5] or e[0].untyped_storage().data_ptr()
                     != e[1].data_ptr() or e[0].size() != e[3] or e[0].stride() != e[4] or e[0].dtype != e[7]]
            # the same storage object, reallocated: resize_ grew it inside the forward; its bytes
            # before the forward are gone with the old allocation, so no replay can start from them
            # (a view moved within the same allocation — as_strided_, set_ — is swapped back below)
            grown = [e for e in moved if e[0].untyped_storage().data_ptr() == e[1].data_ptr() != e[6]]
        if grown:
            t = grown[0][0]
            raise UnsupportedError(
                f"stateremat.torch.checkpoint: a declared tensor (now shape {tuple(t.shape)}, {t.dtype}) was "
                "resized inside the segment's forward (resize_ grew its storage), so the bytes the replay "
                "must start from are gone (expected declared state to keep its storage within a segment; "
                "torch.ao observers grow their buffers on their first call). Tip: run one step without "
                "checkpointing first (the buffer then has its final size), or allocate it at full size.")
        with library_ops():
            self.swapped = [(t, torch.empty(0, dtype=dtype, device=t.device).set_(st, off, size, stride))
                            for t, st, off, size, stride, _, _, dtype in moved]
        # the others' geometry: an in-place metadata change after the forward (t_(), transpose_(),
        # as_strided_() on the same bytes) must not reach the replay either
        ids = {id(e[0]) for e in moved}
        self.geometry = [(t, off, size, stride, dtype, sptr) for t, _, off, size, stride, _, sptr, dtype in self.data
                         if id(t) not in ids]
        # what lives until backward: shared empties, not one new container each (_EMPTY)
        self.slots, self.data, self.starts = (), (), ()
        self.rebound, self.swapped, self.geometry = self.rebound or (), self.swapped or (), self.geometry or ()
        self.plain_keys = self.plain_keys or EMPTY_SET

    @contextlib.contextmanager
    def as_of_forward_start(self) -> Iterator[None]:
        regeometried = moved_views(self.geometry) if self.geometry else []
        if not (self.rebound or self.swapped or regeometried):
            yield
            return
        now_slots = [(m, d, k, _slot_get(m, d, k)) for m, d, k, _ in self.rebound]
        for m, d, k, v in self.rebound:
            _slot_set(m, d, k, v)
        try:
            with views_as_of([*self.swapped, *regeometried]):
                yield
        finally:
            for m, d, k, v in now_slots:
                _slot_set(m, d, k, v)


@contextlib.contextmanager
def _modes_as_of(modes: list[tuple[nn.Module, bool]]) -> Iterator[None]:
    """Set each module's training flag to the recorded one; afterwards put back every flag as it
    was before (also those the replayed forward itself changes)."""
    before = [(m, m.training) for m, _ in modes]
    for m, was in modes:
        if m.training is not was:  # (Module.__setattr__ is slow: set only what differs)
            m.training = was
    try:
        yield
    finally:
        for m, now in before:
            if m.training is not now:
                m.training = now


def hook_records(modules: list[nn.Module]) -> tuple[tuple[dict, ...], dict[int, dict]]:
    """As the forward ends: torch's global forward hook tables and those of each reached module,
    with a copy of the entries of each that has any (by position; the others were empty). A hook
    registered around the forward and removed before backward, or one added after it, would change
    what the replay computes; one the forward registers for good (once, behind a flag) is there
    for the replay too. (Two objects however many tables: they live until backward, and every
    object kept across a step is one more the garbage collector's oldest generation scans.)"""
    tables = (*global_forward_hook_tables(), *(t for m in modules for t in forward_hook_tables(m)))
    return tables, {i: t.copy() for i, t in enumerate(tables) if t}


@contextlib.contextmanager
def hooks_as_of(records: tuple[tuple[dict, ...], dict[int, dict]]) -> Iterator[None]:
    """Run with every recorded hook table holding its recorded entries; afterwards
    each holds what it held before (hooks the replayed forward itself adds or removes included)."""
    tables, copies = records
    changed = [(t, copies.get(i, {})) for i, t in enumerate(tables) if copies.get(i, {}) != t]
    if not changed:
        yield
        return
    now = [(t, t.copy()) for t, _ in changed]
    for t, was in changed:
        t.clear()
        t.update(was)
    try:
        yield
    finally:
        for t, entries in now:
            t.clear()
            t.update(entries)


def note_end_bindings(modules: list[tuple[str, Any]]) -> list[tuple[str, nn.Module, dict, dict]]:
    """After the forward: which tensor each attribute of the reached ``modules`` names and which
    submodule each child name holds (bound again for the replay by :func:`end_bindings_as_of`;
    the watch compares them with the forward's start)."""
    return [(path, m, tensor_slots(m), dict(m._modules)) for path, m in modules]


@contextlib.contextmanager
def end_bindings_as_of(end_bindings: list[tuple[str, nn.Module, dict, dict]]) -> Iterator[None]:
    """During the replay, bind every reached module's parameters, buffers, tensor attributes
    and submodules as they were at the forward's end; put the current ones back afterwards.

    Eager's backward uses the forward's objects, so a rebinding between forward and backward
    (``m.q = m.q * 0.3``, ``m.l2 = nn.Linear(...)``, a cache rebuilt by a second micro-batch's
    forward, a later layer rebinding its own buffer) must not change what the replay reads.
    """
    swaps = []
    for _, m, slots, children in end_bindings:
        now = tensor_slots(m)
        if len(now) == len(slots) and all(now.get(k, _ABSENT) is v for k, v in slots.items()) \
                and len(children) == len(m._modules) and all(m._modules.get(k, _ABSENT) is c for k, c in children.items()):
            continue  # (the common case: nothing rebound since the forward)
        for key in set(slots) | set(now):
            if slots.get(key) is not now.get(key) and not framework_swap(key[0], slots.get(key), now.get(key)):
                table = getattr(m, key[0])  # put back what it holds now, a non-tensor (0.0) too
                swaps.append((table, key[1], key in slots, slots.get(key), key[1] in table, table.get(key[1])))
        for k in set(children) | set(m._modules):
            if children.get(k) is not m._modules.get(k):
                swaps.append((m._modules, k, k in children, children.get(k), k in m._modules, m._modules.get(k)))
    if not swaps:
        yield
        return
    for table, k, had, old, _, _ in swaps:
        put_binding(table, k, had, old)
    try:
        yield
    finally:
        for table, k, _, _, has, new in reversed(swaps):
            put_binding(table, k, has, new)


class ModuleState:
    """The module side of one segment's replay: bindings, views and training flags as of its forward.

    Args:
        declared: the segment's declared state.
        r: what the segment's forward reaches.
        replay_queries: the runtime's ``is_replaying()`` count as the forward begins.
        module_tensors: replay the reached modules' buffer and tensor-attribute rebindings as of
            the forward (``state="auto"``; strict mode refuses them for undeclared modules).
    """

    def __init__(self, declared: Declared, r: Reach, replay_queries: int = 0, module_tensors: bool = False) -> None:
        self._queries = replay_queries  # the runtime's is_replaying() count as the forward began
        #: Python scalars and container-bound tensors the forward reaches (``_plain``); with
        #: ``module_tensors`` (``state="auto"``) the reached modules' tensor slots too
        self.plain = PlainBindings(plain_starts(r, module_tensors))
        declared_mods = {id(m) for _, mod in declared.modules for m in mod.modules()}
        declared_ids = {id(t) for _, t, _ in declared.tensors}
        # a declared tensor held by an undeclared module: its slot is replayed as of the forward's start
        held = [(m, d, k, v) for _, m in r.modules if id(m) not in declared_mods
                for (d, k), v in r.start_slots[id(m)].items() if id(v) in declared_ids] if declared_ids else []
        #: ``(id(module), table, name)`` of those slots (the watch leaves them to the replay)
        self.held_keys = frozenset((id(m), d, k) for m, d, k, _ in held) or EMPTY_SET
        self.declared_modules = frozenset(declared_mods) or EMPTY_SET
        self.bindings = Bindings(declared.modules, [t for _, t, _ in declared.tensors], held, [m for _, m in r.modules],
                                 r.start_slots)
        self.modes = [(m, m.training) for _, m in r.modules]  # reached modules' flags at the forward's start
        self.end_hooks: tuple = ((), {})  # their (and the global) forward hooks as the forward ended
        # views of reached undeclared tensors at the forward's start: a view changed later is not
        # what the replay reads
        self.views = view_records(t for i, (_, t) in r.tensors.items() if i not in declared_ids)
        self.end_bindings: list = []  # reached modules' bindings after the forward
        self._ends: dict[int, dict] = {}  # the same, by id(module)
        #: (bindings, modes, views, plain bindings) of nested segments
        self.adopted: tuple[tuple[Bindings | None, list, list, PlainBindings | None], ...] = ()

    def end_forward(self, modules: list[tuple[str, nn.Module]], replay_queries: int = 0) -> None:
        """After the forward: note the reached ``modules``' bindings (once) and what the forward
        rebound; ``replay_queries``: the runtime's ``is_replaying()`` count now."""
        self.end_bindings = note_end_bindings(modules)
        self.end_hooks = hook_records([m for _, m in modules])
        self._ends = {id(m): slots for _, m, slots, _ in self.end_bindings}
        self.bindings.settle(self._ends)
        self.plain.settle(guarded=replay_queries != self._queries)

    def declare(self, t: torch.Tensor) -> None:
        """``t`` is declared now (promoted before its first write): a later ``set_``/``.data =``
        of it in the forward is undone for the replay, as for tensors declared at the start."""
        self.bindings.add_tensors([t])

    # -- what the watch asks: which bindings the replay puts back itself (it reads nothing else) --
    def declares(self, m: nn.Module) -> bool:
        """True if ``m`` is (inside) a declared module: its bindings are the replay's."""
        return id(m) in self.declared_modules

    def replayed_slots(self, m: nn.Module) -> set[tuple[str, str]]:
        """``(table, name)`` slots of the undeclared module ``m`` that the replay binds itself: those
        holding a declared tensor, and (after the forward) those that held a non-tensor at its start
        and a tensor after (``self.v = 0.0``, then ``self.v = self.v * 0.5 + ...``)."""
        i = id(m)
        return {(d, k) for j, d, k in self.held_keys | self.bindings.plain_keys if j == i}

    def binds_plain(self, slot: tuple[int, Any]) -> bool:
        """True if the replay binds the Python slot ``slot`` (``_plain.slot_id``) as of the forward."""
        return slot in self.plain.keys

    def slots_at_end(self, m: nn.Module) -> dict | None:
        """``m``'s tensor slots as the forward ended (None before the end or if ``m`` was not reached)."""
        return self._ends.get(id(m))

    def adopt(self, inner: "ModuleState") -> None:
        """A nested segment ended: its start bindings, flags and views are replayed by us too."""
        self.adopted = (*self.adopted, (inner.bindings, inner.modes, inner.views, inner.plain))

    @contextlib.contextmanager
    def as_of_forward(self) -> Iterator[None]:
        """Replay with the forward's end bindings and forward hooks, then, for each segment nested in ours and then
        ours (entered last, the earliest start wins): the training flags, the views of reached
        tensors, the declared modules' start bindings and declared tensors' storages and views, and
        the Python bindings (``_plain``) — the nested ones run again in our replay without
        replaying themselves."""
        with end_bindings_as_of(self.end_bindings), hooks_as_of(self.end_hooks), contextlib.ExitStack() as stack:
            for bindings, modes, views, plain in [*self.adopted, (self.bindings, self.modes, self.views, self.plain)]:
                # entered last, our own (the earliest start) win
                if modes:
                    stack.enter_context(_modes_as_of(modes))
                moved = moved_views(views) if views else None
                if moved:
                    stack.enter_context(views_as_of(moved))
                if bindings is not None and (bindings.rebound or bindings.swapped or bindings.geometry):
                    stack.enter_context(bindings.as_of_forward_start())
                if plain is not None and (plain.bound or plain.sets):
                    stack.enter_context(plain.as_of_forward())
            yield
