"""One checkpointed segment: saved-tensor hooks, recomputation under the transaction, checks.

Follows ``torch.utils.checkpoint``'s non-reentrant design (its "Nestable Checkpoint" note,
Rules 1–6): saved tensors are replaced by holders; the first unpack in a backward re-runs
the segment under a recomputation hook that fills the holders, stopping early once all are
filled. The re-run happens inside :meth:`Transaction.replay` and with the forward's RNG state.
"""
from __future__ import annotations

import contextlib
import uuid
import weakref
from collections import defaultdict
from typing import Any, Callable

import torch
from torch._C._autograd import SavedTensor, _make_saved_tensor
from torch.utils.checkpoint import GraphExecGroup, _get_autocast_kwargs, _infer_device_type
from torch.utils._pytree import tree_flatten, tree_unflatten

from stateremat.contract import ReplayDivergenceError, ReplayError, UndeclaredStateError, internal_assert, rule

from . import _rng
from ._context import LOCAL
from ._mode import StateMode
from ._stats import COUNTERS
from ._scan import describe, reachable
from ._storage import byte_extent, storage_key
from ._txn import Transaction


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
        with torch.no_grad():
            store[h] = store[h].clone()
        return store[h].numel() * store[h].element_size()

    return copy


class _StopRecomputation(Exception):
    pass


class RecomputeSink:
    """Counts replays for a wrapper (``StatefulCheckpoint.recompute_count``)."""

    def __init__(self) -> None:
        self.recompute_count = 0


def _release(txn: Transaction) -> None:
    txn.release()
    COUNTERS.live_segments -= 1
    COUNTERS.touch()


def undeclared_message(seg: "Segment", name: str, when: str, reachable: bool = True) -> str:
    alt = ", or pass on_undeclared='declare'" if reachable else (
        " (on_undeclared='declare' cannot help: the forward's scan does not reach this tensor; "
        "pass it as an argument, register it as a buffer, or declare it)")
    return (
        f"stateremat.torch.checkpoint: segment {seg.name!r} wrote in place to {name}, which existed "
        f"before the segment and is not declared state (expected only declared tensors to be "
        f"mutated, got a write {when}); replay would repeat this write ({rule('R7')}). Tip: declare "
        "it, e.g. checkpoint(fn, ..., state=[tensor_or_module]) or StatefulCheckpoint(block, "
        f"state='buffers'){alt}."
    )


class Segment:
    """State of one checkpointed forward: inputs, holders, transaction, RNG, checks."""

    def __init__(self, fn: Callable, name: str, verify: bool, on_undeclared: str,
                 sink: RecomputeSink | None) -> None:
        self.fn = fn
        self.name = name
        self.verify = verify
        self.on_undeclared = on_undeclared
        self.sink = sink
        self.txn: Transaction  # set by attach() before the forward runs
        self.rng: _rng.RngState | None = None
        self.candidate_keys: dict | None = None
        self.weak_holders: list[weakref.ref] = []
        self.metas: list[tuple] = []
        self.originals: list[torch.Tensor] = []
        self.recomputed: defaultdict = defaultdict(weakref.WeakKeyDictionary)
        self.recomp_counter: defaultdict = defaultdict(int)
        self.is_recomputed: defaultdict = defaultdict(bool)
        self.mismatch: dict[Any, list[str]] = defaultdict(list)
        self.passive_declared = False
        self._saved: list[Any] = []
        self._spec: Any = None
        self._autocast: tuple = ()
        self.recompute_context: Any = contextlib.nullcontext()  # context_fn's second context
        self.check_metadata = True  # determinism_check="default"

    def attach(self, txn: Transaction) -> None:
        """Own ``txn``; it is released when this segment is garbage (no graph needs it)."""
        self.txn = txn
        COUNTERS.live_segments += 1
        weakref.finalize(self, _release, txn)

    def undeclared_before_write(self, key: Any, entry: tuple, func: Any) -> None:
        """Called by the dispatch mode before ``func`` writes an undeclared reachable tensor (R7)."""
        name, t = describe(entry[0]), entry[1]
        if self.on_undeclared == "raise":
            raise UndeclaredStateError(undeclared_message(self, name, f"by {func} (not applied)"))
        if self.on_undeclared == "declare":
            self.txn.promote(name, t)
            if self.candidate_keys is not None:
                self.candidate_keys.pop(key, None)

    def undeclared_at_replay(self, w: torch.Tensor, func: Any, what: str) -> None:
        """Called by the replay mode before ``func`` writes pre-existing undeclared state (R7)."""
        try:
            args, kwargs = self.inputs()
        except RuntimeError:  # an input changed since the forward: name from fn alone
            args, kwargs = (), {}
        key = storage_key(w)
        names = [n for n, t in reachable(self.fn, args, kwargs) if storage_key(t) == key]
        name = describe(names[0]) if names else f"a tensor of shape {tuple(w.shape)} {w.dtype} the scan cannot name"
        raise UndeclaredStateError(undeclared_message(
            self, name, f"at recomputation by {func} to {what} (not applied; the forward already made "
            "this write once, the replay would make it twice)", reachable=bool(names)))

    # -- inputs (Rule 2 of torch's note: inputs are saved tensors of the enclosing segment) --
    def save_inputs(self, args: tuple, kwargs: dict) -> None:
        leaves, self._spec = tree_flatten((args, kwargs))
        self._saved = [
            x if isinstance(x, torch.Tensor) and self._restored_by_txn(x)
            else _make_saved_tensor(x, is_output=False) if isinstance(x, torch.Tensor) else x
            for x in leaves
        ]
        device_type = _infer_device_type(*[x for x in leaves if isinstance(x, torch.Tensor)])
        self._autocast = (device_type, *_get_autocast_kwargs(device_type=device_type))

    def _restored_by_txn(self, x: torch.Tensor) -> bool:
        """True if the transaction restores every byte of input ``x`` (then it is held as is).

        Other inputs keep torch's saved-tensor version check: a later in-place write to them
        raises at backward instead of replaying on changed values (R8).
        """
        items = self.txn.items
        if not items or x.layout != torch.strided:
            return False
        item = items.get(storage_key(x))
        if item is None:
            return False
        if item.kind == "region":
            # The journal covers every byte of the storage; an unjournaled write through this
            # input (its version counter may differ from the declared views') is a gap (R8).
            item.tracker.add_witness(x, f"input of segment {self.name!r}")
            return True
        lo, hi = byte_extent(x)  # a whole snapshot covers [lo, hi), all of the storage today
        return item.lo <= lo and hi <= item.hi

    def inputs(self) -> tuple[tuple, dict]:
        leaves = [x.unpack() if isinstance(x, SavedTensor) else x for x in self._saved]
        return tree_unflatten(leaves, self._spec)

    # -- hooks ---------------------------------------------------------------------------
    def forward_hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        seg = self

        def pack(x: torch.Tensor) -> _Holder:
            holder = _Holder()
            seg.weak_holders.append(weakref.ref(holder))
            seg.metas.append((tuple(x.shape), x.dtype, x.device))
            if seg.verify:
                with torch.no_grad():
                    seg.originals.append(x.detach().clone())
            return holder

        def unpack(holder: _Holder) -> torch.Tensor:
            gid: Any = GraphExecGroup._get_current_group()
            if gid is None:
                gid = torch._C._current_graph_task_id()
                if gid == -1:
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

        def pack(x: torch.Tensor) -> torch.Tensor:
            x = x.detach() if x.requires_grad else x
            idx = seg.recomp_counter[gid]
            seg.recomp_counter[gid] += 1
            if idx >= len(seg.weak_holders):
                raise ReplayError(
                    f"stateremat.torch.checkpoint: segment {seg.name!r} saved more tensors during "
                    f"recomputation than during the forward (expected {len(seg.weak_holders)}). Tip: "
                    "make the segment's control flow depend only on its inputs and declared state."
                )
            holder = seg.weak_holders[idx]()
            if holder is not None:
                if seg.verify:
                    seg._compare(gid, idx, x)
                handle = holder.handles[gid] = _Handle()
                key = storage_key(x) if seg.txn.items and x.layout == torch.strided else None
                item = seg.txn.items.get(key) if key is not None else None
                if item is not None and item.kind == "whole":
                    x = x.clone()  # an alias of declared state: keep the replayed version (R1)
                    if LOCAL.replay:
                        LOCAL.replay[-1].alias_bytes += x.numel() * x.element_size()
                elif item is not None and LOCAL.replay:
                    # Region storage: copy only if its bytes change later (copy on write).
                    LOCAL.replay[-1].aliases.append((key, _copier(seg.recomputed[gid], handle)))
                seg.recomputed[gid][handle] = x
            if seg.recomp_counter[gid] == len(seg.weak_holders):
                raise _StopRecomputation
            return x

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x)

    # -- recomputation -------------------------------------------------------------------
    def recompute(self, gid: Any) -> None:
        """Re-run the segment once for backward ``gid`` inside the replay transaction."""
        if self.passive_declared:
            raise ReplayError(
                f"stateremat.torch.checkpoint: segment {self.name!r} with declared state was created "
                "during another segment's recomputation and is now asked to replay (backward "
                f"through a recomputed graph); its B0 was not preserved ({rule('R8')}). Tip: do not "
                "differentiate through recomputed graphs of stateful segments."
            )
        args, kwargs = self.inputs()
        device_type, device_kw, cpu_kw = self._autocast
        device_ac = (
            torch.amp.autocast(device_type=device_type, **device_kw)
            if torch.amp.is_autocast_available(device_type) else contextlib.nullcontext()
        )
        with self.txn.replay(self.name), _rng.replayed(self.rng):
            # The mode refuses writes to undeclared pre-existing storages before they happen (R7).
            with self._recompute_hooks(gid), torch.autograd.enable_grad(), device_ac, \
                    torch.amp.autocast("cpu", **cpu_kw), self.recompute_context, StateMode("replay", self):
                try:
                    self.fn(*args, **kwargs)
                except _StopRecomputation:
                    pass
        self.is_recomputed[gid] = True
        COUNTERS.recompute_count += 1
        if self.sink is not None:
            self.sink.recompute_count += 1
        self._check(gid)

    def _compare(self, gid: Any, idx: int, x: torch.Tensor) -> None:
        ref = self.originals[idx]
        if ref.shape != x.shape or ref.dtype != x.dtype:
            return  # reported by the metadata check
        with torch.no_grad():
            a, b = ref.reshape(-1), x.detach().reshape(-1)
            same = torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) \
                if a.dtype != torch.bool else torch.equal(a, b)
            if not same:
                diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
                self.mismatch[gid].append(f"saved tensor #{idx} shape {tuple(x.shape)} {x.dtype}: "
                                          f"max |difference| {diff:.6g}")

    def _check(self, gid: Any) -> None:
        n, got = len(self.weak_holders), self.recomp_counter[gid]
        if got != n:
            raise ReplayError(
                f"stateremat.torch.checkpoint: segment {self.name!r} saved a different number of "
                f"tensors during recomputation (expected {n}, got {got}). Tip: make the segment's "
                "control flow depend only on its inputs and declared state."
            )
        for idx, ref in enumerate(self.weak_holders if self.check_metadata else ()):
            holder = ref()
            if holder is None or holder.handles.get(gid) is None:
                continue
            x = self.recomputed[gid][holder.handles[gid]]
            meta = (tuple(x.shape), x.dtype, x.device)
            if meta != self.metas[idx]:
                raise ReplayError(
                    f"stateremat.torch.checkpoint: segment {self.name!r}: saved tensor #{idx} has "
                    f"different metadata at recomputation (expected {self.metas[idx]}, got {meta}). "
                    "Tip: declare the state the segment reads and mutates (state=...)."
                )
        if self.mismatch.get(gid):
            raise ReplayDivergenceError(
                f"stateremat.torch.checkpoint(verify=True): segment {self.name!r} recomputed saved "
                f"tensors that differ from the forward's bit for bit ({rule('R4')}): "
                + "; ".join(self.mismatch[gid])
                + ". Tip: declare the state the segment mutates and keep preserve_rng_state=True."
            )
