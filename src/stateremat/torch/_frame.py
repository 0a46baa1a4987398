"""The frame of one checkpointed segment: torch's checkpoint frame, around the transaction.

Follows ``torch.utils.checkpoint``'s non-reentrant design (its "Nestable Checkpoint" note,
Rules 1–6; :class:`Frame` plays the role of torch's ``_CheckpointFrame``). In data-flow order:

- forward: :meth:`Frame.save_inputs` keeps the inputs as saved tensors (Rule 2), and
  :meth:`Frame.run` runs the segment under the forward hook;
- pack: the forward hook replaces each saved tensor by a holder (metadata kept; with
  ``verify`` a copy);
- backward: the first unpack in a backward calls :meth:`Frame.recompute`;
- restore → recompute → reinstate: the segment re-runs inside :meth:`Transaction.replay`
  (which restores and afterwards reinstates its state) under the recomputation hook, which
  fills the holders and stops early once all are filled (unless early stop is off); then the
  number, metadata (and with ``verify`` the bytes) of the recomputed saved tensors are
  compared with the forward's (:class:`SavedChecks`, which the pack hook fills).

A checkpoint met *during* a replay runs eagerly (its saved tensors are kept): the enclosing
transaction already restores and reinstates its state.
"""
from __future__ import annotations

import contextlib
import uuid
import weakref
from collections import defaultdict
from typing import Any, Callable

import torch

from stateremat.contract import internal_assert, rule

from ._compat import (
    SavedTensor,
    TorchDispatchMode,
    current_graph_id,
    entered_hiding,
    in_graph_exec_group,
    library_ops,
    make_saved_tensor,
    tree_flatten,
    tree_unflatten,
)
from ._errors import ReplayDivergenceError, ReplayError
from ._runtime import Runtime, runtime
from ._txn import Transaction
from ._watch import Watch


class _Holder:
    __slots__ = ("handles", "kept", "__weakref__")

    def __init__(self) -> None:
        self.handles: dict[Any, _Handle | None] = {}
        #: ``(tensor, version)`` kept by a forward that may fall back to eager (``state="auto"``)
        self.kept: tuple[torch.Tensor, int] | None = None


class _Handle:
    __slots__ = ("__weakref__",)


def _unpack_kept(kept: tuple[torch.Tensor, int]) -> torch.Tensor:
    """A kept saved tensor, refused as eager's autograd refuses it if written in place since."""
    x, version = kept
    if x._version != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace "
            f"operation: [{x.type()} {list(x.shape)}] is at version {x._version}; expected version "
            f"{version} instead (a segment that ran eagerly under state='auto' keeps its saved tensors "
            "as eager does). Tip: make the later write out-of-place, as without checkpointing.")
    return x


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


#: The replay draws torch's random numbers as the forward did, not Python's or NumPy's (their state
#: is not kept: reading it costs more than most segments' bookkeeping); a branch on them diverges.
RANDOM_TIP = ("a branch on Python's random or numpy.random (LayerDrop, stochastic depth) takes another "
              "way in the replay: draw from torch's generator instead (e.g. torch.rand(()) < p, which the "
              "replay reproduces) or draw outside and pass it in (checkpoint(fn, x, random.random())).")


class SavedChecks:
    """What a recomputation is checked against (torch's ``_CheckpointFrame`` metadata checks): the
    shape, dtype and device of each tensor the forward saved, with ``verify`` a copy of it (R4),
    with ``debug`` the operators of the forward and of the last recomputation (for messages).

    Args:
        name: segment name for messages.
        verify: keep a copy of each saved tensor and compare the recomputed ones bit for bit.
        debug: record the operators (``_OpLog``).
        check_metadata: compare the recomputed saved tensors' metadata with the forward's.
    """

    def __init__(self, name: str, verify: bool, debug: bool, check_metadata: bool) -> None:
        self.name = name
        self.verify = verify
        self.check_metadata = check_metadata
        self.debug_ops: tuple[list[str], list[str]] | None = ([], []) if debug else None
        self.metas: list[tuple] = []
        self.originals: list[torch.Tensor] = []
        self.mismatch: dict[Any, list[str]] = defaultdict(list)

    def saved(self, x: torch.Tensor) -> None:
        """The forward saved ``x`` (the pack hook)."""
        self.metas.append((tuple(x.shape), x.dtype, x.device))
        if self.verify:
            with library_ops():
                self.originals.append(x.detach().clone())

    def oplog(self, recomputation: bool) -> Any:
        """Context recording the forward's (or, cleared first, the recomputation's) operators when ``debug``."""
        if self.debug_ops is None:
            return contextlib.nullcontext()
        ops = self.debug_ops[1 if recomputation else 0]
        ops.clear()
        return _OpLog(ops)

    def compare(self, gid: Any, idx: int, x: torch.Tensor) -> None:
        """``verify``: note a recomputed saved tensor that differs from the forward's bit for bit (R4)."""
        if not self.verify:
            return
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

    def debug_text(self, msg: str) -> str:
        """``msg`` with the operators of the forward and the recomputation (``debug=True``)."""
        if self.debug_ops is None:
            return msg + " (set debug=True for the operators of the forward and the recomputation)"
        fwd, rec = self.debug_ops
        return (f"{msg}\nOperators of the original forward ({len(fwd)}):\n  " + "\n  ".join(fwd)
                + f"\nOperators of the recomputation ({len(rec)}):\n  " + "\n  ".join(rec))

    def check(self, gid: Any, holders: list[weakref.ref], got: int, recomputed: Any, count: bool = True) -> None:
        """After recomputation ``gid`` saved ``got`` tensors (``recomputed``: handle -> tensor): their
        number (unless not ``count``), metadata and (``verify``) bytes against the forward's.

        Raises:
            ReplayError: another number of saved tensors, or other metadata (torch's phrases kept).
            ReplayDivergenceError: ``verify`` found different bytes (R4).
        """
        n = len(holders)
        if got != n and count:
            raise ReplayError(self.debug_text(
                f"stateremat.torch.checkpoint: segment {self.name!r}: A different number of tensors was saved "
                f"during the original forward and recomputation (expected {n}, got {got}). Tip: make the segment's "
                "control flow depend only on its inputs and state; " + RANDOM_TIP))
        for idx, ref in enumerate(holders if self.check_metadata else ()):
            holder = ref()
            if holder is None or holder.handles.get(gid) is None:
                continue
            x = recomputed[holder.handles[gid]]
            meta = (tuple(x.shape), x.dtype, x.device)
            if meta != self.metas[idx]:
                raise ReplayError(self.debug_text(
                    f"stateremat.torch.checkpoint: segment {self.name!r}: Recomputed values for the following tensors "
                    f"have different metadata than during the forward pass: saved tensor #{idx} has different metadata at recomputation (expected {self.metas[idx]}, got {meta}). "
                    "Tip: declare the state the segment reads and mutates (state=...)."))
        if self.mismatch.get(gid):
            raise ReplayDivergenceError(
                f"stateremat.torch.checkpoint(verify=True): segment {self.name!r} recomputed saved "
                f"tensors that differ from the forward's bit for bit ({rule('R4')}): "
                + "; ".join(self.mismatch[gid])
                + ". Tip: declare the state the segment mutates and keep preserve_rng_state=True."
            )


def _release(txn: Transaction, rt: Runtime) -> None:
    txn.release()
    rt.counters.live_segments -= 1
    rt.counters.touch()


class Frame:
    """Inputs, holders and the saved-tensor hooks of one checkpointed forward, and its recomputation.

    Args:
        rt: the runtime of the thread running the forward.
        fn: the segment function.
        name: segment name for messages.
        txn: the segment's transaction, begun; released when this frame is garbage (no graph
            needs it).
        args, kwargs: the forward's arguments (saved as inputs).
        verify: keep copies of saved tensors and compare bit for bit at recomputation (R4).
        sink: replay counter of a wrapper, or None.
        early_stop: stop the recomputation once every saved tensor is recomputed.
        debug: record the ops of the forward and recomputation for error messages.
        check_metadata: compare shape/dtype/device of recomputed saved tensors.
        recompute_context: entered around the recomputation (``context_fn``'s second).
        keep: keep the saved tensors until :meth:`settle` decides (``state="auto"`` after its
            first step: a write found only at the forward's end makes this forward eager).
    """

    def __init__(self, rt: Runtime, fn: Callable, name: str, txn: Transaction, args: tuple, kwargs: dict, *,
                 verify: bool, sink: RecomputeSink | None, early_stop: bool = True, debug: bool = False,
                 check_metadata: bool = True, recompute_context: Any = None, keep: bool = False) -> None:
        self.rt = rt
        self.keep = keep
        self.eager = False  # settle(eager=True): the saved tensors are kept, nothing replays
        self.fn = fn
        self.name = name
        self.txn = txn
        rt.counters.live_segments += 1
        weakref.finalize(self, _release, txn, rt)
        self.sink = sink
        #: state="auto" (``keep``) replays run on, watched, past torch's early-stop point once a
        #: watched forward wrote state no scan reaches (``Runtime.unreached_writes``): such a
        #: write after the last saved tensor is then seen (refused, R7), where stopping would skip
        #: it and let the replay read the advanced value; surplus saved tensors are ignored there
        self.run_on = keep and early_stop and rt.unreached_writes and \
            (recompute_context is None or type(recompute_context) is contextlib.nullcontext)
        self.early_stop = early_stop and not self.run_on
        self.checks = SavedChecks(name, verify, debug, check_metadata)
        self.recompute_context: Any = recompute_context if recompute_context is not None else contextlib.nullcontext()
        self.watch: Watch | None = None  # set by run()
        self.weak_holders: list[weakref.ref] = []
        self.recomputed: defaultdict = defaultdict(weakref.WeakKeyDictionary)
        self.recomp_counter: defaultdict = defaultdict(int)
        self.is_recomputed: defaultdict = defaultdict(bool)
        self.forward_completed = False  # backward inside the forward (torch's Rule 6) recomputes early
        self.ignore_saved_mismatch = False
        self.save_inputs(args, kwargs)

    # -- inputs (Rule 2 of torch's note: inputs are saved tensors of the enclosing segment) --
    def save_inputs(self, args: tuple, kwargs: dict) -> None:
        if not kwargs and all(type(a) is torch.Tensor for a in args):
            leaves, self._spec = list(args), None  # the common case, without pytree
        else:
            leaves, self._spec = tree_flatten((args, kwargs))
        self._saved = [
            x if isinstance(x, torch.Tensor) and self.txn.holds_input(x, f"input of segment {self.name!r}")
            else make_saved_tensor(x) if isinstance(x, torch.Tensor) else x
            for x in leaves
        ]
        self._leaves = leaves  # (the saved tensors hold them too)

    def inputs(self) -> tuple[tuple, dict]:
        leaves = [self._unpack_input(i, x) if isinstance(x, SavedTensor) else x for i, x in enumerate(self._saved)]
        return (tuple(leaves), {}) if self._spec is None else tree_unflatten(leaves, self._spec)

    def _unpack_input(self, i: int, x: SavedTensor) -> torch.Tensor:
        """An input's saved tensor; one the forward wrote in place after declaring it (state="auto"
        found it is also state the segment reaches, e.g. a dict it holds) is restored by the
        transaction, so the tensor itself is handed on (torch's version check would refuse it)."""
        try:
            return x.unpack()
        except RuntimeError:
            t = self._leaves[i]
            # only state (declared under a name that is no input's); an input itself keeps torch's error
            if not t.requires_grad and self.txn.declares_as_state(t) and \
                    self.txn.holds_input(t, f"input of segment {self.name!r}"):
                return t
            raise

    # -- forward -------------------------------------------------------------------------
    def run(self, watch: Watch, args: tuple, kwargs: dict) -> Any:
        """Run the forward under the pack hook (and ``watch``'s mode); the output."""
        self.watch = watch
        with watch.forward_mode(), self.forward_hooks(), self.checks.oplog(recomputation=False):
            out = self.fn(*args, **kwargs)
        self.forward_completed = True
        return out

    def settle(self, eager: bool) -> None:
        """After the forward (``keep``): hand the saved tensors to backward as they are
        (``eager``: the segment wrote state it did not preserve, so it must not replay), or drop
        them (activations freed, as a checkpoint does)."""
        self.keep = False
        self.eager = eager
        if eager:
            self.txn.release()
            return
        for ref in self.weak_holders:
            holder = ref()
            if holder is not None:
                holder.kept = None

    def undeclared_at_replay(self, w: torch.Tensor, func: Any, what: str) -> None:
        """The replay is about to write undeclared ``w``: the watch decides, naming it from our inputs."""
        self.watch.undeclared_at_replay(w, func, what, self.inputs)

    # -- hooks ---------------------------------------------------------------------------
    def forward_hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        seg = self

        def pack(x: torch.Tensor) -> _Holder:
            holder = _Holder()
            seg.weak_holders.append(weakref.ref(holder))
            seg.checks.saved(x)
            if seg.keep:
                holder.kept = (x, x._version)
            return holder

        def unpack(holder: _Holder) -> torch.Tensor:
            if holder.kept is not None:
                return _unpack_kept(holder.kept)
            internal_assert(not seg.eager, "an eager segment's holder lost its saved tensor")
            gid: Any = current_graph_id()
            if gid is None:
                gid = int(uuid.uuid4())
            if not seg.is_recomputed[gid]:
                seg.recompute(gid)
            internal_assert(gid in holder.handles, "holder has no handle for this backward")
            handle = holder.handles[gid]
            if handle is None:
                raise ReplayError(
                    f"stateremat.torch.checkpoint: segment {seg.name!r}: Unpack is being triggered for a "
                    "tensor that was already unpacked once (expected each saved tensor unpacked once per "
                    "backward, got twice" + (
                        "; two backward calls of one torch.utils.checkpoint.GraphExecGroup that need the same "
                        "saved activation" if in_graph_exec_group() else "")
                    + "). Tip: read ctx.saved_tensors only once in custom autograd Functions."
                )
            out = seg.recomputed[gid][handle]
            holder.handles[gid] = None
            return out

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def _recompute_hooks(self, gid: Any, log: Any) -> torch.autograd.graph.saved_tensors_hooks:
        seg = self
        keep = log.keep_saved  # R1: saved aliases of declared state keep the replayed bytes (_txn)

        def pack(x: torch.Tensor) -> torch.Tensor:
            x = x.detach() if x.requires_grad else x
            idx = seg.recomp_counter[gid]
            if idx >= len(seg.weak_holders) and seg.run_on and seg.forward_completed:
                return x  # past the early-stop point (run_on): not counted, as early stop saves none
            seg.recomp_counter[gid] += 1
            if idx >= len(seg.weak_holders) and not seg.forward_completed:
                # a backward inside the forward (early stop off) recomputes the whole function
                # while the forward is still saving tensors (torch's Rule 6)
                seg.ignore_saved_mismatch = True
                return x
            if idx >= len(seg.weak_holders):
                raise ReplayError(seg.checks.debug_text(
                    f"stateremat.torch.checkpoint: segment {seg.name!r}: trying to save more tensors during "
                    f"recomputation than during the original forward pass (expected {len(seg.weak_holders)}). Tip: "
                    "make the segment's control flow depend only on its inputs and state; " + RANDOM_TIP))
            holder = seg.weak_holders[idx]()
            if holder is not None:
                seg.checks.compare(gid, idx, x)
                handle = holder.handles[gid] = _Handle()
                seg.recomputed[gid][handle] = keep(x, seg.recomputed[gid], handle)
            if seg.early_stop and seg.recomp_counter[gid] == len(seg.weak_holders):
                raise _StopRecomputation
            return x

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x)

    # -- recomputation -------------------------------------------------------------------
    def recompute(self, gid: Any) -> None:
        """Re-run the segment once for backward ``gid`` inside the replay transaction."""
        replay = self.txn.replay(self)  # refuses first: changed reads (R2, auto), parameters (R8)
        args, kwargs = self.inputs()
        oplog = self.checks.oplog(recomputation=True)
        versions = self.watch.versions()
        with replay as log:  # everything put back, in the order _txn's docstring numbers
            with self._recompute_hooks(gid, log), torch.autograd.enable_grad(), \
                    entered_hiding(self.recompute_context), self.watch.replay_mode(self), oplog:
                try:
                    self.fn(*args, **kwargs)
                except _StopRecomputation:
                    pass
        self.is_recomputed[gid] = True
        self.rt.counters.recompute_count += 1
        if self.sink is not None:
            self.sink.recompute_count += 1
        self.watch.report_replay_writes(versions)
        self.checks.check(gid, self.weak_holders, self.recomp_counter[gid], self.recomputed[gid],
                          count=not self.ignore_saved_mismatch)
