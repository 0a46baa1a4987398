"""Every private torch symbol stateremat uses, behind one door.

The segment frame follows ``torch.utils.checkpoint``'s non-reentrant design and needs a few
of its private pieces (saved-tensor construction, graph-task ids, autocast capture, version
counter reset, dispatch-mode control). They are imported here, once, and checked at import:
on a torch without them, ``import stateremat.torch`` fails with one message naming the
torch versions this package is tested with, instead of an ``AttributeError`` deep inside a
backward pass. Other modules import these names from here, never from ``torch._C`` or
``torch.utils._*`` directly.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from typing import Any, Callable, Iterator

import torch

#: torch releases this package is tested with (``pyproject.toml``'s ``torch`` extra).
SUPPORTED_TORCH = ">=2.13,<2.14"


def _missing(what: str, exc: BaseException) -> ImportError:
    return ImportError(
        f"stateremat.torch needs torch {SUPPORTED_TORCH} (found torch {torch.__version__}): a private "
        f"torch symbol it relies on is missing ({type(exc).__name__}: {what}). Tip: pip install "
        "'torch==2.13.0' (the version requirements.txt pins)."
    )


try:
    from torch._C._autograd import SavedTensor, _make_saved_tensor
    from torch._C._autograd import _top_saved_tensors_default_hooks, _unsafe_set_version_counter
    from torch._C import DisableTorchFunction, DisableTorchFunctionSubclass, _current_graph_task_id
    from torch.utils.checkpoint import (
        CheckpointError,
        DefaultDeviceType,
        GraphExecGroup,
        _get_autocast_kwargs,
        _infer_device_type,
    )
    import torch.utils.checkpoint as _tuc
    from torch.utils._python_dispatch import (
        TorchDispatchMode,
        _pop_mode,
        _push_mode,
        is_traceable_wrapper_subclass,
    )
    from torch._C import _get_dispatch_stack_at, _len_torch_dispatch_stack
    from torch.utils._pytree import tree_flatten, tree_unflatten
    import torch._C._dynamo.eval_frame as _eval_frame
    import torch.nn.utils.parametrize as _parametrize

    _parametrize._cache_enabled, _parametrize._cache

    _eval_frame._FrameExecStrategy, _eval_frame._FrameAction, _eval_frame.set_code_exec_strategy

    for _flag in ("_enable_checkpoint_early_stop", "_checkpoint_debug_enabled"):
        getattr(_tuc, _flag)
except (ImportError, AttributeError) as _exc:  # pragma: no cover - depends on the installed torch
    raise _missing(str(_exc), _exc) from _exc

__all__ = [
    "CheckpointError", "DisableTorchFunction", "DisableTorchFunctionSubclass", "GraphExecGroup", "SavedTensor", "TorchDispatchMode",
    "as_eager_class", "torch_function_kind", "autocast_kwargs", "eager_only", "current_graph_id", "early_stop_override", "debug_override", "has_storage",
    "dtensor_local", "dtensor_of", "in_foreign_recompute", "infer_device_type", "is_dtensor", "library_ops", "make_saved_tensor", "parametrize_cache_as_of",
    "parametrize_cache_of", "queue_backward_callback", "reset_versions",
    "tree_flatten", "tree_unflatten", "is_traceable_wrapper_subclass",
]


def eager_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` (and what it calls) eagerly under ``torch.compile``.

    The transaction's bookkeeping (saved-tensor hooks, snapshots, journal, version counters)
    is Python that graphs cannot hold; compiling a model that contains a checkpointed segment
    breaks the graph once at the segment and runs the segment eagerly, instead of tracing into
    the library and recompiling it.

    ``torch.compiler.disable`` imports ``torch._dynamo`` (seconds on a busy machine, in every
    spawned rank), so it is applied on the first call made once ``torch._dynamo`` is loaded:
    before that nothing can be compiling. The wrapper itself is never traced (its frame is
    skipped, and callers that dynamo traces break the graph at it, as at a disabled function).

    At a graph break of a model compiled with ``backend="inductor"`` whose random ops draw
    inductor's own random numbers (``torch._inductor.config.fallback_random`` off, the default), a
    segment that draws random numbers (dropout) is refused after its forward, before any
    backward: eagerly it draws torch's, so its masks would differ silently from the model compiled
    without the checkpoint (:func:`_refusing_eager_random`).
    """
    disabled: list[Callable[..., Any]] = []

    def checked(*args: Any, **kwargs: Any) -> Any:
        return _refusing_eager_random(fn, args, kwargs)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not disabled:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            disabled.extend(torch.compiler.disable(f, recursive=True) for f in (fn, checked))
        if _inductor_draws_its_own():
            return disabled[1](*args, **kwargs)
        return disabled[0](*args, **kwargs)

    call._torchdynamo_disable = True  # type: ignore[attr-defined]  # dynamo does not inline it
    return call


def compiling_backend() -> str | None:
    """Name of the ``torch.compile`` backend (``"inductor"``, ``"aot_eager"``, ...) whose compiled
    frame is running the caller at a graph break, or None outside any compiled frame."""
    get = getattr(_eval_frame, "get_eval_frame_callback", None)
    cb = get() if get is not None else None
    if cb is None or cb is False or not callable(cb):
        return None
    b = cb
    for _ in range(6):  # CatchErrorsWrapper -> ConvertFrame -> the backend (wrapped for debugging)
        b = getattr(b, "_torchdynamo_orig_backend", None)
        if b is None:
            return "unknown"
        name = getattr(b, "compiler_name", None) or getattr(b, "__name__", None)
        if isinstance(name, str):
            return name
    return "unknown"  # pragma: no cover - another torch's wrapping


def _inductor_draws_its_own() -> bool:
    """Is the caller run at a graph break of an inductor-compiled frame whose random ops draw
    inductor's own random numbers (``torch._inductor.config.fallback_random`` off)?"""
    if compiling_backend() != "inductor":
        return False
    config = sys.modules.get("torch._inductor.config")
    return not (config is not None and config.fallback_random)


#: ``stateremat.torch.UnsupportedError``, registered by ``_errors`` (which imports this module).
UNSUPPORTED: list[type[Exception]] = []


def _rng_states() -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def _refusing_eager_random(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run ``fn`` (a segment, eagerly at a graph break of an inductor-compiled model) and refuse
    it if it drew random numbers: eagerly they come from torch's generator, where the same model
    compiled without the checkpoint draws inductor's own (other dropout masks, other generator
    states), a silent difference from the compiled model without checkpointing."""
    before = _rng_states()
    out = fn(*args, **kwargs)
    after = _rng_states()
    if len(before) != len(after) or any(not torch.equal(a, b) for a, b in zip(before, after)):
        raise UNSUPPORTED[0](
            f"stateremat.torch: {getattr(fn, '__qualname__', fn)!r} ran a checkpointed segment that draws random "
            "numbers (dropout) inside a model compiled with torch.compile(backend='inductor'): the segment runs "
            "eagerly at a graph break and draws torch's random numbers, where inductor draws its own for the "
            "model compiled without the checkpoint, so dropout masks and the generator's state would differ "
            "silently from it (expected no random op in the segment, or inductor drawing torch's random "
            "numbers). Tip: set torch._inductor.config.fallback_random = True before compiling (inductor then "
            "draws torch's random numbers: results equal the compiled model without checkpointing to "
            "rounding), or compile with backend='aot_eager' (bitwise equal).")
    return out


def _skip_frames_of(fn: Callable[..., Any]) -> None:
    """Dynamo never compiles a frame of ``fn`` itself (the functions it calls are compiled as usual)."""
    _eval_frame.set_code_exec_strategy(
        fn.__code__, _eval_frame._FrameExecStrategy(_eval_frame._FrameAction.SKIP, _eval_frame._FrameAction.DEFAULT))


_skip_frames_of(eager_only(len))  # every eager_only wrapper shares this code object
for _f in (compiling_backend, _inductor_draws_its_own):  # run at the graph break: never compiled
    _skip_frames_of(_f)


_DEFAULT_TORCH_FUNCTION = torch.Tensor.__torch_function__.__func__
_KINDS: dict[type, str] = {}


def torch_function_kind(cls: type) -> str:
    """How tensor class ``cls`` takes part in the ``__torch_function__`` protocol: ``"default"``
    (torch's own handler: results converted to ``cls``), ``"disabled"`` (``Parameter``: never
    consulted) or ``"own"`` (a user handler)."""
    kind = _KINDS.get(cls)
    if kind is None:
        tf = getattr(cls, "__torch_function__", None)
        f = getattr(tf, "__func__", tf)
        kind = _KINDS[cls] = ("default" if f is _DEFAULT_TORCH_FUNCTION else
                              "disabled" if f is torch._C._disabled_torch_function_impl else "own")
    return kind


def as_eager_class(out: Any, func: Any, cls: type) -> Any:
    """``out`` of ``func`` run with torch functions of subclasses disabled, with the class torch's
    default ``__torch_function__`` of ``cls`` would give it (a user ``Tensor`` subclass's views and
    results stay of that subclass; ``Parameter`` and ``Tensor`` results are left as they are)."""
    if cls is torch.Tensor or torch_function_kind(cls) != "default" \
            or func in torch.overrides.get_default_nowrap_functions():
        return out
    return torch._tensor._convert(out, cls)


def make_saved_tensor(x: torch.Tensor) -> SavedTensor:
    """A saved tensor of ``x`` (packed by the current saved-tensor hooks, as torch's Rule 2)."""
    return _make_saved_tensor(x, is_output=False)


def infer_device_type(*tensors: torch.Tensor) -> str:
    """Device type of the given tensors, as ``torch.utils.checkpoint`` infers it (the first non-CPU
    device type, CUDA first; with none, torch's default device type — the current accelerator's,
    e.g. ``"cuda"`` — which all-CPU tensors get here without torch's helper, a hot path)."""
    if all(t.device.type == "cpu" for t in tensors if isinstance(t, torch.Tensor)):
        return DefaultDeviceType.get_device_type()
    return _infer_device_type(*tensors)


def autocast_kwargs(device_type: str) -> tuple[dict, dict]:
    """The current (device, cpu) autocast settings, to replay under the forward's autocast."""
    return _get_autocast_kwargs(device_type=device_type)


#: A module's forward hook tables (``register_forward_pre_hook`` / ``register_forward_hook`` and
#: their kwargs / always-called side tables: handle id -> hook or flag).
_MODULE_HOOK_TABLES = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                       "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def forward_hook_tables(m: torch.nn.Module) -> list[dict]:
    """``m``'s forward hook tables (the dicts themselves, which ``Module.__call__`` reads)."""
    d = m.__dict__
    return [d[n] for n in _MODULE_HOOK_TABLES if n in d]


def global_forward_hook_tables() -> list[dict]:
    """torch's global forward hook tables (``register_module_forward_pre_hook`` / ``_hook``)."""
    from torch.nn.modules import module as _module

    return [getattr(_module, n) for n in ("_global_forward_pre_hooks", "_global_forward_hooks",
                                          "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")
            if hasattr(_module, n)]


def parametrize_caching() -> bool:
    """True inside ``torch.nn.utils.parametrize.cached()`` now."""
    return bool(_parametrize._cache_enabled)


def parametrize_cache_of() -> tuple[int, dict]:
    """``torch.nn.utils.parametrize.cached()`` as of now: its nesting depth and a shallow copy of
    its cache (``{(id(module), tensor name): tensor}``; empty when caching is off), so a replay
    reads the parametrized tensors its forward read (a module used in two segments under one
    ``cached()`` reads, in the second, the tensor the first computed, not a new one)."""
    depth = _parametrize._cache_enabled
    return depth, (dict(_parametrize._cache) if depth else {})


@contextlib.contextmanager
def parametrize_cache_as_of(state: tuple[int, dict]) -> Iterator[None]:
    """Run with ``parametrize.cached()`` as :func:`parametrize_cache_of` recorded it (a copy of the
    cache: entries the replay adds do not reach the forward's record or the caller's cache), then
    put back the caller's depth and cache."""
    depth, cache = state
    before = (_parametrize._cache_enabled, _parametrize._cache)
    if not depth and not before[0]:
        yield  # caching off then and now: nothing to swap
        return
    _parametrize._cache_enabled, _parametrize._cache = depth, dict(cache)
    try:
        yield
    finally:
        _parametrize._cache_enabled, _parametrize._cache = before


def current_graph_id() -> Any:
    """Id of the running backward (graph task or exec group), or None outside backward."""
    gid: Any = GraphExecGroup._get_current_group()
    if gid is None:
        gid = _current_graph_task_id()
        if gid == -1:
            return None
    return gid


def in_graph_exec_group() -> bool:
    """Is a ``torch.utils.checkpoint.GraphExecGroup`` active (backward calls share one recomputation)?"""
    return GraphExecGroup._get_current_group() is not None


def queue_backward_callback(fn: Callable[[], None]) -> bool:
    """Run ``fn`` when the running backward finishes; False when torch offers no such hook here."""
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    if engine is None or not hasattr(engine, "queue_callback"):
        return False
    engine.queue_callback(fn)
    return True


def reset_versions(tensors: tuple[torch.Tensor, ...], versions: tuple[int, ...]) -> None:
    """Set version counters back (reinstatement restores bytes the forward left, R5)."""
    _unsafe_set_version_counter(tensors, versions)


def early_stop_override() -> bool | None:
    """``torch.utils.checkpoint.set_checkpoint_early_stop``'s setting (None: not set)."""
    return _tuc._enable_checkpoint_early_stop


def debug_override() -> bool | None:
    """``torch.utils.checkpoint.set_checkpoint_debug_enabled``'s setting (None: not set)."""
    return _tuc._checkpoint_debug_enabled


#: Tensor classes that are never wrapper subclasses (``_mark`` adds its marked classes).
PLAIN_TENSOR_TYPES: set[type] = {torch.Tensor, torch.nn.Parameter}


def collectives_issued() -> int | None:
    """How many collectives this rank has issued on all its process groups, subgroups
    (``dist.new_group``) included: the sum of their sequence numbers (gloo and NCCL keep one);
    None where a backend keeps none."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    try:
        groups = list(c10d._world.pg_map) or [c10d._get_default_group()]
        return sum(int(g._get_sequence_number_for_group()) for g in groups
                   if g is not None and g is not c10d.GroupMember.NON_GROUP_MEMBER)
    except (AttributeError, RuntimeError, ValueError, TypeError):
        return None


def has_storage(t: torch.Tensor) -> bool:
    """True for dense strided tensors with a real storage (not meta, not wrapper subclasses)."""
    if t.layout != torch.strided or t.is_meta:
        return False
    return type(t) in PLAIN_TENSOR_TYPES or not is_traceable_wrapper_subclass(t)


def is_dtensor(t: Any) -> bool:
    """Is ``t`` a ``torch.distributed.tensor.DTensor``? (Looked up only once something imported
    ``torch.distributed.tensor``: without it no tensor can be one, and nothing is loaded; a
    tensor of a plain class is none either, without the lookup: torch loads that module during a
    first backward, and this is asked for every tensor an op writes or a replay makes.)"""
    if type(t) in PLAIN_TENSOR_TYPES:
        return False
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)


#: id(local shard) -> (weak local shard, weak DTensor): the DTensors whose shards the scan took.
_SHARD_OWNERS: dict[int, tuple[Any, Any]] = {}


def dtensor_local(t: Any) -> torch.Tensor | None:
    """The local shard of a ``DTensor`` ``t`` (the plain tensor its bytes live in on this rank,
    the very object the DTensor's in-place ops write), or None when ``t`` is not a DTensor.

    A DTensor is a wrapper subclass without storage of its own: its state is its local shard,
    which the scan reaches, the watch fingerprints and the preservers snapshot or journal. Its
    ops run the shard's kernels inside the DTensor's dispatch, below ``__torch_function__`` and
    without bumping the shard's version counter (the DTensor's own counter is bumped): so the
    shard is remembered with its DTensor (:func:`dtensor_of`), which watches its writes."""
    if not is_dtensor(t):
        return None
    local = getattr(t, "_local_tensor", None)
    if not isinstance(local, torch.Tensor):  # pragma: no cover - another torch's layout
        with torch.no_grad():
            local = t.to_local()
    known = _SHARD_OWNERS.get(id(local))
    if known is None or known[0]() is not local or known[1]() is not t:
        if len(_SHARD_OWNERS) > 4096:  # drop the dead
            for k in [k for k, (a, b) in _SHARD_OWNERS.items() if a() is None or b() is None]:
                del _SHARD_OWNERS[k]
        _SHARD_OWNERS[id(local)] = (weakref.ref(local), weakref.ref(t))
    return local


def dtensor_of(local: torch.Tensor) -> torch.Tensor | None:
    """The live ``DTensor`` whose local shard :func:`dtensor_local` found ``local`` to be, or None."""
    known = _SHARD_OWNERS.get(id(local))
    if known is None or known[0]() is not local:
        return None
    return known[1]()


def in_functorch_transform() -> bool:
    """True inside a ``torch.func`` transform (``grad``, ``vjp``, ``vmap``, ``jacrev``, ...)."""
    return torch._C._functorch.peek_interpreter_stack() is not None


_REENTRANT_BACKWARD = _tuc.CheckpointFunction.backward.__code__


def in_foreign_recompute() -> bool:
    """True while ``torch.utils.checkpoint`` (not stateremat) recomputes a segment on this thread.

    Non-reentrant: the saved-tensor hook on top of the stack is torch's recomputation hook.
    Reentrant: inside a backward, ``CheckpointFunction.backward`` is on the Python stack.
    """
    hooks = _top_saved_tensors_default_hooks(True)
    if hooks:
        pack = getattr(hooks[0], "__wrapped__", hooks[0])
        if "_recomputation_hook" in getattr(pack, "__qualname__", ""):
            return True
    if _current_graph_task_id() == -1:
        return False
    f = sys._getframe(1)
    while f is not None:
        if f.f_code is _REENTRANT_BACKWARD:
            return True
        f = f.f_back
    return False


class _Hidden(threading.local):
    def __init__(self) -> None:
        self.modes: list[Any] = []  # dispatch modes pushed by context_fn contexts, innermost last
        self.depth = 0  # library_ops contexts entered on this thread (nested ones cost nothing)


_HIDDEN = _Hidden()


@contextlib.contextmanager
def entered_hiding(ctx: Any) -> Iterator[None]:
    """Enter ``ctx`` (a ``context_fn`` context); the dispatch modes it pushes never see library ops."""
    before = _len_torch_dispatch_stack()
    with ctx:
        pushed = [_get_dispatch_stack_at(i) for i in range(before, _len_torch_dispatch_stack())]
        _HIDDEN.modes.extend(pushed)
        try:
            yield
        finally:
            del _HIDDEN.modes[len(_HIDDEN.modes) - len(pushed):]


class _LibraryOps:
    """The context :func:`library_ops` returns (a class: it is entered on every journaled write)."""

    __slots__ = ("grad", "dtf", "popped", "kept", "outer")

    def __enter__(self) -> None:
        local = _HIDDEN
        self.outer = not local.depth
        if not self.outer:  # inside another library_ops: already set up
            local.depth += 1
            return
        self.popped = self.kept = None
        hidden = local.modes
        if hidden:
            n = _len_torch_dispatch_stack()
            self.popped = [_pop_mode() for _ in range(n)]  # innermost first
            self.kept = [m for m in reversed(self.popped) if not any(m is h for h in hidden)]
            for m in self.kept:
                _push_mode(m)
        self.grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        self.dtf = DisableTorchFunction()
        self.dtf.__enter__()
        local.depth = 1  # set up: only now can __exit__ run

    def __exit__(self, *exc: Any) -> None:
        _HIDDEN.depth -= 1
        if not self.outer:
            return
        self.dtf.__exit__(None, None, None)
        torch._C._set_grad_enabled(self.grad)
        if self.popped is not None:
            for _ in self.kept:
                _pop_mode()
            for m in reversed(self.popped):
                _push_mode(m)


def in_library_ops() -> bool:
    """True inside :func:`library_ops` on this thread (stateremat's own tensor bookkeeping runs)."""
    return _HIDDEN.depth > 0


def library_ops() -> _LibraryOps:
    """Run stateremat's own tensor bookkeeping outside the user's checkpoint policy and graphs.

    Snapshot copies, journal gathers and restores are not part of the user's program: the
    dispatch modes a ``context_fn`` pushed (a selective-checkpoint policy caching the ops it
    saves) must not see them, and they must not be recorded by autograd or reach marked
    tensors' handlers. Other modes (memory trackers, tracing) keep seeing them: snapshot and
    journal bytes are memory too.
    """
    return _LibraryOps()
