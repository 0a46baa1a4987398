"""``checkpoint``: non-reentrant activation checkpointing with a state transaction (§3.1, §5).

The public forms (:func:`checkpoint`, :class:`Checkpointer`) validate their options and call
:func:`run_segment`, which wires one segment's three rooms in data-flow order: the
:class:`~._txn.Transaction` begins (forward: ``B0``, ``R0``, bindings), the :class:`~._frame.Frame`
saves the inputs and runs the forward (pack), the :class:`~._watch.Watch` observes it; in
backward the frame's unpack hook recomputes inside the transaction (restore → recompute →
reinstate). A segment met inside a replay, or under ``torch.utils.checkpoint``'s recomputation,
runs eagerly (:func:`_run_eagerly`).
"""
from __future__ import annotations

import contextlib
import reprlib
import functools
import inspect
from typing import Any, Callable

import torch

from stateremat.contract import rule

from . import _learn
from ._compat import (
    DisableTorchFunctionSubclass,
    debug_override,
    eager_only,
    early_stop_override,
    entered_hiding,
    has_storage,
    in_foreign_recompute,
    in_functorch_transform,
    make_saved_tensor,
    tree_flatten,
)
from ._compiled import warn_compiled
from ._errors import ReplayError, UnsupportedError
from ._frame import Frame, RecomputeSink
from ._mode import strict_forward
from ._preserve import PRESERVERS
from ._runtime import runtime
from ._scan import Declared, check_state, describe, reach, resolve_state, root_module
from ._storage import storage_key
from ._structure import StructureWatch
from ._txn import Transaction
from ._watch import Watch

UNDECLARED_OPTIONS = ("raise", "warn", "declare")
#: The largest ``granularity_bytes``: rounded byte offsets stay 64-bit integers.
MAX_GRANULARITY_BYTES = 2**62


def check_flag(api: str, name: str, value: Any) -> None:
    """Refuse a switch that is not ``True``/``False`` (``verify="yes"``, ``debug=2``), which
    would otherwise be taken by its truth value without a word.

    Raises:
        TypeError: ``value`` is not a bool (the argument named).
    """
    if not isinstance(value, bool):
        raise TypeError(f"{api}: {name} must be True or False, got {value!r} ({type(value).__name__}). "
                        f"Tip: pass {name}=True to turn it on.")


def _validate(fn: Any, preserve: str, granularity_bytes: int | None, on_undeclared: str) -> None:
    if not callable(fn):
        raise TypeError(f"stateremat.torch.checkpoint: fn must be callable, got {type(fn).__name__}. "
                        "Tip: pass the function or module to run, then its arguments.")
    _validate_options(preserve, granularity_bytes, on_undeclared)


def _validate_options(preserve: str, granularity_bytes: int | None, on_undeclared: str) -> None:
    if preserve not in PRESERVERS:
        raise ValueError(f"stateremat.torch.checkpoint: preserve must be one of {tuple(PRESERVERS)} (the "
                         f"replaying options of stateremat.contract.OPTIONS), got {preserve!r}. Tip: 'region' "
                         "journals only written bytes; for 'eager' simply do not checkpoint the segment.")
    if granularity_bytes is not None and (isinstance(granularity_bytes, bool) or not isinstance(
            granularity_bytes, int) or granularity_bytes <= 0):
        raise ValueError("stateremat.torch.checkpoint: granularity_bytes must be a positive int or None, got "
                         f"{granularity_bytes!r}. Tip: None (the default) keeps exactly the written bytes.")
    if granularity_bytes is not None and granularity_bytes > MAX_GRANULARITY_BYTES:
        raise ValueError("stateremat.torch.checkpoint: granularity_bytes must be at most 2**62 (4 EiB, past any "
                         f"storage: byte offsets are 64-bit), got {granularity_bytes!r}. Tip: a granularity at "
                         "least a storage's size journals the whole storage on each write; preserve='whole' "
                         "snapshots it once.")
    if on_undeclared not in UNDECLARED_OPTIONS:
        raise ValueError(f"stateremat.torch.checkpoint: on_undeclared must be one of {UNDECLARED_OPTIONS}, "
                         f"got {on_undeclared!r}. Tip: keep 'raise' unless you know the write is benign.")


DETERMINISM_CHECKS = ("default", "none")


#: Keyword options of the stateremat form (:func:`checkpoint`); torch reserves the others below.
OPTION_KEYWORDS = ("state", "preserve", "granularity_bytes", "on_undeclared", "verify")


_KEYWORDS_OF: dict[Any, frozenset[str]] = {}  # code object / type -> declared parameter names


def _declared_keywords(fn: Any) -> frozenset[str]:
    """Parameter names ``fn`` declares explicitly (empty when its signature is unknown)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if code is not None and not isinstance(fn, functools.partial) and code in _KEYWORDS_OF:
        return _KEYWORDS_OF[code]
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    names = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    if code is not None and not isinstance(fn, functools.partial):
        _KEYWORDS_OF[code] = names
    return names


class Checkpointer:
    """A checkpoint function configured once, called with exactly torch's signature.

    ``ckpt = Checkpointer(state="buffers", preserve="whole")`` returns a callable used like
    ``torch.utils.checkpoint.checkpoint``: ``ckpt(fn, *args, use_reentrant=None,
    context_fn=..., determinism_check="default", debug=False, early_stop=True,
    preserve_rng_state=True, **kwargs)``; every other keyword reaches ``fn``. This is the form
    framework hooks expect (a model's ``gradient_checkpointing_func``, ``checkpoint_seq``).

    Args:
        state: ``"auto"`` (default: the state the segment writes is found and preserved), or
            declared state, as in :func:`checkpoint`; ``"buffers"`` means every buffer of the
            module ``fn`` belongs to (``fn`` a module, a bound method such as ``layer.__call__``,
            or a ``functools.partial`` of one).
        preserve: ``"region"`` (journal written bytes) or ``"whole"`` (snapshot every byte).
        granularity_bytes: region journal rounding: ``None`` (default) keeps exactly the bytes
            each write changes (runs closer than 16 bytes merged); an int rounds every write out
            to multiples of that many bytes.
        on_undeclared: ``"raise"``, ``"warn"`` or ``"declare"`` (see :func:`checkpoint`).
        verify: debugging mode of :func:`checkpoint` (every op watched, saved tensors compared).
        name: the segment's module path in the model (``"layers.3"``); errors call the segment
            by it and name its tensors from the model's root (``layers.3.norm.running_mean``).

    Raises:
        ValueError / TypeError: an unknown option value, at construction.

    References:
        Paper §3.1, §5.
    """

    def __init__(self, *, state: Any = "auto", preserve: str = "region", granularity_bytes: int | None = None,
                 on_undeclared: str = "raise", verify: bool = False, name: str | None = None) -> None:
        _validate_options(preserve, granularity_bytes, on_undeclared)
        check_state(state)
        check_flag("stateremat.torch.Checkpointer", "verify", verify)
        self.state = state
        self.preserve = preserve
        self.granularity_bytes = granularity_bytes
        self.on_undeclared = on_undeclared
        self.verify = verify
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Checkpointer: name must be a str (the segment's module path), got "
                            f"{type(name).__name__}. Tip: e.g. name='layers.3'.")
        self.name = name

    def __repr__(self) -> str:
        return (f"Checkpointer(state={self.state!r}, preserve={self.preserve!r}, granularity_bytes="
                f"{self.granularity_bytes}, on_undeclared={self.on_undeclared!r}, verify={self.verify}"
                + (f", name={self.name!r})" if self.name else ")"))

    @eager_only
    def __call__(self, function: Callable, *args: Any, use_reentrant: bool | None = None,
                 context_fn: Callable[[], tuple[Any, Any]] | None = None, determinism_check: str = "default",
                 debug: bool = False, early_stop: bool = True, **kwargs: Any) -> Any:
        preserve_rng_state = kwargs.pop("preserve_rng_state", True)
        return _run(function, args, kwargs, state=self.state, preserve=self.preserve,
                    granularity_bytes=self.granularity_bytes, on_undeclared=self.on_undeclared,
                    verify=self.verify, preserve_rng_state=preserve_rng_state, use_reentrant=use_reentrant,
                    context_fn=context_fn, determinism_check=determinism_check, debug=debug,
                    early_stop=early_stop, name=self.name)


@eager_only
def checkpoint(fn: Callable, *args: Any, state: Any = "auto", preserve: str = "region",
               granularity_bytes: int | None = None, on_undeclared: str = "raise", verify: bool = False,
               use_reentrant: bool | None = None, context_fn: Callable[[], tuple[Any, Any]] | None = None,
               determinism_check: str = "default", debug: bool = False, early_stop: bool = True,
               **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` without keeping its activations; replay it transactionally in backward.

    Like ``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)``, but declared
    state is restored to the bytes it had when the segment's forward began before the replay
    and reinstated afterwards, together with the RNG state; a buffer update (BatchNorm running
    statistics, a queue enqueue) therefore happens exactly once per forward.

    The stateremat keywords (``state``, ``preserve``, ``granularity_bytes``, ``on_undeclared``,
    ``verify``) are taken by this function; if ``fn`` declares a parameter of one of those names,
    the call is refused (use :class:`Checkpointer`, whose call has exactly torch's signature).

    Args:
        fn: the segment; a function or ``nn.Module``.
        *args: positional arguments of ``fn`` (tensors of any shape and dtype, or other objects).
        state: ``"auto"`` (default): every pre-existing tensor the segment writes in place is
            found and preserved, and every Python binding it rebinds replayed as of the forward,
            with no declaration (on a segment's first step every op is watched and a tensor is
            snapshotted before its first write; later steps declare the tensors found before up
            front, and a forward that writes a new one keeps its activations that step instead
            of replaying: see ``stateremat.torch._learn``). Strict mode, for those who want
            declarations: a tensor, an ``nn.Module`` (all its buffers), a ``torch.Generator``, a
            list of them, ``"buffers"`` (every buffer of ``fn``, which must then be an
            ``nn.Module``) or ``None`` (nothing); then an undeclared write is handled by
            ``on_undeclared``.
        preserve: ``"region"`` journals only the bytes written (default) or ``"whole"``
            snapshots, when the forward begins, every byte of each declared tensor's storage
            (a declared view of a larger tensor costs the whole storage: its other bytes may be
            read and written through aliases).
        granularity_bytes: region journal rounding: ``None`` (default) keeps exactly the bytes
            each write changes (runs closer than 16 bytes merged); an int rounds every write out
            to multiples of that many bytes.
        on_undeclared: strict mode: an in-place write inside the segment to a pre-existing tensor
            that is not declared: ``"raise"`` :class:`UndeclaredStateError`, ``"warn"`` (the
            replay repeats the write) or ``"declare"`` (snapshot it whole before the first
            write). With ``state="auto"``, ``"warn"`` and ``"declare"`` ask for that mode with
            nothing declared (``state=None``).
        verify: debugging mode: every op of the forward and the replay is watched, so undeclared
            writes are refused before they happen even through aliases the scan does not reach,
            and every recomputed saved tensor is compared with the forward's bit for bit (keeps
            a copy of each: doubles activation memory; about 5 us more per op).
        use_reentrant: accepted for drop-in compatibility with ``torch.utils.checkpoint``;
            only ``False``/``None`` (non-reentrant) is supported.
        context_fn: as in ``torch.utils.checkpoint``: returns two context managers, entered
            around the forward and around the recomputation respectively.
        determinism_check: ``"default"`` compares shape, dtype and device of every recomputed
            saved tensor with the forward's; ``"none"`` skips that comparison (as in torch).
        debug: as in torch: errors about the recomputation include the operators run.
        early_stop: as in torch: stop the recomputation once every saved tensor is recomputed
            (``torch.utils.checkpoint.set_checkpoint_early_stop`` overrides it).
        **kwargs: keyword arguments of ``fn``; ``preserve_rng_state`` (default True) is taken
            as in torch: replay with the forward's generator states (CPU, initialized CUDA
            devices, and generators the segment reaches). ``False`` is a negative control.

    Returns:
        Whatever ``fn`` returns.

    Raises:
        TypeError: ``fn`` is not callable, declares a parameter named like a stateremat
            keyword, ``state`` holds something other than tensors and modules, or ``verify`` /
            ``debug`` is not a bool.
        ValueError: an unknown ``preserve``/``on_undeclared``/``determinism_check``/``state``
            string, a bad ``granularity_bytes`` (a positive int at most 2**62), or
            ``use_reentrant=True``.
        UnsupportedError: a declared tensor is not a dense strided tensor with storage.
        UndeclaredStateError: an undeclared pre-existing tensor was written in place (R7).
        ReplayError: CUDA was first initialized inside the segment (its RNG state is unknown);
            at recomputation, state cannot be reconstructed exactly (R8), or the replay saved
            different tensors. It subclasses ``torch.utils.checkpoint.CheckpointError``.
        ReplayDivergenceError: ``verify=True`` and a recomputed saved tensor differs (R4).

    Danger:
        Writes that bypass the dispatcher and version counters are invisible.

    References:
        Paper §3 (eq. 2), §3.1 (selective preservation, the transaction), §5.
    """
    clash = sorted(_declared_keywords(fn) & set(OPTION_KEYWORDS)) if callable(fn) else []
    if clash:
        raise TypeError(
            f"stateremat.torch.checkpoint: {_segment_name(fn)!r} declares parameter(s) {clash}, which this "
            "function takes as its own options (expected a function without those parameter names, got "
            f"{clash}). Tip: use stateremat.torch.Checkpointer(state=..., preserve=...)(fn, *args, "
            "**kwargs): it passes every keyword torch does not reserve on to fn.")
    check_state(state)
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    return _run(fn, args, kwargs, state=state, preserve=preserve, granularity_bytes=granularity_bytes,
                on_undeclared=on_undeclared, verify=verify, preserve_rng_state=preserve_rng_state,
                use_reentrant=use_reentrant, context_fn=context_fn, determinism_check=determinism_check,
                debug=debug, early_stop=early_stop)


def _run(fn: Callable, args: tuple, kwargs: dict, *, state: Any, preserve: str, granularity_bytes: int | None,
         on_undeclared: str, verify: bool, preserve_rng_state: bool, use_reentrant: bool | None,
         context_fn: Any, determinism_check: str, debug: bool, early_stop: bool,
         name: str | None = None) -> Any:
    _validate(fn, preserve, granularity_bytes, on_undeclared)
    for flag, value in (("verify", verify), ("debug", debug), ("early_stop", early_stop),
                        ("preserve_rng_state", preserve_rng_state)):
        check_flag("stateremat.torch.checkpoint", flag, value)
    if context_fn is not None and not callable(context_fn):
        raise TypeError(f"stateremat.torch.checkpoint: context_fn must be a function returning two context "
                        f"managers (forward, recomputation), got {type(context_fn).__name__}. Tip: e.g. "
                        "context_fn=functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts, "
                        "policy), or leave it out.")
    if use_reentrant:
        raise ValueError("stateremat.torch.checkpoint: use_reentrant must be False or None: a state transaction "
                         "is only supported when use_reentrant=False (expected the non-reentrant saved-tensor-hooks "
                         "implementation, got True). Tip: drop the argument.")
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"stateremat.torch.checkpoint: determinism_check must be one of {DETERMINISM_CHECKS}, "
                         f"got {determinism_check!r}. Tip: verify=True compares recomputed values bit for bit.")
    if isinstance(state, str) and state == "auto" and on_undeclared != "raise":
        state = None  # an explicit on_undeclared mode asks for strict mode with nothing declared
    if isinstance(state, str) and state != "auto":
        owner = root_module(fn)
        if state != "buffers" or owner is None:
            raise ValueError(f"stateremat.torch.checkpoint: state='buffers' needs fn to be an nn.Module, a bound "
                             f"method of one or a functools.partial of those (got state={state!r}, fn of type "
                             f"{type(fn).__name__}). Tip: pass the tensors or modules to declare, e.g. "
                             "state=[model.bn].")
        state = owner
    debug = debug_override() if debug_override() is not None else debug
    early_stop = early_stop_override() if early_stop_override() is not None else early_stop
    if debug and context_fn is not None:
        raise ValueError("stateremat.torch.checkpoint: debug=True is incompatible with a context_fn (expected "
                         "one of them, got both), as in torch. Tip: drop context_fn while debugging.")
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)  # no graph, nothing will be replayed
    forward_ctx, recompute_ctx = (contextlib.nullcontext(), contextlib.nullcontext()) \
        if context_fn is None else _contexts(context_fn)
    with entered_hiding(forward_ctx):
        return run_segment(fn, args, kwargs, state=state, preserve=preserve, granularity_bytes=granularity_bytes,
                           on_undeclared=on_undeclared, verify=verify, preserve_rng_state=preserve_rng_state,
                           recompute_context=recompute_ctx, check_metadata=determinism_check == "default",
                           early_stop=early_stop, debug=debug, name=name, module_prefix=name or "")


def _contexts(context_fn: Callable[[], Any]) -> tuple[Any, Any]:
    """``context_fn()``: the forward's and the recomputation's context managers.

    Raises:
        TypeError: it returned anything but two context managers.
    """
    pair = context_fn()
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(hasattr(c, "__enter__") and hasattr(c, "__exit__") for c in pair)):
        raise TypeError(f"stateremat.torch.checkpoint: context_fn must return two context managers (the forward's "
                        f"and the recomputation's), got {reprlib.repr(pair)}. Tip: return e.g. "
                        "(contextlib.nullcontext(), contextlib.nullcontext()).")
    return pair[0], pair[1]


def _segment_name(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def run_segment(fn: Callable, args: tuple, kwargs: dict, *, state: Any, preserve: str, granularity_bytes: int | None,
                on_undeclared: str, verify: bool, preserve_rng_state: bool, name: str | None = None,
                module_prefix: str = "", sink: RecomputeSink | None = None,
                declared: Declared | None = None, on_done: dict | None = None,
                recompute_context: Any = None, check_metadata: bool = True, early_stop: bool = True,
                debug: bool = False) -> Any:
    """Run one checkpointed segment (shared by :func:`checkpoint` and ``StatefulCheckpoint``).

    The wiring of its three rooms, in data-flow order: the :class:`~._txn.Transaction` begins
    (``B0``, ``R0``, bindings), the :class:`~._frame.Frame` saves the inputs, the
    :class:`~._watch.Watch` records what the forward reaches; the frame runs the forward (packing
    saved tensors) while the watch observes; then the transaction and the watch note the
    forward's end. Backward, restore, recompute and reinstate follow in the frame's unpack hook.
    """
    name = name or _segment_name(fn)
    _refuse_transforms(name)
    auto = declared is None and isinstance(state, str) and state == _learn.AUTO
    if declared is None:
        declared = Declared() if auto else resolve_state(state, root_module(fn), module_prefix)
    rt = runtime()
    if _runs_eagerly(rt, name, declared):
        return _run_eagerly(fn, args, kwargs, declared)
    r = reach(fn, args, kwargs, module_prefix)
    _refuse_lazy(r, name)
    root = root_module(fn)  # (not `or fn`: bool() of a compiled module calls its __len__)
    warn_compiled(fn, r.modules, name, fn if root is None else root)  # a compiled block in it runs uncompiled
    if auto:  # the state it wrote before, declared up front (_learn)
        declared, on_undeclared = _learn.begin(rt, r.tensors)
    txn = Transaction(rt, declared, preserve, granularity_bytes, auto)
    txn.begin(r, args, kwargs, preserve_rng_state)
    frame = Frame(rt, fn, name, txn, args, kwargs, verify=verify, sink=sink, debug=debug,
                  early_stop=early_stop and not r.replay_to_end,  # see Reach.replay_to_end
                  check_metadata=check_metadata, recompute_context=recompute_context,
                  keep=auto)
    watch = Watch(rt, fn, name, txn, r, args, kwargs, on_undeclared=on_undeclared, verify=verify)
    shape = StructureWatch(r.modules, r.tensors)  # hooks and structure the forward may change (_structure)
    try:
        with watch.observing():
            out = frame.run(watch, args, kwargs)
            txn.end_forward(r.modules)
            watch.restructured = shape.changes(keep=not auto)
            if watch.restructured and not auto:  # strict mode: the replay must end as the forward did
                shape.refuse_removed(name)
                watch.reshaped = shape
            watch.end_forward()
            if auto:
                _learn.end(rt, r.tensors, on_undeclared, watch, frame)
    except BaseException:
        txn.release()
        raise
    txn.refuse_cuda_started(name)  # R3: a generator the forward's start did not know
    for enclosing in rt.forward:  # enclosing segments replay us too: our B0 is theirs
        enclosing.txn.adopt(txn)  # what the replay puts back: both halves, the transaction's
        enclosing.adopt(watch)  # what the enclosing watch no longer watches from its start
    if on_done is not None:
        on_done["retained"] = txn.retained()
    return out


def _refuse_transforms(name: str) -> None:
    """Raise UnsupportedError inside a torch.func transform."""
    if in_functorch_transform():
        raise UnsupportedError(
            f"stateremat.torch.checkpoint: segment {name!r} runs inside a torch.func "
            "transform (grad, vjp, vmap, jacrev, ...); expected plain autograd: the transforms do not support "
            "saved-tensor hooks, which checkpointing replays through (torch's own checkpoint refuses them too). "
            "Tip: call the function without checkpoint under torch.func, or use loss.backward() / "
            "torch.autograd.grad.")


def _runs_eagerly(rt: Any, name: str, declared: Declared) -> bool:
    """Is the segment met where it must run eagerly (an enclosing replay restores its state)?

    Raises:
        ReplayError: torch.utils.checkpoint recomputes a segment that declares state.
    """
    if rt.replay:
        return True  # met during an enclosing segment's replay: that transaction restores our state
    if in_foreign_recompute():
        if declared.tensors:
            raise ReplayError(
                f"stateremat.torch.checkpoint: segment {name!r} declares state and is being "
                "recomputed by torch.utils.checkpoint, which would write that state a second time outside any "
                f"transaction (expected stateremat segments to be replayed only by stateremat; {rule('R5')}). "
                "Tip: checkpoint the enclosing code with stateremat.torch.checkpoint instead; they nest."
            )
        return True
    return False


def _refuse_lazy(r: Any, name: str) -> None:
    lazy = [describe(n) for n, t in r.tensors.values() if torch.nn.parameter.is_lazy(t)]
    if lazy:
        raise ValueError(f"stateremat.torch.checkpoint: segment {name!r} reaches uninitialized lazy "
                         f"parameters/buffers ({', '.join(lazy[:3])}); their first forward creates them, which "
                         "a replay cannot repeat. Tip: run one forward in evaluation mode without gradients before "
                         "checkpointing (model.eval(); with torch.no_grad(): model(x); model.train()): in training "
                         "mode that forward would also update BatchNorm statistics and draw dropout's random numbers.")


def _identity(x: Any) -> Any:
    return x


def _detached(x: torch.Tensor) -> torch.Tensor:
    # as torch's recomputation hook: a saved output must not hold its own grad_fn (a C++ cycle)
    return x.detach() if x.requires_grad else x


def _run_eagerly(fn: Callable, args: tuple, kwargs: dict, declared: Declared) -> Any:
    """Run a segment met inside a replay: its saved tensors are kept, nothing is deferred.

    Its inputs are packed as saved tensors of the enclosing segment, exactly as in the
    forward (torch's Rule 2), so the enclosing recomputation counts the same tensors.
    """
    with DisableTorchFunctionSubclass():
        keys = {storage_key(t) for _, t, _ in declared.tensors if has_storage(t)}
        for x in tree_flatten((args, kwargs))[0]:
            if isinstance(x, torch.Tensor) and not (has_storage(x) and storage_key(x) in keys):
                make_saved_tensor(x)
    with torch.autograd.graph.saved_tensors_hooks(_detached, _identity):
        return fn(*args, **kwargs)


def journal_writes() -> contextlib.AbstractContextManager[None]:
    """Journal writes to declared state made *outside* checkpointed segments (R6).

    Since the region journal marks its declared tensors, writes to them anywhere (an eager
    segment of a plan, an enqueue after the model, an optimizer step) are journaled
    automatically; this context is kept for code written against earlier versions. It also
    watches every op while declared tensors of a class that cannot be marked (a tensor
    subclass with its own ``__torch_function__``) are journaled.

    Returns:
        A context manager; nesting it (or entering it inside a segment) is free.

    References:
        Paper §3.1 (the union of a segment's own and later destroying writes).
    """
    rt = runtime()
    if rt.strict_depth or not any(st.unmarkable for st in rt.storages.values()):
        return contextlib.nullcontext()
    return strict_forward(rt)
