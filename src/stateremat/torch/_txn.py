"""The replay transaction of one segment: everything a replay puts back, in one order.

Data flows forward → pack → backward → restore → recompute → reinstate. In the forward,
:meth:`Transaction.begin` records the RNG state ``R0``, preserves, per declared storage, ``B0``
through one :class:`~._preserve.Preserver` of the segment's option (``whole`` or ``region``), and
records (:class:`~._bindings.ModuleState`) the modules' bindings, views and training flags, and
autocast; :meth:`Transaction.end_forward` notes the bindings and parameter
versions at the forward's end. At recomputation :meth:`Transaction.replay` is the one room the
frame re-runs the segment in. It refuses, then puts back, in this order:

1. refusals, before anything is put back: under ``state="auto"`` a tensor the forward read and
   code first seen writing it wrote since (R2, ``_learn``); parameter versions: a parameter
   written in place since the forward (R8);
2. module bindings as of the forward's end: every reached module's parameters,
   buffers, tensor attributes, submodules and forward hooks, and torch's global forward hooks (a
   rebinding between forward and backward must not change what the replay reads);
3. training flags, then the views of reached tensors, then the declared modules' bindings and
   the declared tensors' storages and views, and the Python bindings the forward rebound (scalar
   attributes, entries of dicts and plain objects: ``_plain``), as of the forward's start — of
   each segment nested in this one and then of this one (entered last, the earliest start wins); before the bytes,
   since a declared tensor the forward rebound to another storage must be back on its
   forward-start storage when its bytes are restored;
4. declared bytes ``B0`` through the preservers (R2), with the replay's own writes journaled (a
   declared tensor now on another storage, or a journal gap, refused first: R8);
5. RNG ``R0`` (R3), autocast and ``parametrize.cached()`` (its depth and entries) as of the forward.

Nested adoption (:meth:`Transaction.adopt`, when a segment nested in this one ends) feeds both
halves: the inner segment's declared storages join step 4, its flags, views and bindings step 3.
On exit everything is reinstated in reverse: the parametrization cache, autocast and RNG; the replay's writes undone and
the visible bytes and version counters put back exactly (R5); bindings, views and flags as they
were before the replay. The module-side helpers live in ``_bindings``, the Python-binding ones in ``_plain``.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator

import numpy as np
import torch

from . import _learn, _mark, _rng
from ._bindings import ModuleState
from ._compat import DisableTorchFunctionSubclass, autocast_kwargs, has_storage, infer_device_type, library_ops, \
    parametrize_cache_as_of, parametrize_cache_of, parametrize_caching, reset_versions
from ._errors import ReplayError, UnsupportedError
from stateremat.contract import rule
from ._preserve import KEPT_WHOLE, PRESERVERS, Preserver, begin_all, reinstate_all, restore_all
from ._runtime import DeclaredStorage, Runtime, runtime
from ._scan import Declared, Reach, describe, input_tensors, is_input_name
from ._storage import StorageKey, gather, runs_within, scatter, storage_key, write_runs


#: Storages up to this size are kept by a whole snapshot even under ``region``: copying 16 KiB
#: costs less than journaling one write (about a microsecond per clone of a few KiB against tens
#: of microseconds of Python per journaled write, sampled on a ResNet-18 block; the end-to-end
#: effect is printed by ``benchmarks/bench_journal.py``), and a whole snapshot needs no write to be seen, so the
#: statistics a kernel updates without a version bump (batch norm's, run past the write handler
#: by a tensor subclass whose own ``__torch_function__`` takes the call first) and writes through
#: aliases the journal does not see are replayed right instead of refused. Larger storages, where
#: region exists to save memory, are journaled.
SMALL_STORAGE_BYTES = 1 << 14


def _copier(store: weakref.WeakKeyDictionary, handle: Any) -> Callable[[], int]:
    """A copy-on-write callback: replace ``store[handle]`` (a recomputed saved tensor) by its copy; its bytes."""
    ref = weakref.ref(handle)

    def copy() -> int:
        h = ref()
        if h is None or h not in store:
            return 0
        with library_ops():
            store[h] = store[h].clone()
        return store[h].numel() * store[h].element_size()

    return copy


class ReplayLog:
    """Pre-write bytes of writes made during a replay (undone to reinstate, R5).

    Args:
        segment: the replaying segment.
        items: every declared storage of the segment (key -> preserver).
    """

    def __init__(self, segment: Any, items: dict[StorageKey, Preserver]) -> None:
        self.segment = segment
        self.items = items
        self.writes: list[tuple[DeclaredStorage, np.ndarray, torch.Tensor]] = []
        # Recomputed saved tensors that alias a region-journaled storage, not yet copied:
        # (key, copy-and-store callback). Copied lazily, before bytes under them change (R1).
        self.aliases: list[tuple[StorageKey, Callable[[], int]]] = []
        self.alias_bytes = 0  # bytes of saved-tensor aliases copied at pack time (whole items)
        # key -> runs the restore set aside and reinstates after the replay: a replay write
        # inside them needs no undo (the reinstatement overwrites it)
        self.covered: dict[StorageKey, np.ndarray] = {}
        self._ptrs = {key[2] for key in items}  # storage addresses: a cheap first test per saved tensor

    def on_write(self, st: DeclaredStorage, func: Any, args: tuple, kwargs: dict, w: torch.Tensor) -> None:
        """A write to declared storage ``st`` during this replay."""
        p = self.items.get(st.key)
        if p is None:
            self.segment.undeclared_at_replay(w, func, "declared state of another segment")
            return
        if not p.captures_replay_writes:
            return  # the visible bytes set aside cover every byte of the storage
        self.copy_aliases(st.key)
        runs = write_runs(func, args, kwargs, w)
        cover = self.covered.get(st.key)
        if cover is not None and runs_within(runs, cover):
            return
        if runs.shape[0]:
            with library_ops():
                self.writes.append((st, runs, gather(st.flat, runs)))

    def keep_saved(self, x: torch.Tensor, store: Any, handle: Any) -> torch.Tensor:
        """The tensor to store as ``store[handle]`` for a recomputed saved tensor ``x``. One that
        aliases a declared storage must keep the replayed bytes after the reinstatement (R1): of a
        whole-kept storage it is copied now; of a journaled one only before its bytes change (copy
        on write, :meth:`copy_aliases`)."""
        if not self._ptrs or not has_storage(x):
            return x
        with DisableTorchFunctionSubclass():
            p = self.items.get(storage_key(x)) if x.untyped_storage().data_ptr() in self._ptrs else None
        if p is None:
            return x
        if not p.captures_replay_writes:
            with library_ops():
                x = x.clone()  # an alias of whole-preserved state: keep the replayed version
            self.alias_bytes += x.numel() * x.element_size()
        else:
            self.aliases.append((p.storage.key, _copier(store, handle)))
        return x

    def copy_aliases(self, key: StorageKey) -> int:
        """Copy the pending aliases of ``key`` (called before their bytes change); return bytes copied."""
        keep, copied = [], 0
        for k, copy in self.aliases:
            if k == key:
                copied += copy()
            else:
                keep.append((k, copy))
        self.aliases = keep
        return copied


def _autocast_on(device_type: str) -> bool:
    """Is autocast enabled for ``device_type`` (where autocast exists) or the CPU?"""
    return (torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)) \
        or torch.is_autocast_enabled("cpu")


def autocast_of(args: tuple, kwargs: dict) -> tuple:
    """``(device type of the inputs, device autocast kwargs, CPU autocast kwargs)`` now; both
    kwargs None when autocast is off (the replay then makes sure it is off too)."""
    tensors = list(args) if not kwargs and all(type(a) is torch.Tensor for a in args) \
        else input_tensors(args, kwargs)
    device_type = infer_device_type(*tensors)
    return (device_type, *autocast_kwargs(device_type)) if _autocast_on(device_type) else (device_type, None, None)


@contextlib.contextmanager
def autocast_as_of(state: tuple) -> Iterator[None]:
    """Run with autocast as :func:`autocast_of` recorded it."""
    device_type, device_kw, cpu_kw = state
    if device_kw is None and not _autocast_on(device_type):
        yield  # autocast off then and now
        return
    if device_kw is None:
        device_kw = cpu_kw = {"enabled": False}
    device_ac = (torch.amp.autocast(device_type=device_type, **device_kw)
                 if torch.amp.is_autocast_available(device_type) else contextlib.nullcontext())
    with device_ac, torch.amp.autocast("cpu", **cpu_kw):
        yield


def _refuse_undeclarable(name: str, t: torch.Tensor) -> None:
    """Raise UnsupportedError if declared tensor ``t`` cannot be preserved."""
    if t.is_inference():
        raise UnsupportedError(
            f"stateremat.torch.checkpoint: declared state {name!r} is an inference tensor (made under "
            "torch.inference_mode), which has no version counter, so its writes cannot be tracked and "
            "autograd refuses to save it (expected a normal tensor). Tip: make it outside inference mode, "
            "or replace it once with a normal copy (e.g. module.register_buffer(name, t.clone()) outside "
            "torch.inference_mode()).")
    if not has_storage(t):
        raise UnsupportedError(
            f"stateremat.torch.checkpoint: declared state {name!r} must be a dense strided "
            f"tensor with storage, got {type(t).__name__} layout={t.layout}, device={t.device}. "
            "Tip: declare the dense buffers that hold the state."
        )


def _refuse_moved(items: dict[StorageKey, Preserver], segment_name: str) -> None:
    """Raise ReplayError if a declared tensor now uses another storage than its preserver's (R8)."""
    with DisableTorchFunctionSubclass():
        moved = [(p.storage.names.get(i, "a declared tensor"), p) for p in items.values()
                 for i, w in p.storage.witnesses.items() if has_storage(w) and storage_key(w) != p.storage.key]
    if moved:
        raise ReplayError(
            f"stateremat.torch.checkpoint: cannot replay segment {segment_name!r}: declared state "
            f"{moved[0][0]!r} now uses another storage (set_ or .data = after the segment's forward), so "
            f"restoring its bytes would not restore what the replay reads (expected the storage the "
            f"forward used; {rule('R8')}). Tip: write new values in place (t.copy_(new)) instead of "
            "rebinding the tensor's storage between forward and backward.")


def _witness(st: DeclaredStorage, t: torch.Tensor, name: str) -> None:
    """``t`` (declared as ``name``) watches ``st``'s version (R8), marked so that its writes reach
    the journal from now on; a tensor that cannot be marked makes every op watched (StrictMode)."""
    if st.add_witness(t, name) and not _mark.mark_tensor(t, st):
        st.unmarkable = True


def refuse_changed_parameters(param_versions: list[tuple[Any, torch.Tensor, int]], segment_name: str) -> None:
    """Refuse a replay whose parameters (``(name, tensor, version at the forward's end)``) changed
    in place since the forward (R8).

    Raises:
        ReplayError: naming them; eager autograd refuses this too ("modified by an inplace
            operation") when it saved the parameter.
    """
    with DisableTorchFunctionSubclass():
        changed = [describe(n) for n, t, v in param_versions if t._version != v]
    if changed:
        raise ReplayError(
            f"stateremat.torch.checkpoint: cannot replay segment {segment_name!r}: {', '.join(changed)} "
            "changed in place between its forward and this backward (an optimizer step before "
            f"backward?), so the replay would differentiate other weights (expected them unchanged; "
            f"{rule('R8')}). Tip: run backward before the optimizer step, or declare them as state.")


class Transaction:
    """Declared state of one segment and everything its replay puts back (the module docstring's order).

    Args:
        rt: the runtime the segment runs in.
        declared: the segment's declared state (``tensors``: ``(name, tensor, group)`` triples,
            the group naming the declaring module; ``generators``; ``modules``).
        preserve: an option name with a preserver (``"whole"`` or ``"region"``).
        granularity_bytes: region journal chunk size in bytes.
        auto: ``state="auto"`` (``_learn``): promotions use the segment's preserver, reached
            modules' tensor rebindings replay as of the forward.
    """

    def __init__(self, rt: Runtime, declared: Declared, preserve: str, granularity_bytes: int | None,
                 auto: bool = False) -> None:
        self.runtime = rt
        self.segment_id = id(self)  # the journal's consumer id: unique while the preservers live
        self.preserve = preserve
        self.granularity_bytes = granularity_bytes
        self.items: dict[StorageKey, Preserver] = {}
        #: option name -> bytes kept for this segment's own forward writes (the region journal)
        self.written: dict[str, int] = {}
        self.declared = declared
        self._released = False
        #: storages a kernel writes without a version bump (running statistics of normalization
        #: layers in training, or a buffer they are views of), and those layers' batch counters:
        #: kept by a whole snapshot even under ``region``, since a journal relies on seeing every
        #: write (a tensor subclass whose own ``__torch_function__`` runs the norm hides it) and the
        #: kernel rewrites all their bytes. (Storages of at most SMALL_STORAGE_BYTES are kept whole
        #: in ``begin`` whatever their keys.)
        self.whole_keys: set[StorageKey] = set()
        self.rng: _rng.RngState | None = None
        self.modules: ModuleState | None = None
        self.autocast: tuple = ()
        self.param_cache: tuple[int, dict] = (0, {})
        self.param_versions: list[tuple[Any, torch.Tensor, int]] = []
        #: ``(name, tensor)`` reached, undeclared as the forward begins (parameters among them: R8)
        self._reached: list[tuple[Any, torch.Tensor]] = []
        self._promoted: set[int] = set()
        self.auto = auto  # state="auto": reached modules' tensor rebindings are replayed, not refused

    # -- forward -------------------------------------------------------------------------
    def begin(self, r: Reach, args: tuple, kwargs: dict, preserve_rng_state: bool) -> None:
        """As the forward begins: record ``R0``, preserve ``B0`` of every declared storage, record
        the modules' bindings, views and flags (what ``r`` reaches) and autocast.

        Raises:
            UnsupportedError: a declared tensor has no dense strided storage.
        """
        self._cuda_before = _rng.cuda_ready()
        gens = {id(g): g for _, g in self.declared.generators}
        gens.update({id(g): g for _, g in r.generators.values()})
        self.rng = _rng.capture(gens.values()) if preserve_rng_state else None
        with DisableTorchFunctionSubclass():
            norm_buffers = [t for _, t in r.norm_stats.values()] + r.norm_counters
            self.whole_keys = {storage_key(t) for t in norm_buffers if has_storage(t)}
        declared_ids = {id(t) for _, t, _ in self.declared.tensors}
        self._reached = [(n, t) for n, t in r.tensors.values() if id(t) not in declared_ids]
        try:
            self._preserve_bytes()
            self.modules = ModuleState(self.declared, r, self.runtime.replay_queries, self.auto)
            self.autocast = autocast_of(args, kwargs)
            self.param_cache = parametrize_cache_of()
        except BaseException:
            self.release()  # no frame owns us yet
            raise

    def _preserve_bytes(self) -> None:
        by_key: dict[StorageKey, list[tuple[str, torch.Tensor]]] = {}
        for name, t, _group in self.declared.tensors:
            _refuse_undeclarable(name, t)
            with DisableTorchFunctionSubclass():
                by_key.setdefault(storage_key(t), []).append((name, t))
        cls = PRESERVERS[self.preserve]
        with library_ops():  # once for every storage's snapshot
            for key, members in by_key.items():
                st = self.runtime.acquire(key, members[0][1])
                for name, t in members:  # every declared tensor on the storage watches its version (R8)
                    _witness(st, t, name)
                whole = key in self.whole_keys or st.nbytes <= SMALL_STORAGE_BYTES
                self._add(key, st, [n for n, _ in members], KEPT_WHOLE if whole else cls, begin=False)
            begin_all(list(self.items.values()))  # small whole snapshots in one copy

    def _add(self, key: StorageKey, st: DeclaredStorage, names: list[str], cls: type[Preserver],
             begin: bool = True) -> Preserver:
        p = cls(st, self.segment_id, self.granularity_bytes)
        p.names = names
        if begin:
            p.begin()
        self.items[key] = p
        return p

    def promote(self, name: str, t: torch.Tensor) -> None:
        """Declare ``t`` now, before its first write: with a whole snapshot (``on_undeclared="declare"``),
        or under ``state="auto"`` with the segment's preserver as :meth:`begin` would choose it (the
        write about to happen is then journaled by the caller, ``_mode.StrictMode``)."""
        key = storage_key(t)
        st = self.runtime.acquire(key, t)
        _witness(st, t, name)
        whole = not self.auto or key in self.whole_keys or st.nbytes <= SMALL_STORAGE_BYTES
        self._add(key, st, [name], KEPT_WHOLE if whole else PRESERVERS[self.preserve])
        self.modules.declare(t)
        self._promoted.add(id(t))

    def credit(self, option: str, n: int) -> None:
        """``option``'s preserver kept ``n`` bytes for a write this segment's forward made."""
        self.written[option] = self.written.get(option, 0) + n

    def end_forward(self, modules: list[tuple[str, Any]]) -> None:
        """After the forward: note the reached ``modules``' bindings and the reached, undeclared parameters' versions (R8)."""
        self.modules.end_forward(modules, self.runtime.replay_queries)
        with DisableTorchFunctionSubclass():
            self.param_versions = [(n, t, t._version) for n, t in self._reached
                                   if id(t) not in self._promoted and t.requires_grad and t.is_leaf]

    def refuse_cuda_started(self, name: str) -> None:
        """After the forward: refuse (releasing) if CUDA was first initialized inside it, so the
        CUDA generators' ``R0`` is unknown (R3); nothing to refuse without ``preserve_rng_state``.

        Raises:
            ReplayError: CUDA was initialized inside segment ``name``.
        """
        if self.rng is None or self._cuda_before or not _rng.cuda_ready():
            return
        self.release()
        raise ReplayError(
            f"stateremat.torch.checkpoint: CUDA was initialized inside segment {name!r}, so its "
            f"generator state at the forward's start is unknown ({rule('R3')}). Tip: initialize CUDA "
            "before the first checkpoint (e.g. torch.cuda.init())."
        )

    def adopt(self, inner: "Transaction") -> None:
        """A nested segment this one encloses ended: take over both halves of what its replay puts
        back (its ``B0`` is ours too): its declared storages, and its bindings, views and flags."""
        for key, p in inner.items.items():
            if key in self.items:
                continue
            p.storage.users += 1
            self.items[key] = p.adopt(self.segment_id)
        self.modules.adopt(inner.modules)

    # -- what the frame and the watch ask (they read no preserver or binding record themselves) --
    def holds_input(self, x: torch.Tensor, what: str) -> bool:
        """True if the transaction restores every byte of input ``x`` (a tensor on a declared
        storage): ``x`` is then held as is and watched as one of the storage's witnesses, since a
        write through it outside the journal changes its version counter: a gap (R8). Other inputs
        keep torch's saved-tensor version check (a later in-place write raises at backward)."""
        if not self.items or not has_storage(x):
            return False
        with DisableTorchFunctionSubclass():
            p = self.items.get(storage_key(x))
        if p is None:
            return False
        p.storage.add_witness(x, what)
        return True

    def declares_as_state(self, t: torch.Tensor) -> bool:
        """True if ``t``'s storage is declared under a name that is no segment input's (state the
        segment reaches, e.g. in a dict it holds, that is also passed to it)."""
        with DisableTorchFunctionSubclass():
            p = self.items.get(storage_key(t)) if has_storage(t) else None
        return p is not None and any(not is_input_name(n) for n in p.names)

    def preserver(self, key: StorageKey) -> Preserver | None:
        """The preserver of the declared storage ``key`` (None if it is not declared)."""
        return self.items.get(key)

    def mark_aliases(self, tensors: list[torch.Tensor]) -> None:
        """Mark those of ``tensors`` (reached by the segment) that live on a declared storage (the
        base of a declared view, say): their writes reach the journal too (or every op is watched)."""
        if not self.items:
            return
        with DisableTorchFunctionSubclass():
            hits = [(p.storage, t) for t in tensors if (p := self.items.get(storage_key(t))) is not None]
        for st, t in hits:
            if not _mark.mark_tensor(t, st):
                st.unmarkable = True

    def storages(self) -> dict[StorageKey, DeclaredStorage]:
        """Each declared storage by key, adopted ones included."""
        return {k: p.storage for k, p in self.items.items()}

    def owned_keys(self) -> set[StorageKey]:
        """Keys of the storages whose preservers this segment owns (its own writes to them are expected)."""
        return {k for k, p in self.items.items() if p.owned}

    def witness_ids(self) -> set[int]:
        """``id`` of every declared tensor (each storage's witnesses), adopted ones included."""
        return {id(w) for p in self.items.values() for w in p.storage.witnesses.values()}

    def has_unmarkable(self) -> bool:
        """True if a journaled storage's tensors cannot be marked (every op must be watched)."""
        return any(p.storage.unmarkable for p in self.items.values())

    def retained(self) -> dict[str, int]:
        """Bytes this segment keeps for its replay, by option name: what its preservers own
        (whole snapshots) plus what was kept for its forward's writes (journal entries)."""
        out = dict(self.written)
        for p in self.items.values():
            if p.retained_bytes:
                out[p.name] = out.get(p.name, 0) + p.retained_bytes
        return out

    def release(self) -> None:
        """Free snapshots and stop consuming journals (the segment can no longer replay)."""
        if self._released:
            return
        self._released = True
        for p in self.items.values():
            p.release()
            p.storage.rt.release(p.storage)
        self.items.clear()
        self.param_cache = (0, {})  # the cached parametrized tensors: no replay will read them

    # -- recomputation -------------------------------------------------------------------
    def replay(self, segment: Any) -> contextlib.AbstractContextManager[ReplayLog]:
        """The room a replay runs in: refuse now (step 1 of the module docstring's order), then,
        entered, put back steps 2–5 in that order; reinstate on exit (R2, R3, R5).

        Args:
            segment: the replaying segment's frame (``name``, ``watch``; ``undeclared_at_replay``).

        Raises:
            ReplayError: a read tensor written since by code first seen writing it (R2, auto), a
                parameter changed in place since the forward, a declared tensor on another storage
                or a region journal with a gap since the segment's forward (R8).
        """
        if self.auto:  # state the forward read that code first seen writing it wrote since (R2)
            _learn.refuse_changed_reads(self.runtime, segment.watch, segment.name)
        refuse_changed_parameters(self.param_versions, segment.name)
        return self._replay(segment)

    @contextlib.contextmanager
    def _replay(self, segment: Any) -> Iterator[ReplayLog]:
        with contextlib.ExitStack() as rooms:  # (steps 2-5 in order; a room with nothing to put back is not entered)
            rooms.enter_context(self.modules.as_of_forward())
            log = rooms.enter_context(_bytes_as_of_forward(self.items, segment, self.runtime.counters))
            if self.rng is not None:
                rooms.enter_context(_rng.replayed(self.rng))
            if self.autocast[1] is not None or _autocast_on(self.autocast[0]):
                rooms.enter_context(autocast_as_of(self.autocast))
            if self.param_cache[0] or parametrize_caching():
                rooms.enter_context(parametrize_cache_as_of(self.param_cache))
            yield log


@contextlib.contextmanager
def _bytes_as_of_forward(items: dict[StorageKey, Preserver], segment: Any, c: Any) -> Iterator[ReplayLog]:
    """Step 4 of the replay: restore ``B0`` of every declared storage (``items``: its preservers),
    yield for the re-run, then reinstate (R2, R5); the peak temporary bytes go to counters ``c``."""
    rt_exec = runtime()
    log = ReplayLog(segment, dict(items))
    if not items:
        rt_exec.replay.append(log)
        try:
            yield log
        finally:
            rt_exec.replay.pop()
        return
    witnesses = {id(w): w for p in items.values() for w in p.storage.witnesses.values()}
    _refuse_moved(items, segment.name)
    for p in items.values():  # an unseen change before this replay is a gap for other
        p.storage.observe(journaled=False)  # consumers; the replay's own writes are synced after
    restored = restore_all(items.values(), segment.name)  # small whole ones batched
    for p, r in restored:
        log.covered[p.storage.key] = r.runs
    versions = [(w, w._version) for w in witnesses.values()]
    temp = sum(r.visible.numel() for _, r in restored)
    rt_exec.replay.append(log)
    try:
        yield log
    finally:
        rt_exec.replay.pop()
        changing = {p.storage.key for p, _ in restored} | {st.key for st, _, _ in log.writes}
        for key in changing:
            temp += log.copy_aliases(key)
        log.aliases.clear()  # the rest alias bytes that reinstatement leaves unchanged
        temp += sum(d.numel() for _, _, d in log.writes) + log.alias_bytes
        c.peak_temporary = max(c.peak_temporary, temp)
        with library_ops():
            for st, runs, old in reversed(log.writes):  # back to B0 ...
                scatter(st.flat, runs, old)
            reinstate_all(restored)  # ... then to the visible bytes
        if versions:
            reset_versions(tuple(w for w, _ in versions), tuple(v for _, v in versions))
        for p in items.values():
            p.storage.observe(journaled=True)
