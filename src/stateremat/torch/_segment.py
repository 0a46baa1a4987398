"""One checkpointed segment: saved-tensor hooks, recomputation under the transaction, checks.

Follows ``torch.utils.checkpoint``'s non-reentrant design (its "Nestable Checkpoint" note,
Rules 1–6): saved tensors are replaced by holders; the first unpack in a backward re-runs
the segment under a recomputation hook that fills the holders, stopping early once all are
filled (unless early stop is off). The re-run happens inside :meth:`Transaction.replay` and
with the forward's RNG state. A checkpoint met *during* a replay runs eagerly (its saved
tensors are kept): the enclosing transaction already restores and reinstates its state.
"""
from __future__ import annotations

import contextlib
import re
import uuid
import weakref
from collections import defaultdict
from typing import Any, Callable, Iterator

import torch
from torch import nn

from stateremat.contract import internal_assert, rule

from . import _rng
from ._compat import (
    DisableTorchFunctionSubclass,
    SavedTensor,
    TorchDispatchMode,
    autocast_kwargs,
    current_graph_id,
    entered_hiding,
    has_storage,
    infer_device_type,
    library_ops,
    make_saved_tensor,
    tree_flatten,
    tree_unflatten,
)
from ._framework import framework_swap
from ._errors import ReplayDivergenceError, ReplayError, UndeclaredStateError
from ._mode import StrictMode, warn_undeclared
from ._runtime import Runtime, runtime
from ._scan import describe, reachable, rebound, tensor_slots
from ._storage import fingerprint, storage_key
from ._txn import Bindings, Transaction, moved_views, put_binding, views_as_of


class _Holder:
    __slots__ = ("handles", "__weakref__")

    def __init__(self) -> None:
        self.handles: dict[Any, _Handle | None] = {}


class _Handle:
    __slots__ = ("__weakref__",)


def _copier(store: weakref.WeakKeyDictionary, handle: _Handle) -> Callable[[], int]:
    ref = weakref.ref(handle)

    def copy() -> int:
        h = ref()
        if h is None or h not in store:
            return 0
        with library_ops():
            store[h] = store[h].clone()
        return store[h].numel() * store[h].element_size()

    return copy


def _autocast_on(device_type: str) -> bool:
    """Is autocast enabled for ``device_type`` (where autocast exists) or the CPU?"""
    return (torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)) \
        or torch.is_autocast_enabled("cpu")


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN == NaN, -0.0 != 0.0)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@contextlib.contextmanager
def _modes_as_of(modes: list[tuple[nn.Module, bool]]) -> Iterator[None]:
    """Set each module's training flag to the recorded one; afterwards put back every flag as it
    was before (also those the replayed forward itself changes)."""
    before = [(m, m.training) for m, _ in modes]
    for m, was in modes:
        m.training = was
    try:
        yield
    finally:
        for m, now in before:
            m.training = now


class _StopRecomputation(Exception):
    pass


class RecomputeSink:
    """Counts replays for a wrapper (``StatefulCheckpoint.recompute_count``)."""

    def __init__(self) -> None:
        self.recompute_count = 0


class _OpLog(TorchDispatchMode):
    """``debug=True``: the ATen ops a forward or recomputation ran, for error messages."""

    def __init__(self, ops: list[str]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _release(txn: Transaction, rt: Runtime) -> None:
    txn.release()
    rt.counters.live_segments -= 1
    rt.counters.touch()


#: A scan name of an input of the segment: an argument itself or an element of a container argument
#: (not an attribute of an object passed in, which is state that object holds).
_INPUT_NAME = re.compile(r"(partial |keyword )?argument (\d+|'[^']*')(\[[^\]]*\])*")


def _written_inputs(written: Any) -> list[str]:
    """Names of written tensors that are inputs of the segment: the replay needs them as they were
    at the forward, and autograd refuses a saved input written in place ('modified by an inplace
    operation'), so declaring them with on_undeclared='declare' cannot help."""
    return [describe(n) for n, _ in written if isinstance(n, str) and _INPUT_NAME.fullmatch(n)]


def undeclared_message(seg: "Segment", names: str, when: str, reachable: bool = True, written: Any = ()) -> str:
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
        f"{head} Tip: declare "
        "it, e.g. checkpoint(fn, ..., state=[tensor_or_module]) or StatefulCheckpoint(block, "
        f"state='buffers'){alt}."
    )


class Segment:
    """State of one checkpointed forward: inputs, holders, transaction, RNG, checks.

    Args:
        rt: the runtime of the thread running the forward.
        fn: the segment function.
        name: segment name for messages.
        verify: keep copies of saved tensors and compare bit for bit at recomputation (R4).
        on_undeclared: ``"raise"``, ``"warn"`` or ``"declare"`` (R7).
        sink: replay counter of a wrapper, or None.
        early_stop: stop the recomputation once every saved tensor is recomputed.
        debug: record the ops of the forward and recomputation for error messages.
        check_metadata: compare shape/dtype/device of recomputed saved tensors.
        recompute_context: entered around the recomputation (``context_fn``'s second).
    """

    def __init__(self, rt: Runtime, fn: Callable, name: str, *, verify: bool, on_undeclared: str,
                 sink: RecomputeSink | None, early_stop: bool = True, debug: bool = False,
                 check_metadata: bool = True, recompute_context: Any = None) -> None:
        self.rt = rt
        self.fn = fn
        self.name = name
        self.verify = verify
        self.on_undeclared = on_undeclared
        self.sink = sink
        self.early_stop = early_stop
        self.debug_ops: tuple[list[str], list[str]] | None = ([], []) if debug else None
        self.check_metadata = check_metadata
        self.recompute_context: Any = recompute_context if recompute_context is not None else contextlib.nullcontext()
        self.txn: Transaction  # set by attach() before the forward runs
        self.rng: _rng.RngState | None = None
        self.bindings: Bindings | None = None
        self.strict = False  # the forward ran under StrictMode; so does the replay
        self.scan: list[tuple[Any, torch.Tensor, int]] = []  # reachable undeclared tensors, start versions
        self.expected: dict[int, int] = {}  # id(tensor) -> version it should have now (adoptions move it)
        self.norm_probes: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
        self.ptrs: list[tuple[Any, torch.Tensor, int]] = []  # data pointers of reachable tensors
        self.fingerprints: list[tuple[Any, torch.Tensor, tuple[int, int]]] = []
        self.slots: list[tuple[str, Any, dict, set]] = []  # tensor bindings of reachable undeclared modules
        self.plain_slots: list = []  # tensors bound in lists, dicts, plain objects, classes, globals
        self.end_bindings: list = []  # reached modules' bindings after the forward (forward_end_bindings)
        self.param_versions: list[tuple[Any, torch.Tensor, int]] = []
        self._candidates: dict | None = None
        self.weak_holders: list[weakref.ref] = []
        self.metas: list[tuple] = []
        self.originals: list[torch.Tensor] = []
        self.recomputed: defaultdict = defaultdict(weakref.WeakKeyDictionary)
        self.recomp_counter: defaultdict = defaultdict(int)
        self.is_recomputed: defaultdict = defaultdict(bool)
        self.mismatch: dict[Any, list[str]] = defaultdict(list)
        self._saved: list[Any] = []
        self._spec: Any = None
        self._autocast: tuple = ()
        self.forward_completed = False  # backward inside the forward (torch's Rule 6) recomputes early
        self.modes: list[tuple[nn.Module, bool]] = []  # reached modules' training flags at the forward's start
        self.views: list[tuple] = []  # view_records of reached undeclared tensors at the forward's start
        self.adopted: list[tuple[Bindings | None, list, list]] = []  # (bindings, modes, views) of nested segments
        self.ignore_saved_mismatch = False

    def attach(self, txn: Transaction) -> None:
        """Own ``txn``; it is released when this segment is garbage (no graph needs it)."""
        self.txn = txn
        self.rt.counters.live_segments += 1
        weakref.finalize(self, _release, txn, self.rt)

    # -- undeclared writes (R7) --------------------------------------------------------------
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
        if self.on_undeclared == "raise":
            raise UndeclaredStateError(undeclared_message(self, name, f"by {func} (not applied)",
                                                          written=[(entry[0], t)]))
        if self.on_undeclared == "declare":
            self.txn.promote(name, t)
            self.candidates.pop(key, None)
            self.scan = [s for s in self.scan if s[1] is not t]

    def undeclared_at_replay(self, w: torch.Tensor, func: Any, what: str) -> None:
        """Called before ``func`` writes pre-existing undeclared state during the replay (R7)."""
        raw = self._raw_name_of(w)
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

    def _raw_name_of(self, w: torch.Tensor) -> Any:
        """The scan's name of the reachable tensor sharing ``w``'s storage, or ``None``."""
        try:
            args, kwargs = self.inputs()
        except RuntimeError:  # an input changed since the forward: name from fn alone
            args, kwargs = (), {}
        with DisableTorchFunctionSubclass():
            key = storage_key(w)
            names = [n for n, t in reachable(self.fn, args, kwargs) if storage_key(t) == key]
        return names[0] if names else None

    def undeclared_writes(self, skip: set[int] = frozenset()) -> list[str]:
        """Reachable undeclared tensors written since the forward began (versions and norm bytes),
        except those whose ids are in ``skip``."""
        own = {k for k, p in self.txn.items.items() if p.owned}
        found: dict[str, str] = {}
        expected = self.expected
        with DisableTorchFunctionSubclass():
            for n, t, _ in self.scan:
                if id(t) in skip:
                    continue
                if t._version != expected.get(id(t), t._version) and storage_key(t) not in own:
                    found.setdefault(describe(n), "version counter")
            if self.norm_probes:
                with library_ops():
                    for n, t, before in self.norm_probes:
                        if id(t) not in skip and not _same_bytes(t, before) and storage_key(t) not in own:
                            found.setdefault(describe(n), "bytes (a kernel that bumps no version)")
            for n, t, ptr in self.ptrs:
                if t.data_ptr() != ptr and id(t) not in skip:
                    found.setdefault(describe(n), "storage rebound (.data = / set_)")
            for n, t, fp in self.fingerprints:
                if (id(t) not in skip and describe(n) not in found and storage_key(t) not in own
                        and fingerprint(t) != fp):
                    found.setdefault(describe(n), "bytes (written through .data or another alias)")
        ends = {id(m): slots for _, m, slots, _ in self.end_bindings}  # taken at this forward's end
        for path, m, before, held in self.slots:
            now = ends.get(id(m)) if id(m) in ends else tensor_slots(m)
            for (d, k) in (set(before) | set(now)) - held:
                if before.get((d, k)) is not now.get((d, k)) and not framework_swap(d, before.get((d, k)), now.get((d, k))):
                    kind = {"_parameters": "parameter", "_buffers": "buffer"}.get(d, "tensor attribute")
                    full = f"{path}.{k}" if path else k
                    found.setdefault(f"{kind} {full!r} (rebound to another tensor)", "binding")
        for name in rebound(self.plain_slots):
            found.setdefault(name, "binding")
        return list(found)

    def note_parameters(self) -> None:
        """Remember the versions of reachable parameters after the forward (checked at replay)."""
        with DisableTorchFunctionSubclass():
            self.param_versions = [(n, t, t._version) for n, t, _ in self.scan if t.requires_grad and t.is_leaf]

    def note_bindings(self, modules: list[tuple[str, Any]]) -> None:
        """Remember, after the forward, which tensor each attribute of the reached modules names
        and which submodule each child name holds (bound again for the replay:
        :meth:`forward_end_bindings`; read by :meth:`undeclared_writes`)."""
        self.end_bindings = [(path, m, tensor_slots(m), dict(m._modules)) for path, m in modules]

    @contextlib.contextmanager
    def forward_end_bindings(self) -> Any:
        """During the replay, bind every reached module's parameters, buffers, tensor attributes
        and submodules as they were at the forward's end; put the current ones back afterwards.

        Eager's backward uses the forward's objects, so a rebinding between forward and backward
        (``m.q = m.q * 0.3``, ``m.l2 = nn.Linear(...)``, a cache rebuilt by a second micro-batch's
        forward, a later layer rebinding its own buffer) must not change what the replay reads.
        """
        swaps = []
        for _, m, slots, children in self.end_bindings:
            now = tensor_slots(m)
            for key in set(slots) | set(now):
                if slots.get(key) is not now.get(key) and not framework_swap(key[0], slots.get(key), now.get(key)):
                    swaps.append((getattr(m, key[0]), key[1], key in slots, slots.get(key), key in now, now.get(key)))
            for k in set(children) | set(m._modules):
                if children.get(k) is not m._modules.get(k):
                    swaps.append((m._modules, k, k in children, children.get(k), k in m._modules, m._modules.get(k)))
        for table, k, had, old, _, _ in swaps:
            put_binding(table, k, had, old)
        try:
            yield
        finally:
            for table, k, _, _, has, new in reversed(swaps):
                put_binding(table, k, has, new)

    def check_parameters(self) -> None:
        """Refuse a replay whose parameters changed in place since the forward (R8).

        Raises:
            ReplayError: naming them; eager autograd refuses this too ("modified by an inplace
                operation") when it saved the parameter.
        """
        with DisableTorchFunctionSubclass():
            changed = [describe(n) for n, t, v in self.param_versions if t._version != v]
        if changed:
            raise ReplayError(
                f"stateremat.torch.checkpoint: cannot replay segment {self.name!r}: {', '.join(changed)} "
                "changed in place between its forward and this backward (an optimizer step before "
                f"backward?), so the replay would differentiate other weights (expected them unchanged; "
                f"{rule('R8')}). Tip: run backward before the optimizer step, or declare them as state.")

    def report_undeclared(self, names: list[str], when: str) -> None:
        """Raise (or warn) about undeclared writes seen after the fact, all of them in one message."""
        if not names:
            return
        listed = ", ".join(names)
        wanted = set(names)
        written = [(n, t) for n, t, _ in self.scan if describe(n) in wanted]
        if self.on_undeclared == "warn":
            warn_undeclared(undeclared_message(self, listed, f"seen {when}", written=written))
            return
        raise UndeclaredStateError(undeclared_message(self, listed, f"seen {when}", written=written))

    def adopt(self, inner: "Segment") -> None:
        """An inner segment ended: its declared storages, bindings, views and modes are replayed by us too."""
        self.txn.adopt(inner.txn)
        self.adopted.append((inner.bindings, inner.modes, inner.views))
        keys = set(inner.txn.items)
        with DisableTorchFunctionSubclass():
            for _, t, _ in self.scan:
                if storage_key(t) in keys:
                    self.expected[id(t)] = t._version
            with library_ops():
                self.norm_probes = [(n, t, t.clone() if storage_key(t) in keys else before)
                                    for n, t, before in self.norm_probes]
            self.fingerprints = [(n, t, fingerprint(t) if storage_key(t) in keys else fp)
                                 for n, t, fp in self.fingerprints]
            self.ptrs = [(n, t, t.data_ptr() if storage_key(t) in keys else ptr) for n, t, ptr in self.ptrs]
        inner_ids = {id(w) for p in inner.txn.items.values() for w in p.storage.witnesses.values()}
        self.slots = [(path, m, tensor_slots(m) if any(id(v) in inner_ids for v in before.values()) else before, skip)
                      for path, m, before, skip in self.slots]  # bindings the inner segment replays itself

    def check_inner_declaration(self, inner: "Segment") -> None:
        """An inner segment declares state we reach: we must not have written it already (R7)."""
        keys = set(inner.txn.items)
        if not keys:
            return
        with DisableTorchFunctionSubclass():
            hit = [describe(n) for n, t, _ in self.scan
                   if storage_key(t) in keys and t._version != self.expected.get(id(t), t._version)]
        if hit and self.on_undeclared != "warn":
            raise UndeclaredStateError(undeclared_message(
                self, ", ".join(hit), f"before the inner segment {inner.name!r} declared it (an inner "
                "declaration covers writes from its own start only)"))

    # -- inputs (Rule 2 of torch's note: inputs are saved tensors of the enclosing segment) --
    def save_inputs(self, args: tuple, kwargs: dict) -> None:
        if not kwargs and all(type(a) is torch.Tensor for a in args):
            leaves, self._spec = list(args), None  # the common case, without pytree
        else:
            leaves, self._spec = tree_flatten((args, kwargs))
        self._saved = [
            x if isinstance(x, torch.Tensor) and self._restored_by_txn(x)
            else make_saved_tensor(x) if isinstance(x, torch.Tensor) else x
            for x in leaves
        ]
        device_type = infer_device_type(*[x for x in leaves if isinstance(x, torch.Tensor)])
        on = _autocast_on(device_type)
        # None: the forward ran without autocast (the replay then makes sure it does too)
        self._autocast = (device_type, *autocast_kwargs(device_type)) if on else (device_type, None, None)

    def _restored_by_txn(self, x: torch.Tensor) -> bool:
        """True if the transaction restores every byte of input ``x`` (then it is held as is).

        Other inputs keep torch's saved-tensor version check: a later in-place write to them
        raises at backward instead of replaying on changed values (R8).
        """
        items = self.txn.items
        if not items or not has_storage(x):
            return False
        with DisableTorchFunctionSubclass():
            p = items.get(storage_key(x))
        if p is None:
            return False
        # Both preservers cover every byte of the storage; a write through this input outside
        # the journal changes its version counter: a gap (R8).
        p.storage.add_witness(x, f"input of segment {self.name!r}")
        return True

    def inputs(self) -> tuple[tuple, dict]:
        leaves = [x.unpack() if isinstance(x, SavedTensor) else x for x in self._saved]
        return (tuple(leaves), {}) if self._spec is None else tree_unflatten(leaves, self._spec)

    # -- hooks ---------------------------------------------------------------------------
    def forward_hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        seg = self

        def pack(x: torch.Tensor) -> _Holder:
            holder = _Holder()
            seg.weak_holders.append(weakref.ref(holder))
            seg.metas.append((tuple(x.shape), x.dtype, x.device))
            if seg.verify:
                with library_ops():
                    seg.originals.append(x.detach().clone())
            return holder

        def unpack(holder: _Holder) -> torch.Tensor:
            gid: Any = current_graph_id()
            if gid is None:
                gid = int(uuid.uuid4())
            if not seg.is_recomputed[gid]:
                seg.recompute(gid)
            internal_assert(gid in holder.handles, "holder has no handle for this backward")
            handle = holder.handles[gid]
            if handle is None:
                raise ReplayError(
                    f"stateremat.torch.checkpoint: segment {seg.name!r}: a saved tensor was unpacked "
                    "twice in one backward (expected once, got twice). Tip: read ctx.saved_tensors "
                    "only once in custom autograd Functions."
                )
            out = seg.recomputed[gid][handle]
            holder.handles[gid] = None
            return out

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def _recompute_hooks(self, gid: Any) -> torch.autograd.graph.saved_tensors_hooks:
        seg = self
        items = self.txn.items
        declared_ptrs = {key[2] for key in items}  # storage addresses: a cheap first test per saved tensor

        def pack(x: torch.Tensor) -> torch.Tensor:
            x = x.detach() if x.requires_grad else x
            idx = seg.recomp_counter[gid]
            seg.recomp_counter[gid] += 1
            if idx >= len(seg.weak_holders) and not seg.forward_completed:
                # a backward inside the forward (early stop off) recomputes the whole function
                # while the forward is still saving tensors (torch's Rule 6)
                seg.ignore_saved_mismatch = True
                return x
            if idx >= len(seg.weak_holders):
                raise ReplayError(seg._debug_text(
                    f"stateremat.torch.checkpoint: segment {seg.name!r} saved more tensors during "
                    f"recomputation than during the forward (expected {len(seg.weak_holders)}). Tip: "
                    "make the segment's control flow depend only on its inputs and declared state."))
            holder = seg.weak_holders[idx]()
            if holder is not None:
                if seg.verify:
                    seg._compare(gid, idx, x)
                handle = holder.handles[gid] = _Handle()
                p = None
                if declared_ptrs and has_storage(x):
                    with DisableTorchFunctionSubclass():
                        if x.untyped_storage().data_ptr() in declared_ptrs:
                            p = items.get(storage_key(x))
                log = seg.rt_exec_replay()
                if p is not None and not p.captures_replay_writes:
                    with library_ops():
                        x = x.clone()  # an alias of whole-preserved state: keep the replayed version (R1)
                    if log is not None:
                        log.alias_bytes += x.numel() * x.element_size()
                elif p is not None and log is not None:
                    # Region storage: copy only if its bytes change later (copy on write).
                    log.aliases.append((p.storage.key, _copier(seg.recomputed[gid], handle)))
                seg.recomputed[gid][handle] = x
            if seg.early_stop and seg.recomp_counter[gid] == len(seg.weak_holders):
                raise _StopRecomputation
            return x

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x)

    @staticmethod
    def rt_exec_replay() -> Any:
        rt = runtime()
        return rt.replay[-1] if rt.replay else None

    # -- recomputation -------------------------------------------------------------------
    def recompute(self, gid: Any) -> None:
        """Re-run the segment once for backward ``gid`` inside the replay transaction."""
        self.check_parameters()
        args, kwargs = self.inputs()
        device_type, device_kw, cpu_kw = self._autocast
        if device_kw is None and not _autocast_on(device_type):
            device_ac = cpu_ac = contextlib.nullcontext()  # autocast off then and now
        else:
            if device_kw is None:
                device_kw = cpu_kw = {"enabled": False}
            device_ac = (torch.amp.autocast(device_type=device_type, **device_kw)
                         if torch.amp.is_autocast_available(device_type) else contextlib.nullcontext())
            cpu_ac = torch.amp.autocast("cpu", **cpu_kw)
        strict = StrictMode(self.rt, "replay", self) if self.strict else contextlib.nullcontext()
        oplog = _OpLog(self.debug_ops[1]) if self.debug_ops is not None else contextlib.nullcontext()
        if self.debug_ops is not None:
            self.debug_ops[1].clear()
        with DisableTorchFunctionSubclass():
            versions = [(n, t, t._version) for n, t, _ in self.scan]
        with self.forward_end_bindings(), self.as_of_forward(), self.txn.replay(self), _rng.replayed(self.rng):
            # the forward's end bindings, then (declared modules) its start bindings
            with self._recompute_hooks(gid), torch.autograd.enable_grad(), device_ac, cpu_ac, \
                    entered_hiding(self.recompute_context), strict, oplog:
                try:
                    self.fn(*args, **kwargs)
                except _StopRecomputation:
                    pass
        self.is_recomputed[gid] = True
        self.rt.counters.recompute_count += 1
        if self.sink is not None:
            self.sink.recompute_count += 1
        with DisableTorchFunctionSubclass():
            again = [describe(n) for n, t, v in versions if t._version != v]
        self.report_undeclared(again, "at recomputation by its version counter (the forward already wrote it "
                                      "once; the replay wrote it again)")
        self._check(gid)

    @contextlib.contextmanager
    def as_of_forward(self) -> Iterator[None]:
        """Replay with what the forward started with: training flags, declared modules' bindings,
        and the views of declared and reached tensors — ours and those of the segments nested in
        ours, which the replay runs again without replaying them itself (their state is ours too)."""
        with contextlib.ExitStack() as stack:
            for bindings, modes, views in [*self.adopted, (self.bindings, self.modes, self.views)]:
                # entered last, our own (the earliest start) win
                if modes:
                    stack.enter_context(_modes_as_of(modes))
                moved = moved_views(views) if views else None
                if moved:
                    stack.enter_context(views_as_of(moved))
                if bindings is not None:
                    stack.enter_context(bindings.as_of_forward_start())
            yield

    def _compare(self, gid: Any, idx: int, x: torch.Tensor) -> None:
        ref = self.originals[idx]
        if ref.shape != x.shape or ref.dtype != x.dtype:
            return  # reported by the metadata check
        with library_ops():
            a, b = ref.reshape(-1), x.detach().reshape(-1)
            same = torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) \
                if a.dtype != torch.bool else torch.equal(a, b)
            if not same:
                diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
                self.mismatch[gid].append(f"saved tensor #{idx} shape {tuple(x.shape)} {x.dtype}: "
                                          f"max |difference| {diff:.6g}")

    def _debug_text(self, msg: str) -> str:
        if self.debug_ops is None:
            return msg + " (set debug=True for the operators of the forward and the recomputation)"
        fwd, rec = self.debug_ops
        return (f"{msg}\nOperators of the original forward ({len(fwd)}):\n  " + "\n  ".join(fwd)
                + f"\nOperators of the recomputation ({len(rec)}):\n  " + "\n  ".join(rec))

    def _check(self, gid: Any) -> None:
        n, got = len(self.weak_holders), self.recomp_counter[gid]
        if got != n and not self.ignore_saved_mismatch:
            raise ReplayError(self._debug_text(
                f"stateremat.torch.checkpoint: segment {self.name!r} saved a different number of "
                f"tensors during recomputation (expected {n}, got {got}). Tip: make the segment's "
                "control flow depend only on its inputs and declared state."))
        for idx, ref in enumerate(self.weak_holders if self.check_metadata else ()):
            holder = ref()
            if holder is None or holder.handles.get(gid) is None:
                continue
            x = self.recomputed[gid][holder.handles[gid]]
            meta = (tuple(x.shape), x.dtype, x.device)
            if meta != self.metas[idx]:
                raise ReplayError(self._debug_text(
                    f"stateremat.torch.checkpoint: segment {self.name!r}: saved tensor #{idx} has "
                    f"different metadata at recomputation (expected {self.metas[idx]}, got {meta}). "
                    "Tip: declare the state the segment reads and mutates (state=...)."))
        if self.mismatch.get(gid):
            raise ReplayDivergenceError(
                f"stateremat.torch.checkpoint(verify=True): segment {self.name!r} recomputed saved "
                f"tensors that differ from the forward's bit for bit ({rule('R4')}): "
                + "; ".join(self.mismatch[gid])
                + ". Tip: declare the state the segment mutates and keep preserve_rng_state=True."
            )

    def oplog(self) -> Any:
        """Context recording the forward's operators when ``debug=True``."""
        return _OpLog(self.debug_ops[0]) if self.debug_ops is not None else contextlib.nullcontext()
