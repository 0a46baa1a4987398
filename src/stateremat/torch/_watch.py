"""The watch of one segment: what it reaches, and whether it wrote or rebound what it did not declare (R7).

In data-flow order:

- forward: :class:`Watch` records, before the forward runs, every pre-existing tensor the segment
  reaches and does not declare (the *scan*: name, tensor, version), their data pointers,
  fingerprints and (running statistics) bytes, and the reached modules' tensor bindings; it
  marks reached aliases of declared storages and refuses state an inner segment declares too
  late (:meth:`Watch.check_inner_declaration`). While the forward runs, :meth:`Watch.check_write`
  sees each write to a reached storage at dispatch (raise, or promote it on
  ``on_undeclared="declare"``); at the forward's end :meth:`Watch.end_forward` compares versions,
  bytes, pointers and bindings and reports every undeclared write in one message
  (:meth:`Watch.report_undeclared`, :func:`undeclared_message`). The byte checks
  (:class:`ByteChecks`: running statistics a kernel writes without a version bump, storage
  pointers, fingerprints) are read at once on the host; on a device their verdicts are computed
  there and read when ready (:class:`Deferred`, at the latest just before the replay), so a
  forward never waits for its stream (issue 26);
  the iterators and generators it reaches are watched around the forward's function
  (:class:`~._iterators.IteratorWatch`): strict mode refuses a forward that advanced one, and
  ``state="auto"`` makes that forward keep its activations (``_learn.end``);
- recompute: a write the replay makes to undeclared state is refused before it happens
  (:meth:`Watch.undeclared_at_replay`), or seen afterwards by the version counters
  (:meth:`Watch.report_replay_writes`), which also refuses a replay that advanced a reached
  iterator its forward did not.

The watch keeps no state it would put back: that is the transaction's (``_txn``).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np
import torch

from stateremat.contract import rule

from ._bindings import ModuleState
from ._compat import DisableTorchFunctionSubclass, library_ops
from ._framework import framework_swap
from ._iterators import IteratorWatch, advanced_message
from ._errors import UndeclaredStateError, UnsupportedError
from ._mode import StrictMode, strict_forward, warn_undeclared
from ._plain import EMPTY_SET, slot_id
from ._pystate import cache_fingerprint, cache_message, python_state_arguments
from ._runtime import Runtime
from ._scan import Declared, Reach, describe, is_input_name, is_list_entry, reachable, rebound, tensor_slots, weak_kind
from ._storage import fingerprint, fingerprint_changed, host_readable, storage_key
from ._txn import Transaction

_NULL = contextlib.nullcontext  # the frame's recompute context when no context_fn was given


#: Largest reachable 1-D tensor compared byte for byte around the forward (running statistics).
_PROBE_MAX_NUMEL = 1 << 16


def _stat_like(t: torch.Tensor) -> bool:
    """Could ``t`` be running statistics a batch-norm kernel updates without a version bump?"""
    return t.dim() == 1 and not t.requires_grad and t.is_floating_point() and t.numel() <= _PROBE_MAX_NUMEL


def _written_inputs(written: Any) -> list[str]:
    """Names of written tensors that are inputs of the segment: the replay needs them as they were
    at the forward, and autograd refuses a saved input written in place ('modified by an inplace
    operation'), so declaring them with on_undeclared='declare' cannot help."""
    return [describe(n) for n, _ in written if isinstance(n, str) and is_input_name(n)]


def proxy_message(seg: Any, name: str, func: Any) -> str:
    """The ``UndeclaredStateError`` text for a write through a ``weakref.proxy`` of a tensor, which
    ``state="auto"`` cannot preserve (the proxy is no tensor, and its referent cannot be had from it)."""
    return (f"stateremat.torch.checkpoint: segment {seg.name!r} wrote in place to {name} by {func} (not "
            "applied), which existed before the segment and is reached only through a weakref.proxy: the "
            "default preserves the tensors a segment writes, and a proxy is no tensor it can preserve "
            "(expected a tensor, got a weakref.ProxyType); replay would repeat this write "
            f"({rule('R7')}). Tip: hold the tensor itself or a weakref.ref to it (ref() is the tensor), or "
            "declare the tensor, e.g. checkpoint(fn, ..., state=[tensor]).")


def undeclared_message(seg: Any, names: str, when: str, reachable: bool = True, written: Any = ()) -> str:
    """The ``UndeclaredStateError`` text; ``written``: ``(scan name, tensor)`` of the written tensors
    (a write to an input that autograd tracks gets the out-of-place tip instead of declaring)."""
    inputs = _written_inputs(written)
    parts = names.split(", ")
    rebinds = [p.endswith("(rebound to another tensor)") for p in parts]
    verb = "rebound" if all(rebinds) else "wrote in place to or rebound" if any(rebinds) else "wrote in place to"
    head = (f"stateremat.torch.checkpoint: segment {seg.name!r} {verb} {names}, which existed "
            f"before the segment and is not declared state (expected only declared tensors to be "
            f"mutated, got a write {when}); replay would repeat this write ({rule('R7')}).")
    if inputs:
        rest = [n for n in names.split(", ") if n not in inputs]
        return (f"{head} Tip: {', '.join(inputs)} {'is an input' if len(inputs) == 1 else 'are inputs'} of the "
                "segment (e.g. the activation of the layer before it): make the op that writes it out-of-place, "
                "e.g. nn.ReLU(inplace=False) as the segment's first layer, or x = x * 0.5 instead of "
                "x.mul_(0.5); on_undeclared='declare' cannot help (autograd refuses the saved input written in "
                "place: 'modified by an inplace operation', as under torch.utils.checkpoint)"
                + (f"; declare the other tensors ({', '.join(rest)})." if rest else "."))
    alt = ", or pass on_undeclared='declare'" if reachable else (
        " (on_undeclared='declare' cannot help: the forward's scan does not reach this tensor; "
        "pass it as an argument, register it as a buffer, or declare it)")
    return (
        f"{head} Tip: "
        + ("leave state= at its default (state='auto' finds and preserves what the segment writes), or "
           if reachable else "")
        + "declare it, e.g. checkpoint(fn, ..., state=[tensor_or_module]) or "
        f"StatefulCheckpoint(block, state='buffers'){alt}"
        + ("; a module or state='buffers' declares its buffers, not a plain tensor attribute: "
           "list that tensor itself (state=[module, module.attr])." if "tensor attribute" in names else ".")
    )


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool | torch.Tensor:
    """Bitwise equality (NaN == NaN, -0.0 != 0.0); on the device path (``a`` not
    :func:`host_readable`) a 0-dim bool tensor on the device, to be read later."""
    if a.shape != b.shape or a.device != b.device:
        return False
    a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    return torch.equal(a, b) if host_readable(a) else (a == b).all()


class Deferred:
    """Device-side verdicts of the watch's byte checks, read on the host once they are computed.

    The verdicts (one 0-dim bool tensor per name: "this tensor's bytes changed") are stacked and
    copied to pinned host memory without waiting (an event marks the copy's end); :meth:`names`
    reads them, waiting for that event only if the device has not reached it yet. The watch reads
    them after the forward when they are ready, else just before the replay (before anything is
    restored), so a forward never waits for its stream (issue 26).
    """

    def __init__(self, items: list[tuple[str, str, torch.Tensor]]) -> None:
        by_device: dict[torch.device, list] = {}
        for item in items:
            by_device.setdefault(item[2].device, []).append(item)
        self.groups = [self._send(group) for group in by_device.values()]  # (items, array, host, event)

    @staticmethod
    def _send(items: list) -> tuple:
        with torch.no_grad(), DisableTorchFunctionSubclass():
            v = torch.stack([f.reshape(()).to(torch.bool) for _, _, f in items])
            event = None
            if v.device.type == "cuda":
                with torch.cuda.device(v.device):
                    host = torch.empty(v.shape, dtype=torch.bool, pin_memory=True)
                    array = host.numpy()  # (a view of pinned host memory: no device read)
                    host.copy_(v, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record()
            else:
                array = np.zeros(v.shape, dtype=bool)
                host = torch.from_numpy(array)
                host.copy_(v)  # (no stream to wait for)
        return [(n, why) for n, why, _ in items], array, host, event

    def ready(self) -> bool:
        return all(event is None or event.query() for _, _, _, event in self.groups)

    def names(self, found: dict[str, str]) -> list[str]:
        """Add the changed ones to ``found`` (name -> why; the first reason kept); return ``found``'s names."""
        for items, array, _, event in self.groups:
            if event is not None:
                event.synchronize()
            for (n, why), changed in zip(items, array.tolist()):
                if changed:
                    found.setdefault(n, why)
        return list(found)


class ByteChecks:
    """The watch's checks of writes no version counter of a reached tensor sees (R7): bytes of
    running statistics a kernel writes without a version bump (``probes``: id -> (name, tensor),
    compared with a copy), storage pointers (``.data = ...``, ``set_``) and fingerprints (writes
    through ``.data`` or another alias), taken when the forward begins (``scan``: the watch's
    ``(name, tensor, version)`` records)."""

    def __init__(self, scan: list, probes: dict) -> None:
        self.ptrs = [(n, t, t.data_ptr()) for n, t, _ in scan]
        with library_ops():  # (an enclosing watched forward must not take these reads for its own)
            self.fingerprints = [(n, t, fingerprint(t)) for n, t, _ in scan  # (not a list's log entries)
                                 if not t.requires_grad and id(t) not in probes and t.numel() and not is_list_entry(n)]
        self.norm_probes: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
        if probes:
            with library_ops():
                self.norm_probes = [(n, t, t.clone()) for n, t in probes.values()]

    def drop(self, t: torch.Tensor) -> None:
        """``t`` is declared now (promoted): its bytes and rebinding are the transaction's."""
        self.ptrs = [s for s in self.ptrs if s[1] is not t]
        self.fingerprints = [s for s in self.fingerprints if s[1] is not t]
        self.norm_probes = [s for s in self.norm_probes if s[1] is not t]

    def rebase(self, keys: set) -> None:
        """Tensors on storages ``keys`` (an inner segment's, adopted) are compared from now on."""
        with library_ops():
            self.norm_probes = [(n, t, t.clone() if storage_key(t) in keys else before)
                                for n, t, before in self.norm_probes]
            self.fingerprints = [(n, t, fingerprint(t) if storage_key(t) in keys else fp)
                                 for n, t, fp in self.fingerprints]
        self.ptrs = [(n, t, t.data_ptr() if storage_key(t) in keys else ptr) for n, t, ptr in self.ptrs]

    def changed(self, skip: set[int], own: set, found: dict[str, str], checks: list) -> None:
        """Changes read on the host go to ``found`` (name -> why); device-side verdicts to ``checks``
        as ``(name, why, 0-dim bool)``; tensors with ids in ``skip`` or on storages in ``own`` are not checked."""
        if self.norm_probes:
            with library_ops():
                for n, t, before in self.norm_probes:
                    if id(t) in skip or storage_key(t) in own:
                        continue
                    same = _same_bytes(t, before)
                    if isinstance(same, torch.Tensor):
                        checks.append((describe(n), "bytes (a kernel that bumps no version)", ~same))
                    elif not same:
                        found.setdefault(describe(n), "bytes (a kernel that bumps no version)")
        for n, t, ptr in self.ptrs:
            if t.data_ptr() != ptr and id(t) not in skip:
                found.setdefault(describe(n), "storage rebound (.data = / set_)")
        for n, t, fp in self.fingerprints:
            if id(t) in skip or describe(n) in found or storage_key(t) in own:
                continue
            with library_ops():
                changed = fingerprint_changed(t, fp)
            if isinstance(changed, torch.Tensor):
                checks.append((describe(n), "bytes (written through .data or another alias)", changed))
            elif changed:
                found.setdefault(describe(n), "bytes (written through .data or another alias)")


def read_or_defer(names: list[str], deferred: list, wait: bool = False) -> tuple[list[str], Deferred | None]:
    """After the forward: ``(names, pending)``: ``names`` found on the host plus the device-side
    verdicts ``deferred`` when they are ready (a CPU's always are), or when ``names`` is not empty
    (a report is made now and names every tensor, so it waits: only on the error path), or with
    ``wait`` (``state="auto"`` decides now whether this forward keeps its activations: issue 26,
    not yet deferred); else the verdicts are returned as ``pending``, read before the replay
    (:meth:`Watch.versions`)."""
    if not deferred:
        return names, None
    d = Deferred(deferred)
    if wait or names or d.ready():
        return d.names(dict.fromkeys(names, "")), None
    return names, d


class Watch:
    """What one segment reaches and whether it wrote or rebound what it did not declare (R7).

    Args:
        rt: the runtime of the thread running the forward.
        fn: the segment function (the replay names tensors from it).
        name: segment name for messages.
        txn: the segment's transaction, begun (its declared storages are not watched).
        r: what the forward reaches.
        args, kwargs: the forward's arguments (Python-state caches among them are refused if updated).
        on_undeclared: ``"raise"``, ``"warn"``, ``"declare"`` (written tensors in :attr:`promoted`)
            or ``"learn"`` (``state="auto"``, ``_learn``: those found at the end in :attr:`gaps`).
        verify: watch every op of the forward and the replay.
    """

    def __init__(self, rt: Runtime, fn: Callable, name: str, txn: Transaction, r: Reach, args: tuple,
                 kwargs: dict, *, on_undeclared: str, verify: bool) -> None:
        self.rt = rt
        self.fn = fn
        self.name = name
        self.txn = txn
        self.on_undeclared = on_undeclared
        self._candidates: dict | None = None
        self.promoted: list[torch.Tensor] = []
        self._promoted_scan: list = []  # their scan records
        self.gaps: list[torch.Tensor] = []
        self.restructured, self.reshaped = (), None  # hooks/structure it changed; strict: check (_structure)
        #: storage keys a watched ``state="auto"`` forward passed to an op (set at its end by
        #: ``_learn.end``; None: not watched), read by ``_learn.refuse_changed_reads``
        self.touched: frozenset | None = None
        self._hook_only = r.hook_only  # a hook's own tensors: refused only if the replay writes them again
        self._pending: Deferred | None = None  # device-side byte checks of the forward, read before the replay
        self._scan_reached(r, txn.declared, txn.modules)
        self.iters = IteratorWatch(r.iterators)  # iterators and generators a run may advance
        self._mark_reachable_aliases()
        for enclosing in rt.forward:
            enclosing.check_inner_declaration(self)
        caches = python_state_arguments(args, kwargs)  # a KV cache the forward updates cannot be replayed
        self._caches = [(where, c, cache_fingerprint(c)) for where, c in caches]
        #: the forward runs under StrictMode (every op watched); so does the replay
        self.strict = on_undeclared == "declare" or verify or txn.has_unmarkable()

    def _scan_reached(self, r: Reach, declared: Declared, mods: ModuleState) -> None:
        declared_ids = {id(t) for _, t, _ in declared.tensors}
        with DisableTorchFunctionSubclass():
            self.scan = [(n, t, t._version) for n, t in r.tensors.values() if id(t) not in declared_ids]
            self.expected = {id(t): v for _, t, v in self.scan}  # version each should have now (adoptions move it)
            probes = {i: v for i, v in r.norm_stats.items() if i not in declared_ids}
            probes.update({i: (n, t) for i, (n, t) in r.tensors.items() if i not in declared_ids and _stat_like(t)})
            self.bytes = ByteChecks(self.scan, probes)
            #: tensor bindings of reached undeclared modules (those the replay binds itself are
            #: asked of the transaction's module state when checked)
            self.slots = [(path, m, r.start_slots[id(m)]) for path, m in r.modules if not mods.declares(m)]
            self.plain_slots = r.slots  # tensors bound outside modules: a rebinding is refused

    def _mark_reachable_aliases(self) -> None:
        """Reachable tensors on a declared storage (the base of a declared view) are marked too."""
        self.txn.mark_aliases([t for _, t, _ in self.scan])

    # -- forward -------------------------------------------------------------------------
    @contextlib.contextmanager
    def observing(self) -> Iterator[None]:
        """The forward and its end checks run with this watch on the thread's forward stack."""
        self.rt.forward.append(self)
        try:
            yield
        finally:
            self.rt.forward.pop()

    @contextlib.contextmanager
    def forward_mode(self) -> Iterator[None]:
        """Around the forward's function: every op watched when :attr:`strict` (once per thread), and
        the iterators it reaches."""
        if not self.strict or self.rt.strict_depth:
            with self.iters.forward():
                yield
            return
        with strict_forward(self.rt), self.iters.forward():
            yield

    def replay_mode(self, segment: Any) -> contextlib.AbstractContextManager:
        """Around the replay (``segment``: the frame): every op watched when the forward's were, and under
        ``state="auto"`` unless a ``context_fn``'s modes (selective checkpointing's cache) must be innermost."""
        strict = self.strict or (self.on_undeclared == "learn" and type(segment.recompute_context) is _NULL)
        inner = StrictMode(self.rt, "replay", segment) if strict else contextlib.nullcontext()
        return self.iters.replay(inner if self.reshaped is None else self.reshaped.around_replay(self.name, inner))

    def end_forward(self) -> None:
        """After the forward (the transaction's end noted): refuse an updated Python-state cache,
        then report every undeclared write of the forward in one message."""
        caches, self._caches = self._caches, []
        for where, cache, before in caches:
            if cache_fingerprint(cache) != before:
                raise UnsupportedError(cache_message("stateremat.torch.checkpoint", self.name, where, cache, "updated"))
        _refuse_advanced(self)
        deferred: list = []
        names = self.undeclared_writes(skip=self._hook_only, deferred=deferred)
        names, self._pending = read_or_defer(names, deferred, wait=self.txn.auto)
        self.report_undeclared(names, "after the forward")
        _shared_empties(self, ("promoted", "_promoted_scan", "gaps", "_hook_only", "plain_slots", "_caches"))
        _shared_empties(self.bytes, ("fingerprints", "norm_probes"))

    @property
    def candidates(self) -> dict:
        """Storage key -> (name, tensor) of reachable undeclared tensors (computed on first use)."""
        if self._candidates is None:
            with DisableTorchFunctionSubclass():
                self._candidates = {}
                for n, t, _ in self.scan:
                    self._candidates.setdefault(storage_key(t), (n, t))
        return self._candidates

    def check_write(self, key: Any, func: Any) -> None:
        """Called before ``func`` writes storage ``key`` in this segment's forward (R7)."""
        entry = self.candidates.get(key)
        if entry is None:
            return
        name, t = describe(entry[0]), entry[1]
        # state="auto" never declares the segment's own input: the replay needs it as it was and
        # autograd refuses a saved input written in place (the error's tip says what to do)
        if self.on_undeclared == "raise" or (self.txn.auto and _written_inputs([(entry[0], t)])):
            raise UndeclaredStateError(undeclared_message(self, name, f"by {func} (not applied)",
                                                          written=[(entry[0], t)]))
        if self.on_undeclared == "declare" and weak_kind(t) == "proxy":
            raise UndeclaredStateError(proxy_message(self, name, func))
        if self.on_undeclared == "declare":
            self.txn.promote(name, t)
            self.promoted.append(t)
            self.candidates.pop(key, None)
            self._promoted_scan += [s for s in self.scan if s[1] is t]  # (a set_ of it is still seen at the end)
            self.scan = [s for s in self.scan if s[1] is not t]
            self.bytes.drop(t)  # declared now: its rebinding (set_) and bytes are the transaction's

    def unreached_write(self, w: torch.Tensor) -> None:
        """A watched forward writes ``w``, which existed before it but no scan reached (a ``__slots__``
        object, a deque, nesting past the scan's depth). Under ``state="auto"`` this forward keeps
        its activations (a gap), and from now on auto replays run on past the early-stop point
        (``Frame.run_on``), so such a write at a replay is refused, naming it (R7)."""
        if self.txn.auto:
            self.gaps.append(w)
            self.rt.unreached_writes = True

    def undeclared_at_replay(self, w: torch.Tensor, func: Any, what: str,
                             inputs: Callable[[], tuple[tuple, dict]]) -> None:
        """Called before ``func`` writes pre-existing undeclared state during the replay (R7);
        ``inputs``: the frame's saved inputs (the scan names ``w`` from them)."""
        raw = self._raw_name_of(w, inputs)
        name = describe(raw) if raw is not None else \
            f"a tensor of shape {tuple(w.shape)} {w.dtype} the scan cannot name"
        written = [(raw, w)] if raw is not None else []
        if self.on_undeclared == "warn":
            warn_undeclared(undeclared_message(self, name, f"at recomputation by {func} "
                                               "(applied a second time)", written=written))
            return
        raise UndeclaredStateError(undeclared_message(
            self, name, f"at recomputation by {func} to {what} (not applied; the forward already made "
            "this write once, the replay would make it twice)", reachable=raw is not None, written=written))

    def undeclared_writes(self, skip: set[int] = frozenset(), deferred: list | None = None) -> list[str]:
        """Reachable undeclared tensors written since the forward began (versions and norm bytes),
        except those whose ids are in ``skip``. Byte checks of device tensors are computed on the
        device: with ``deferred`` (a list), their ``(name, why, 0-dim bool tensor)`` verdicts are
        appended to it, to be read later (:class:`Deferred`); without, they are read now."""
        checks: list = [] if deferred is None else deferred
        own = self.txn.owned_keys()
        found: dict[str, str] = {}
        expected = self.expected
        with DisableTorchFunctionSubclass():
            for n, t, _ in self.scan:
                if id(t) in skip:
                    continue
                if t._version != expected.get(id(t), t._version) and storage_key(t) not in own:
                    found.setdefault(describe(n), "version counter")
            self.bytes.changed(skip, own, found, checks)
        _rebindings(self.slots, self.plain_slots, self.txn.modules, found)
        if checks and deferred is None:
            return Deferred(checks).names(found)
        return list(found)

    def report_undeclared(self, names: list[str], when: str) -> None:
        """Raise (or warn) about undeclared writes seen after the fact, all of them in one message."""
        if not names:
            return
        wanted = set(names)
        written = [(n, t) for n, t, _ in [*self.scan, *self._promoted_scan] if describe(n) in wanted]
        if self.txn.auto and when == "after the forward":  # state="auto": a gap, this forward eager
            self.gaps, names, written = _split_gaps(names, written, bool(self.restructured))
            if not names:
                return
        listed = ", ".join(names)
        if self.on_undeclared == "warn":
            warn_undeclared(undeclared_message(self, listed, f"seen {when}", written=written))
            return
        raise UndeclaredStateError(undeclared_message(self, listed, f"seen {when}", written=written))

    def adopt(self, inner: "Watch") -> None:
        """An inner segment ended (our transaction adopted its, ``run_segment``): what it declared
        is no longer ours to watch from our start, only from now."""
        keys = set(inner.txn.storages())
        with DisableTorchFunctionSubclass():
            for _, t, _ in self.scan:
                if storage_key(t) in keys:
                    self.expected[id(t)] = t._version
            self.bytes.rebase(keys)
        inner_ids = inner.txn.witness_ids()
        self.slots = [(path, m, tensor_slots(m) if any(id(v) in inner_ids for v in before.values()) else before)
                      for path, m, before in self.slots]  # bindings the inner segment replays itself

    def check_inner_declaration(self, inner: "Watch") -> None:
        """An inner segment declares state we reach: we must not have written it already (R7)."""
        keys = set(inner.txn.storages())
        if not keys:
            return
        with DisableTorchFunctionSubclass():
            hit = [describe(n) for n, t, _ in self.scan
                   if storage_key(t) in keys and t._version != self.expected.get(id(t), t._version)]
        if hit and self.on_undeclared != "warn":
            raise UndeclaredStateError(undeclared_message(
                self, ", ".join(hit), f"before the inner segment {inner.name!r} declared it (an inner "
                "declaration covers writes from its own start only)"))

    def _raw_name_of(self, w: torch.Tensor, inputs: Callable[[], tuple[tuple, dict]]) -> Any:
        """The scan's name of the reachable tensor sharing ``w``'s storage, or ``None``."""
        try:
            args, kwargs = inputs()
        except RuntimeError:  # an input changed since the forward: name from fn alone
            args, kwargs = (), {}
        with DisableTorchFunctionSubclass():
            key = storage_key(w)
            names = [n for n, t in reachable(self.fn, args, kwargs) if storage_key(t) == key]
        return names[0] if names else None

    # -- recompute -----------------------------------------------------------------------
    def versions(self) -> list[tuple[Any, torch.Tensor, int]]:
        """The scan's versions now (before a replay); first, the forward's byte checks still
        pending on the device are read (an undeclared write they saw is refused here, R7)."""
        d, self._pending = self._pending, None
        if d is not None:  # the forward's byte checks that were still on the device after it
            self.report_undeclared(d.names({}), "after the forward")
        with DisableTorchFunctionSubclass():
            return [(n, t, t._version) for n, t, _ in self.scan]

    def report_replay_writes(self, versions: list[tuple[Any, torch.Tensor, int]]) -> None:
        """After a replay: refuse (or warn about) the scan's tensors it wrote, by their versions, and
        an iterator it advanced (``ReplayError``)."""
        self.iters.refuse_replay(self.name, warn_undeclared if self.on_undeclared == "warn" else None)
        with DisableTorchFunctionSubclass():
            again = [describe(n) for n, t, v in versions if t._version != v]
        self.report_undeclared(again, "at recomputation by its version counter (the forward already wrote it "
                                      "once; the replay wrote it again)")


def _refuse_advanced(watch: Watch) -> None:
    """After the forward: strict mode refuses a forward that advanced a reached iterator or generator
    (``UnsupportedError``; ``on_undeclared="warn"`` warns, the replay advances it again); under
    ``state="auto"`` that forward keeps its activations instead (``_learn.end``)."""
    advanced = watch.iters.advanced
    if not advanced or watch.txn.auto:
        return
    if watch.on_undeclared == "warn":
        warn_undeclared(advanced_message(watch.name, advanced))
        return
    raise UnsupportedError(advanced_message(watch.name, advanced))


def _shared_empties(obj: Any, names: tuple[str, ...]) -> None:
    """After the forward: ``obj``'s empty lists and sets among ``names`` become shared immutable
    empties (what a segment keeps until backward is scanned by the garbage collector's oldest
    generation: see ``_plain.EMPTY_SET``). Only for attributes nothing appends to later."""
    for n in names:
        v = getattr(obj, n)
        if not v and type(v) in (list, set):
            setattr(obj, n, () if type(v) is list else EMPTY_SET)


def _rebindings(slots: list, plain_slots: list, mods: ModuleState, found: dict[str, str]) -> None:
    """Add to ``found`` the undeclared rebindings of the forward: reached modules' tensor slots
    (``slots``: ``(path, module, slots at the start)``) and tensors bound outside modules
    (``plain_slots``), less what the replay binds itself (``mods``, the transaction's to say)."""
    for path, m, before in slots:
        now = mods.slots_at_end(m)  # taken at this forward's end
        now = tensor_slots(m) if now is None else now
        for (d, k) in (set(before) | set(now)) - mods.replayed_slots(m):
            if mods.binds_plain((id(getattr(m, d)), k)):
                continue
            if before.get((d, k)) is not now.get((d, k)) and not framework_swap(d, before.get((d, k)), now.get((d, k))):
                kind = {"_parameters": "parameter", "_buffers": "buffer"}.get(d, "tensor attribute")
                full = f"{path}.{k}" if path else k
                found.setdefault(f"{kind} {full!r} (rebound to another tensor)", "binding")
    for name in rebound([s for s in plain_slots if not mods.binds_plain(slot_id(s[1], s[2]))]):
        found.setdefault(name, "binding")


def _split_gaps(names: list[str], written: list, eager: bool = False) -> tuple[list[torch.Tensor], list[str], list]:
    """``state="auto"`` after its first step: the written tensors the default learns (gaps), and
    the names (with their ``written`` pairs) no default can help — inputs and bindings (unless
    ``eager``: the forward changed its modules' structure, ``_structure``, and keeps its activations:
    a parameter or buffer it registered is no rebinding a replay would miss)."""
    inputs = set(_written_inputs(written))
    tensors = {describe(n): t for n, t in written if describe(n) not in inputs}
    rest = [n for n in names if n not in tensors and not (eager and n.endswith("(rebound to another tensor)"))]
    return list(tensors.values()), rest, [(n, t) for n, t in written if describe(n) in set(rest)]
