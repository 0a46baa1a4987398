"""What a segment declares and what it can reach (undeclared-write detection R7, RNG R3).

A segment *declares* tensors (``state=``: tensors, modules = all their buffers, generators).
It can *reach*: the parameters, buffers and other attributes (underscored or not, unregistered
modules included) of the modules it runs (``fn`` itself, a bound method's ``self``, modules
captured in its closure, named as globals or passed as arguments), their classes' attributes,
the globals their methods (``forward`` and its helpers) and ``fn`` load — a user's Python module
among them (a global ``gmod``, ``from pkg import mod`` in a closure, a module's attribute, named
in a callable object's ``__call__``) followed through the attribute names that code loads
(``gmod.G``: ``G``, as a global of the module; library and standard-library modules are not) —,
tensors in its arguments and closure, and — up to :data:`MAX_DEPTH` levels — tensors inside
captured lists, tuples, dicts, sets, plain objects' attributes (``self.memory.bank``), the live referents of
weak references (``ref``, ``WeakMethod``, ``proxy``), the live values of ``WeakValueDictionary`` /
``WeakKeyDictionary`` and members of ``WeakSet`` (subclasses of each included), and what user
functions, bound methods, callable objects and module hooks capture, hold or load as globals (a
helper closing over a BatchNorm, a pre-hook drawing from its own generator). Version counters of
reachable tensors are read before and after the forward (and around the replay): a change on
one that is not declared is an undeclared in-place write; a list, dict, weak mapping, object,
class or module global that holds another tensor after the forward was *rebound* (refused the
same way). Iterators and generators it reaches (:attr:`Reach.iterators`) are watched for an
advance (``_iterators``). Reachable ``torch.Generator`` objects are captured and replayed like
the default generators (R3). Running statistics of reachable normalization layers in training are compared
byte for byte, because ``native_batch_norm`` updates them without bumping a version.

A ``DTensor`` buffer or state tensor (tensor parallelism's replicated or sharded state) has no
storage of its own: it is declared, reached and watched through its local shard on each rank,
which its in-place ops write (an undeclared write to one is named like any other). ``DTensor``
parameters (FSDP2's sharded ones, tensor parallelism's) are left to their framework.

Danger:
    Tensors reachable only through deeper object graphs (or past :data:`MAX_OBJECTS` objects),
    or through objects, functions and modules of the standard library (other than
    ``SimpleNamespace`` and the ``weakref`` module's references, proxies, mappings and ``WeakSet``),
    torch, numpy or jax are not checked: an undeclared write to one repeats at replay. A Python
    module's attribute read by name (``getattr(gmod, name)``, ``vars(gmod)[...]``) is no name the
    code loads: not followed.
"""
from __future__ import annotations

import enum
import functools
import re
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ._compat import dtensor_local, has_storage, tree_flatten
from ._iterators import is_watched_iterator
from ._validate import check_nesting, check_state_tensor

#: Levels of plain containers / objects followed from a captured value or module attribute.
MAX_DEPTH = 4
#: Objects visited per scan at most (bounds the cost on huge object graphs).
MAX_OBJECTS = 20_000

_NORM_TYPES = (nn.modules.batchnorm._NormBase,)
#: ``nn.Module``'s own instance attributes (tables, hooks, flags): everything else a module
#: holds in its ``__dict__``, underscored or not, is user state the scan follows.
_MODULE_INTERNALS = frozenset(nn.Module().__dict__)
MODULE_INTERNALS = _MODULE_INTERNALS
#: Plain values that hold no tensor (not followed).
_ATOMS = (str, bytes, int, float, complex, bool, type, types.ModuleType)


def _code_names(code: types.CodeType) -> set[str]:
    """Global names a code object and the functions nested in it may load."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


@functools.lru_cache(maxsize=None)
def _class_globals(cls: type) -> tuple[tuple[str, dict], ...]:
    """``(name, module globals)`` of every global the methods of ``cls`` (classes outside
    torch) may load: ``forward`` and the helpers it calls."""
    out: dict[tuple[str, int], tuple[str, dict]] = {}
    for c in cls.__mro__:
        if c is object or c.__module__.split(".")[0] == "torch":
            continue
        for v in vars(c).values():
            f = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
            code, glb = getattr(f, "__code__", None), getattr(f, "__globals__", None)
            if isinstance(code, types.CodeType) and isinstance(glb, dict):
                for n in _code_names(code):
                    out.setdefault((n, id(glb)), (n, glb))
    return tuple(out.values())


@functools.lru_cache(maxsize=None)
def _class_names(cls: type) -> frozenset[str]:
    """Every name the methods of ``cls`` (classes outside torch) load: the attribute names followed
    on a Python module they name (``gmod.G``)."""
    out: set[str] = set()
    for c in cls.__mro__:
        if c is object or c.__module__.split(".")[0] == "torch":
            continue
        for v in vars(c).values():
            f = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
            code = getattr(f, "__code__", None)
            if isinstance(code, types.CodeType):
                out |= _code_names(code)
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def _class_cells(cls: type) -> tuple[tuple[str, types.CellType], ...]:
    """``(name, cell)`` of every variable the methods of ``cls`` (classes outside torch) capture
    from an enclosing scope: a class defined in a function closes over its locals."""
    out: dict[int, tuple[str, types.CellType]] = {}
    for c in cls.__mro__:
        if c is object or c.__module__.split(".")[0] == "torch":
            continue
        for v in vars(c).values():
            f = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
            code, cells = getattr(f, "__code__", None), getattr(f, "__closure__", None)
            if isinstance(code, types.CodeType) and cells:
                for name, cell in zip(code.co_freevars, cells):
                    if name != "__class__":  # (zero-argument super's cell)
                        out.setdefault(id(cell), (name, cell))
    return tuple(out.values())


#: Top-level packages whose functions and callable objects hold no state of a model's.
_LIBRARIES = frozenset({"torch", "numpy", "jax", "jaxlib", "stateremat", "typing_extensions", "builtins"})


def _user_code(v: Any) -> bool:
    """A Python function, bound method or callable object defined outside the standard library,
    torch, numpy, jax and this package: its captured variables, ``self`` or attributes can hold
    a model's state (a helper closing over a BatchNorm, a hook closing over a generator)."""
    f = v.__func__ if isinstance(v, types.MethodType) else v
    mod = getattr(f, "__module__", None) if isinstance(f, types.FunctionType) else type(f).__module__
    top = (mod or "").partition(".")[0]
    return bool(top) and top not in _LIBRARIES and top not in sys.stdlib_module_names


def _user_class(cls: type) -> bool:
    """A class defined outside the standard library, torch, numpy, jax and this package (not an
    ``Enum``, whose members are constants): its class attributes can hold a model's state."""
    top = (getattr(cls, "__module__", None) or "").partition(".")[0]
    return bool(top) and top not in _LIBRARIES and top not in sys.stdlib_module_names \
        and not issubclass(cls, enum.Enum)


def _user_module(m: types.ModuleType) -> bool:
    """A Python module outside the standard library, torch, numpy, jax and this package (a user's
    ``helpers``, a ``types.ModuleType`` made at run time): the attributes the code loads from it are
    state like globals (``next(gmod.G)``, ``gmod.counter["n"] += 1``)."""
    name = m.__dict__.get("__name__")
    top = name.partition(".")[0] if isinstance(name, str) else "?"
    return bool(top) and top not in _LIBRARIES and top not in sys.stdlib_module_names


#: Globals of these types are Python values a forward may rebind (``global STEP; STEP += 1``).
_SCALAR_GLOBALS = (int, float, bool, complex, str)


def _state_global(v: Any) -> bool:
    """A global worth following: tensors, modules, generators, containers, plain objects and
    user functions (not library functions, classes, imported modules or plain values)."""
    t = type(v)
    if t in _PLAIN_VALUES or t is types.ModuleType:
        return False
    if isinstance(v, type):  # a user class: its class attributes (``K.acc = K.acc + 1``)
        return _user_class(v)
    if isinstance(v, (torch.Tensor, nn.Module)) or _is_generator(v):
        return True
    if isinstance(v, (types.FunctionType, functools.partial)):
        return isinstance(v, functools.partial) or _user_code(v)
    # (a user's callable object too: what its ``__call__`` loads, ``helper = Helper()``)
    return not (v is None or isinstance(v, _ATOMS)) and (not callable(v) or _user_code(v))


def module_attrs(m: nn.Module) -> list[tuple[str, Any]]:
    """``m``'s unregistered attributes (``s.count``, ``s._cache``, ``s.memory``, an unregistered
    module), without ``nn.Module``'s own tables and hooks."""
    return [(k, v) for k, v in m.__dict__.items() if k not in _MODULE_INTERNALS]


@functools.lru_cache(maxsize=None)
def _class_state(cls: type) -> tuple[str, ...]:
    """Names of class attributes of ``cls`` (classes outside torch) that may hold tensors:
    tensors, generators, containers and plain objects (not functions, types or descriptors)."""
    names = []
    for c in cls.__mro__:
        if c is object or c.__module__.split(".")[0] == "torch":
            continue
        for k, v in vars(c).items():
            if k.startswith("__") or k in names or v is None or isinstance(v, _ATOMS):
                continue
            if isinstance(v, (torch.Tensor, torch.Generator, list, tuple, dict)) or not (
                    callable(v) or hasattr(v, "__get__")):
                names.append(k)
    return tuple(names)


def root_module(fn: Callable) -> nn.Module | None:
    """The module ``fn`` runs: ``fn`` itself, a bound method's ``self`` or either inside a
    ``functools.partial``; else ``None``."""
    while isinstance(fn, functools.partial):
        if not hasattr(fn.func, "__self__") and fn.args and isinstance(fn.args[0], nn.Module):
            return fn.args[0]  # partial(Layer.forward, layer, ...): an unbound forward and its module
        fn = fn.func
    if isinstance(fn, nn.Module):
        return fn
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _module_path(m: nn.Module, root: nn.Module | None) -> str:
    if root is not None:
        if m is root:
            return ""
        for path, sub in root.named_modules():
            if sub is m:
                return path
    return type(m).__name__


@dataclass
class Declared:
    """Resolved ``state=``: tensors ``(name, tensor, group)``, generators and declared modules."""

    tensors: list[tuple[str, torch.Tensor, int]] = field(default_factory=list)
    generators: list[tuple[str, torch.Generator]] = field(default_factory=list)
    modules: list[tuple[str, nn.Module]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tensors or self.generators or self.modules)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose bytes hold ``t``'s state: ``t`` itself, or a ``DTensor``'s local shard
    (a wrapper without storage of its own; its in-place ops write the shard). A declared DTensor
    is preserved, and a reached one watched, through its shard on each rank."""
    local = dtensor_local(t)
    return t if local is None else local


def resolve_state(state: Any, root: nn.Module | None, prefix: str = "",
                  api: str = "stateremat.torch.checkpoint") -> Declared:
    """Flatten ``state=`` into a :class:`Declared`; a module contributes all its buffers.

    Raises:
        TypeError: if an entry is neither a tensor, a module nor a ``torch.Generator``.
        ValueError: a list that contains itself or nests too deep (:func:`~._validate.check_nesting`).
        UnsupportedError: a nested, sparse, meta or quantized tensor.
    """
    out = Declared()
    above: list[int] = []  # ids of the lists/tuples above the entry

    def add(obj: Any, where: str) -> None:
        if obj is None:
            return
        if isinstance(obj, torch.Tensor):
            check_state_tensor(obj, where, api)
            obj = _local(obj)
            out.tensors.append((where, obj, id(obj)))
        elif isinstance(obj, torch.Generator):
            out.generators.append((where, obj))
        elif isinstance(obj, nn.Module):
            path = _module_path(obj, root)
            base = ".".join(p for p in (prefix, path) if p)
            out.modules.append((base, obj))
            for bname, b in obj.named_buffers():
                if b.is_nested:  # (the other kinds are refused as the forward begins)
                    check_state_tensor(b, f"{base}.{bname}" if base else bname, api)
                out.tensors.append((f"{base}.{bname}" if base else bname, _local(b), id(obj)))
        elif isinstance(obj, (list, tuple)):
            check_nesting(obj, len(above), above, api, "state=")
            above.append(id(obj))
            for i, x in enumerate(obj):
                add(x, f"state[{i}]")
            above.pop()
        else:
            raise TypeError(
                f"{api}: state= expects tensors, nn.Modules (all their buffers) "
                f"and torch.Generators, got {type(obj).__name__} at {where}. Tip: pass e.g. "
                "state=[model.queue, model.bn]."
            )

    add(state, "state")
    return out


def check_state(state: Any, api: str = "stateremat.torch.checkpoint") -> None:
    """Refuse a ``state=`` that is not a tensor/module/generator (list) at construction time.

    Raises:
        TypeError: naming the offending entry.
        ValueError: an unknown string; a list that contains itself or nests too deep.
        UnsupportedError: a nested, sparse, meta or quantized tensor.
    """
    if isinstance(state, str):
        if state not in ("auto", "buffers"):
            raise ValueError(f"stateremat.torch: state must be 'auto', 'buffers', None, or tensors/modules, got "
                             f"{state!r}. Tip: state='auto' (the default) finds the state the segment writes; "
                             "state='buffers' declares every buffer of the checkpointed module.")
        return
    resolve_state(state, None, api=api)


#: A scan name of an input of the segment: an argument itself or an element of a container argument
#: (not an attribute of an object passed in, which is state that object holds).
_INPUT_NAME = re.compile(r"(partial |keyword )?argument (\d+|'[^']*')(\[[^\]]*\])*")


_LIST_ENTRY = re.compile(r"\[\d+\]$")


def is_list_entry(name: Any) -> bool:
    """Is ``name`` (a raw scan name) a list's entry (a log the model appends to)?"""
    return isinstance(name, str) and _LIST_ENTRY.search(name) is not None


def is_input_name(name: str) -> bool:
    """Is ``name`` (a raw scan name) an input of the segment rather than state it reaches?"""
    return _INPUT_NAME.fullmatch(name) is not None


def describe(name: Any) -> str:
    """Human-readable name of a reachable tensor (names are formatted only when reported)."""
    if not isinstance(name, tuple):
        return name
    kind, path, attr = name
    full = f"{path}.{attr}" if path else attr
    return f"{kind} {full!r}" + (" (not a registered buffer)" if kind == "tensor attribute" else "")


@dataclass
class Reach:
    """What a segment can reach: tensors, generators and hidden-write norm statistics."""

    tensors: dict[int, tuple[Any, torch.Tensor]] = field(default_factory=dict)
    generators: dict[int, tuple[str, torch.Generator]] = field(default_factory=dict)
    norm_stats: dict[int, tuple[Any, torch.Tensor]] = field(default_factory=dict)
    #: ``num_batches_tracked`` of those layers: kept whole with their statistics under ``region``
    #: (a snapshot of 8 bytes costs less than a journal entry per step)
    norm_counters: list[torch.Tensor] = field(default_factory=list)
    modules: list[tuple[str, nn.Module]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    #: lists, dicts, sets, weak mappings and plain objects followed (what a profiling run must put back)
    mutables: list[Any] = field(default_factory=list)
    #: ``(name, holder, key, tensor)``: a tensor bound in a list, dict, plain object, class or
    #: module globals (see :func:`rebound`)
    slots: list[tuple[str, Any, Any, torch.Tensor]] = field(default_factory=list)
    #: id -> ``(name, iterator)``: iterators and generators a forward may advance (``_iterators``)
    iterators: dict[int, tuple[str, Any]] = field(default_factory=dict)
    #: ``(globals dict, name)`` of plain-value globals the segment's code loads (``global STEP``)
    scalar_globals: list[tuple[dict, str]] = field(default_factory=list)
    #: ids of tensors reached only through module hooks: a hook may guard its write with
    #: ``is_replaying()``, so only a write by the replay itself is refused
    hook_only: set[int] = field(default_factory=set)
    #: id(module) -> :func:`tensor_slots` of each reached module as the scan met it (before the
    #: forward): the watch and the transaction read these instead of walking the module again
    start_slots: dict[int, dict] = field(default_factory=dict)
    #: an ``nn.RReLU`` in training is reached: rrelu saves its noise before filling it, so a
    #: replay that stops at its last saved tensor hands backward unfilled memory (torch's
    #: checkpoint too); the replay must run to the end
    replay_to_end: bool = False
    #: ``(id of a Python module's __dict__, attribute name)`` -> the depth it was followed at
    #: (``_add_python_module``)
    module_names: dict[tuple[int, str], int] = field(default_factory=dict)

    def budget_left(self) -> bool:
        return len(self.seen) < MAX_OBJECTS


def _add_module(r: Reach, m: nn.Module, prefix: str) -> None:
    if id(m) in r.seen:
        return
    for path, sub in m.named_modules(prefix=prefix):
        if id(sub) in r.seen and sub is not m:
            continue
        r.seen.add(id(sub))
        r.modules.append((path, sub))
        slots = r.start_slots[id(sub)] = {}
        for kind, table, d in (("parameter", "_parameters", sub._parameters), ("buffer", "_buffers", sub._buffers)):
            for k, v in d.items():
                slots[(table, k)] = v
                if v is not None and id(v) not in r.tensors:
                    r.tensors[id(v)] = ((kind, path, k), v)
        if isinstance(sub, _NORM_TYPES) and sub.training and sub.track_running_stats:
            for k in ("running_mean", "running_var"):
                v = sub._buffers.get(k)
                if v is not None:
                    r.norm_stats[id(v)] = (("buffer", path, k), v)
            v = sub._buffers.get("num_batches_tracked")
            if v is not None:
                r.norm_counters.append(v)
        for k, v in list(sub.__dict__.items()):
            # Unregistered attributes (s.count = torch.zeros(1), s._gen, s.memory = Memory(), an
            # unregistered module) that replay would otherwise write twice or draw from again.
            if type(v) in _PLAIN_VALUES or k in _MODULE_INTERNALS:
                continue
            if isinstance(v, torch.Tensor):
                slots[("__dict__", k)] = v
                r.tensors.setdefault(id(v), (("tensor attribute", path, k), v))
            elif type(v) is types.ModuleType:  # ``self.helpers = helpers``: the names its methods load
                _add_python_module(r, v, _class_names(type(sub)), 1)
            else:
                where = f"{path}.{k}" if path else k
                _add_value(r, v, f"attribute {where}", 1, where)
        if isinstance(sub, nn.RReLU) and sub.training:
            r.replay_to_end = True
        hooks = [h for d in (sub._forward_pre_hooks, sub._forward_hooks, sub._backward_pre_hooks,
                             sub._backward_hooks) for h in d.values()]
        if hooks:  # user hooks: what they capture runs again at replay
            known = set(r.tensors)
            for h in hooks:
                _add_value(r, h, f"hook of {path or type(sub).__name__!r}", 1, path)
            r.hook_only.update(set(r.tensors) - known)
        _add_class(r, type(sub), 1, shadowed=sub.__dict__)


def _add_class(r: Reach, cls: type, depth: int, shadowed: dict = {}, methods: bool = True) -> None:  # noqa: B006
    """``cls``'s class attributes that may hold tensors (a class attribute's rebinding ``K.acc =
    K.acc + 1`` replays as of the forward: a slot of the class) and, with ``methods``, the globals
    its methods load; ``shadowed``: an instance's ``__dict__`` (its own attributes hide the class's)."""
    for k in _class_state(cls):
        if k not in shadowed:
            v = getattr(cls, k, None)
            what = f"class attribute {cls.__name__}.{k}"
            if isinstance(v, torch.Tensor):
                r.slots.append((what, cls, k, v))
            _add_value(r, v, what, depth)
    if not methods:
        return
    names = _class_names(cls)
    for name, cell in _class_cells(cls):  # what its methods capture (a class defined in a function)
        _add_cell(r, name, cell, depth, names)
    for name, glb in _class_globals(cls):  # globals its forward and helpers use
        _add_global(r, glb, name, 0, names)


def _add_callable(r: Reach, fn: Any, prefix: str, depth: int = 0) -> None:
    """What ``fn`` can reach: its module (``fn`` itself or a bound method's ``self``), a
    partial's arguments, its captured variables and the globals its code loads; followed
    ``depth`` levels deep (a helper's helper), at most :data:`MAX_DEPTH`."""
    if depth > MAX_DEPTH:
        return
    if isinstance(fn, functools.partial):
        _add_callable(r, fn.func, prefix, depth + 1)
        # bound by the partial, not passed to the segment: state it reaches, not an input
        for i, v in enumerate(fn.args):
            _add_value(r, v, f"bound partial argument {i}", depth)
        for k, v in fn.keywords.items():
            _add_value(r, v, f"bound partial keyword {k!r}", depth)
        return
    root = root_module(fn)
    if root is not None:
        _add_module(r, root, prefix)
        fn = getattr(type(root), "forward", None) if fn is root else getattr(fn, "__func__", fn)
    elif isinstance(fn, types.MethodType):  # a method of a plain object: its attributes
        # (at the method's own depth: a bound method and its ``self`` are one level, as a weak
        # reference and its referent; one level more put a captured ``obj.step``'s ``self`` past
        # the depth, and its rebinding replayed silently on the new value)
        _add_value(r, fn.__self__, f"{prefix or 'method'}.__self__", depth, prefix)
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    names = _code_names(code)
    cells = getattr(fn, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, cells):
        _add_cell(r, name, cell, depth, names)
    defaults = (getattr(fn, "__defaults__", None) or ()) + tuple((getattr(fn, "__kwdefaults__", None) or {}).values())
    for i, v in enumerate(defaults):
        _add_value(r, v, f"default argument {i}", depth)
    attrs = getattr(fn, "__dict__", None) if type(fn) is types.FunctionType else None
    if attrs:  # a function attribute (``fn.acc = fn.acc + 1``): a binding slot, replayed as of the forward
        for k, v in list(attrs.items()):
            what = f"function attribute {getattr(fn, '__qualname__', '?')}.{k}"
            if isinstance(v, torch.Tensor):
                r.slots.append((what, attrs, k, v))
            _add_value(r, v, what, depth + 1)
    glb = getattr(fn, "__globals__", {})
    for name in names:
        _add_global(r, glb, name, depth, names)


def _add_global(r: Reach, glb: dict, name: str, depth: int, names: Any, owner: str = "") -> None:
    """The global ``name`` of ``glb`` (or, with ``owner``, the attribute ``name`` of the Python module
    ``owner`` whose ``__dict__`` is ``glb``): a plain value or a tensor is a slot (rebound, replayed as
    of the forward, ``_plain``), state is followed, and a user's Python module is followed through
    the attribute names ``names`` the code loads."""
    v = glb.get(name)
    t = type(v)
    if t in _SCALAR_GLOBALS:
        r.scalar_globals.append((glb, name))
    elif t is types.ModuleType:
        _add_python_module(r, v, names, depth)
    elif _state_global(v):
        what = f"module attribute {owner}.{name}" if owner else f"global {name!r}"
        if isinstance(v, torch.Tensor):
            r.slots.append((what, glb, name, v))
        _add_value(r, v, what, depth, name)


def _add_python_module(r: Reach, m: types.ModuleType, names: Any, depth: int) -> None:
    """A Python module the code names (a global ``gmod``, ``from pkg import mod`` captured by a
    closure): only its attributes the code loads (``names``: co_names, so ``gmod.G`` follows ``G``),
    each as a global of the module, once per scan; library and standard-library modules are not
    followed (they hold no state of a model's, and the scan runs every step)."""
    if not _user_module(m):
        return
    glb = m.__dict__
    owner = None
    for name in names:
        if name in glb and r.module_names.get((id(glb), name), MAX_DEPTH + 1) > depth and r.budget_left():
            r.module_names[(id(glb), name)] = depth  # (again only from a shallower place)
            owner = owner or glb.get("__name__", "?")
            _add_global(r, glb, name, depth, names, owner)


def _add_cell(r: Reach, name: str, cell: types.CellType, depth: int, names: Any = ()) -> None:
    """A captured variable: a tensor in it is a slot (a ``nonlocal`` rebinding replays as of the
    forward, ``_plain``); a user's Python module is followed through the names the code loads
    (``names``); anything else is followed."""
    try:
        v = cell.cell_contents
    except ValueError:  # empty cell
        return
    if isinstance(v, torch.Tensor):
        r.slots.append((f"captured variable {name!r}", cell, "cell_contents", v))
    elif type(v) is types.ModuleType:
        _add_python_module(r, v, names, depth)
        return
    _add_value(r, v, f"captured variable {name!r}", depth, name)


#: Exact types of plain values (checked before any ``isinstance``: most attributes are these).
_PLAIN_VALUES = frozenset({type(None), bool, int, float, complex, str, bytes})
#: type -> is it a ``torch.Generator`` (its metaclass makes ``isinstance`` slow).
_GENERATOR_TYPES: dict[type, bool] = {}


def _is_generator(v: Any) -> bool:
    t = type(v)
    g = _GENERATOR_TYPES.get(t)
    if g is None:
        g = _GENERATOR_TYPES[t] = isinstance(v, torch.Generator)
    return g


def _add_value(r: Reach, v: Any, what: str, depth: int, prefix: str = "") -> None:
    if type(v) in _PLAIN_VALUES:
        return
    if isinstance(v, torch.Tensor):
        r.tensors.setdefault(id(v), (what, v))
        return
    if _is_generator(v):
        r.generators.setdefault(id(v), (what, v))
        return
    if isinstance(v, nn.Module):
        _add_module(r, v, prefix or what)
        return
    if depth >= MAX_DEPTH or v is None:
        if v is not None and is_watched_iterator(v):  # a leaf, like a tensor: seen at the last level too
            r.iterators.setdefault(id(v), (what, v))
        return
    if isinstance(v, type):  # a user class the segment captures or loads: its class attributes
        if _user_class(v) and id(v) not in r.seen and r.budget_left():
            r.seen.add(id(v))
            _add_class(r, v, depth + 1)
        return
    if isinstance(v, _ATOMS) or id(v) in r.seen or not r.budget_left():
        return
    kind = _WEAK_KINDS.get(type(v), _UNSEEN)  # (one lookup: most values are no weakref object)
    if kind is _UNSEEN:
        kind = _weak_kind(type(v))
    if kind:
        r.seen.add(id(v))
        _add_weak(r, v, kind, what, depth, prefix)
        return
    if isinstance(v, (types.FunctionType, types.MethodType, functools.partial)):
        # a helper, bound method or hook the segment calls: what it captures runs again at replay
        if isinstance(v, functools.partial) or _user_code(v) or root_module(v) is not None:
            r.seen.add(id(v))
            _add_callable(r, v, prefix or what, depth + 1)
        return
    r.seen.add(id(v))
    if isinstance(v, (list, tuple, set, frozenset)):
        mutable = isinstance(v, list)
        if mutable or isinstance(v, set):
            r.mutables.append(v)
        for i, x in enumerate(v):
            if type(x) in _PLAIN_VALUES:  # (checked here: no name is formatted for it)
                continue
            if mutable and isinstance(x, torch.Tensor):
                r.slots.append((f"{what}[{i}]", v, i, x))
            _add_value(r, x, f"{what}[{i}]", depth + 1, prefix)
    elif isinstance(v, dict):
        r.mutables.append(v)
        for k, x in v.items():
            if type(x) in _PLAIN_VALUES:
                continue
            if isinstance(x, torch.Tensor):
                r.slots.append((f"{what}[{k!r}]", v, k, x))
            _add_value(r, x, f"{what}[{k!r}]", depth + 1, prefix)
    elif (isinstance(getattr(v, "__dict__", None), dict) and _may_hold_state(v)
          and (not callable(v) or _user_code(v))):
        _add_object(r, v, type(v), what, depth, prefix)
    elif is_watched_iterator(v):  # a generator or iterator: a replay would advance it again
        r.iterators.setdefault(id(v), (what, v))


def _add_object(r: Reach, v: Any, cls: type, what: str, depth: int, prefix: str) -> None:
    """The attributes of a plain (or callable) object ``v`` of class ``cls`` (or of a
    ``weakref.proxy``'s referent, read and rebound through the proxy), each bound to a tensor a slot."""
    r.mutables.append(v)
    if id(cls) not in r.seen and _user_class(cls):  # ``type(self).acc = ...``
        r.seen.add(id(cls))
        _add_class(r, cls, depth + 1, methods=False)
    for k, x in vars(v).items():
        if type(x) in _PLAIN_VALUES:
            continue
        if isinstance(x, torch.Tensor):
            r.slots.append((f"{what}.{k}", v, k, x))
        _add_value(r, x, f"{what}.{k}", depth + 1, prefix)
    if callable(v):  # a callable object's __call__ and helpers may load globals
        for name, glb in _class_globals(cls):
            g = glb.get(name)
            if type(g) is types.ModuleType:  # ``gmod.G`` in its ``__call__``
                _add_python_module(r, g, _class_names(cls), depth + 1)
            elif _state_global(g) and not isinstance(g, types.FunctionType):
                _add_value(r, g, f"global {name!r}", depth + 1, name)


#: The ``weakref`` module's mappings and set, subclasses included (standard library objects, so
#: not followed as plain objects): a segment may keep state in one (``table[self] = table[self] *
#: 0.5 + y``, ``seen.add(self)``).
WEAK_MAPPINGS = (weakref.WeakValueDictionary, weakref.WeakKeyDictionary)
WEAK_SETS = (weakref.WeakSet,)
_UNSEEN = object()
_PROXY_TYPES = frozenset(weakref.ProxyTypes)
#: type -> ``"ref"`` (``weakref.ref`` and its subclasses: ``WeakMethod``), ``"proxy"``, ``"mapping"``,
#: ``"set"`` or ``""`` (no weakref object; the common answer, cached per type).
_WEAK_KINDS: dict[type, str] = {}


def _weak_kind(t: type) -> str:
    kind = ("ref" if issubclass(t, weakref.ref) else "proxy" if t in _PROXY_TYPES
            else "mapping" if issubclass(t, WEAK_MAPPINGS) else "set" if issubclass(t, WEAK_SETS) else "")
    _WEAK_KINDS[t] = kind
    return kind


def weak_kind(v: Any) -> str:
    """What weakref object ``v`` is: ``"ref"``, ``"proxy"``, ``"mapping"`` (a ``WeakValueDictionary``
    / ``WeakKeyDictionary``), ``"set"`` (a ``WeakSet``), subclasses included; ``""``: none."""
    kind = _WEAK_KINDS.get(type(v), _UNSEEN)
    return _weak_kind(type(v)) if kind is _UNSEEN else kind


def _add_weak(r: Reach, v: Any, kind: str, what: str, depth: int, prefix: str) -> None:
    """A weakref object: a reference's live referent (``v()``; a ``WeakMethod``'s bound method), a
    proxy's referent's attributes (slots through the proxy), a weak mapping's live entries (each a
    binding slot) or a ``WeakSet``'s live members (its membership replays as of the forward, ``_plain``)."""
    if kind == "ref":  # (no level of its own, as a proxy's: a ``WeakMethod``'s method then its ``self``)
        target = v()
        if target is not None:
            _add_value(r, target, f"{what}()", depth, prefix)
    elif kind == "proxy":
        try:
            cls = v.__class__  # (the referent's)
        except ReferenceError:  # dead
            return
        if isinstance(getattr(v, "__dict__", None), dict) and not issubclass(cls, torch.Tensor):
            _add_object(r, v, cls, what, depth, prefix)
    elif kind == "mapping":
        r.mutables.append(v)
        _add_weak_mapping(r, v, what, depth, prefix)
    else:
        r.mutables.append(v)
        try:
            members = list(v)  # (live members only)
        except RuntimeError:  # changed size while iterated (a referent collected meanwhile)
            return
        for i, x in enumerate(members):
            _add_value(r, x, f"{what} (member {i})", depth + 1, prefix)


def _add_weak_mapping(r: Reach, v: Any, what: str, depth: int, prefix: str) -> None:
    """A ``WeakValueDictionary`` or ``WeakKeyDictionary``: what its live values hold (a value tensor
    written in place, a value object's attribute rebound), and each entry bound to a tensor as a
    slot (``table[key] = ...`` replays as of the forward, like a dict's entry)."""
    try:
        items = list(v.items())  # (live entries only: a dead referent's entry is skipped)
    except RuntimeError:  # changed size while iterated (a referent collected meanwhile)
        return
    by_value = isinstance(v, weakref.WeakValueDictionary)
    for k, x in items:
        if type(x) in _PLAIN_VALUES:
            continue
        name = f"{what}[{k!r}]" if by_value else f"{what}[<{type(k).__name__}>]"
        if isinstance(x, torch.Tensor):
            r.slots.append((name, v, k, x))
        _add_value(r, x, name, depth + 1, prefix)


def reach(fn: Callable, args: tuple, kwargs: dict, module_prefix: str = "") -> Reach:
    """Pre-existing tensors, generators and norm statistics the segment can reach."""
    r = Reach()
    _add_callable(r, fn, module_prefix)
    for i, a in enumerate(args):
        if isinstance(a, nn.Module):
            _add_module(r, a, f"argument{i}")
        elif isinstance(a, torch.Tensor):
            r.tensors.setdefault(id(a), (f"argument {i}", a))
        else:
            _add_value(r, a, f"argument {i}", 0)
    for k, a in kwargs.items():
        if isinstance(a, torch.Tensor):
            r.tensors.setdefault(id(a), (f"keyword argument {k!r}", a))
        else:
            _add_value(r, a, f"keyword argument {k!r}", 0)
    if "torch.distributed.tensor" in sys.modules:  # a reached DTensor is watched through its local shard
        # (DTensor parameters — FSDP2's sharded ones, tensor parallelism's — are the framework's to
        # swap and write, see _framework: left out as before, like every tensor without storage)
        shards = ((n, t if t.requires_grad else _local(t)) for n, t in r.tensors.values())
        r.tensors = {id(t): (n, t) for n, t in shards}
        r.norm_stats = {id(t): (n, t) for n, t in ((n, _local(t)) for n, t in r.norm_stats.values())}
        r.norm_counters = [_local(t) for t in r.norm_counters]
    r.tensors = {i: v for i, v in r.tensors.items() if has_storage(v[1])}
    return r


def tensor_slots(m: nn.Module) -> dict[tuple[str, str], Any]:
    """What each tensor-holding attribute of ``m`` names: ``(dict, key) -> tensor`` for its
    parameters, buffers and plain tensor attributes (rebinding one changes this map)."""
    out: dict[tuple[str, str], Any] = {("_parameters", k): v for k, v in m._parameters.items()}
    for k, v in m._buffers.items():
        out[("_buffers", k)] = v
    for k, v in m.__dict__.items():
        if isinstance(v, torch.Tensor) and k not in _MODULE_INTERNALS:
            out[("__dict__", k)] = v
    return out


_MISSING = object()


def _may_hold_state(obj: Any) -> bool:
    """Plain objects of standard-library classes (loggers, locks, handlers) hold no tensors of
    a model's; ``SimpleNamespace`` is the exception users keep state in."""
    top = type(obj).__module__.partition(".")[0]
    return top not in sys.stdlib_module_names or isinstance(obj, types.SimpleNamespace)


def rebound(slots: list[tuple[str, Any, Any, torch.Tensor]]) -> list[str]:
    """Names of ``slots`` (from :attr:`Reach.slots`) that no longer hold their tensor: a
    forward that rebinds state outside modules (``obj.t = obj.t + 1``) would have its replay
    read the new tensor."""
    out = []
    for name, holder, key, t in slots:
        if isinstance(holder, list):
            now = holder[key] if key < len(holder) else _MISSING
        elif isinstance(holder, dict) or weak_kind(holder) == "mapping":
            now = holder.get(key, _MISSING)
        else:
            try:
                now = getattr(holder, key, _MISSING)
            except ValueError:  # an emptied closure cell
                now = _MISSING
        if now is not t:
            out.append(f"{name} (rebound to another tensor)")
    return out


def reachable(fn: Callable, args: tuple, kwargs: dict, module_prefix: str = "") -> list[tuple[Any, torch.Tensor]]:
    """Pre-existing tensors the segment can reach, each with a name for :func:`describe`."""
    return list(reach(fn, args, kwargs, module_prefix).tensors.values())


def input_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensor leaves of ``(args, kwargs)``."""
    return [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
