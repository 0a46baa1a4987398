"""``profile``: measure a profile card of any ``nn.Module`` on this device (paper §4).

Every segment is measured *in context*: one whole training step per option with every segment
under that option, a :class:`~stateremat.torch._probe.Probe` recording live bytes and peaks at
each segment's forward entry/exit and backward start/end (``_timeline.py`` turns that into
``r``, ``q``, ``c``). Time is the median over rounds that interleave the options (A B C A B C
...), measured without the memory tracker. ``P`` covers everything outside the segments; see
:func:`profile`.
"""
from __future__ import annotations

import contextlib
import platform
import statistics
import weakref
from typing import Any, Callable, Iterable

import torch
from torch import nn

from stateremat.contract import OPTIONS, RECOMPUTE_ONLY, OptionCost, ProfileCard, SegmentCard
from stateremat._shared.io import loadavg, source_hash

from ._distributed import agree_card, every_rank_or_none
from ._framework import runs_collectives
from ._memory import PeakMemory, memory_method
from ._probe import Probe
from ._segments import resolve_segments
from ._snapshot import ModelSnapshot
from ._step import make_step, model_device
from ._timeline import StepCosts, read_timeline
from ._validate import check_optimizers, require_module
from ._wrap import check_segment_options, unwrap_module, wrap_module

_API = "stateremat.torch.profile"


def _option_names(options: Iterable[Any]) -> list[str]:
    names = [getattr(o, "name", o) for o in options]
    for o in names:
        if o != RECOMPUTE_ONLY and o not in OPTIONS:
            raise ValueError(f"{_API}: unknown option {o!r}; expected names from stateremat.contract.OPTIONS "
                             f"{list(OPTIONS.names)} or {RECOMPUTE_ONLY!r}. Tip: options=OPTIONS measures all.")
    required = [o.name for o in OPTIONS if o.required and o.name not in names]
    if required:
        raise ValueError(f"{_API}: options must include {required} (every card segment needs them), got "
                         f"{names}. Tip: keep the default options=OPTIONS.")
    return list(dict.fromkeys(names))


class _Runner:
    """Runs steps of ``model`` with its segments under given options, a probe on each segment
    and, for memory steps, the tracker (whose roots are what the step starts with)."""

    def __init__(self, model: nn.Module, names: list[str], run: Callable[[], Any], inputs: list[torch.Tensor],
                 device: torch.device, state: Any, opts: dict[str, Any], optimizers: list | None = None) -> None:
        self.model, self.names, self.run, self.inputs = model, names, run, inputs
        self.device, self.state, self.opts = device, state, opts
        self.optimizers = list(optimizers or [])
        self.carried: list[weakref.ref] = []  # storages a step created that outlive it (grads, optimizer state)

    def roots(self) -> list[Any]:
        m = self.model
        tensors = [*m.parameters(), *(p.grad for p in m.parameters() if p.grad is not None), *m.buffers(),
                   *(t for mod in m.modules() for t in vars(mod).values() if isinstance(t, torch.Tensor)),
                   *self.inputs,
                   *(t for o in self.optimizers for s in o.state.values() for t in s.values()
                     if isinstance(t, torch.Tensor))]
        return tensors + [st for ref in self.carried if (st := ref()) is not None]

    def warm_up(self) -> None:
        """One plain step; on CPU, what it creates and keeps (gradients, optimizer state) is carried."""
        if self.device.type == "cuda":
            self.run()
            return
        with PeakMemory(self.device, roots=self.roots()) as pm:
            self.run()
            self.carried += [weakref.ref(st) for st in pm.new_storages()]

    def learn_order(self) -> list[str]:
        """One eager step (memory tracked; what it creates and keeps is carried, as every memory
        step's); afterwards ``names`` are in the order the segments first ran. Returns them."""
        order: list[int] = []
        self.step(OPTIONS.baseline, memory=True, order=order)
        self.names = [self.names[i] for i in order]
        return self.names

    def step(self, option: str | list[str], memory: bool, journal: bool = False,
             order: list[int] | None = None) -> StepCosts:
        """One step with segment ``i`` under ``option`` (or ``option[i]``); ``journal``: inside
        :func:`journal_writes` (writes outside segments are journaled, R6); ``order``: a list that
        receives the segments' indices in the order they ran (otherwise another order is refused)."""
        options = [option] * len(self.names) if isinstance(option, str) else option
        for name, o in zip(self.names, options):
            wrap_module(self.model.get_submodule(name), o, name, self.state, **self.opts)
        pm = PeakMemory(self.device, roots=self.roots()) if memory else None
        probe = Probe(self.names, self.device, pm, ordered=order is None)
        for name in self.names:
            self.model.get_submodule(name).forward.probe = probe
        try:
            if pm is not None:
                pm.__enter__()
            try:
                probe.event("start")
                from ._checkpoint import journal_writes

                with journal_writes() if journal else contextlib.nullcontext():
                    self.run()
                probe.event("end")
                probe.check_every_segment_ran()  # only when the step completed: its own error wins
                if order is not None:
                    order[:] = probe.order
                if pm is not None and self.device.type != "cuda":
                    self.carried += [weakref.ref(st) for st in pm.new_storages()]
            finally:
                if pm is not None:
                    pm.__exit__(None, None, None)
                probe.close()
        finally:
            for name in self.names:
                unwrap_module(self.model.get_submodule(name))
        return read_timeline(probe.events, len(self.names))


def _has_state(module: nn.Module, state: Any) -> bool:
    """Can ``module`` hold state region could journal? (``"auto"``/``"buffers"``: its buffers.)"""
    return state not in ("buffers", "auto") or any(True for _ in module.buffers())


def _shares_state(model: nn.Module, name: str, state: Any) -> bool:
    """True if another part of the model can write what segment ``name`` declares (R6): with
    ``state="buffers"``, one of its buffers' storages is also a buffer outside it."""
    if state not in ("buffers", "auto"):
        return True
    inside = {b.untyped_storage().data_ptr() for b in model.get_submodule(name).buffers() if b.numel()}
    outside = {b.untyped_storage().data_ptr() for n, m in model.named_modules() if n != name
               and not n.startswith(name + ".") for b in m.buffers(recurse=False) if b.numel()}
    return bool(inside & outside)


def _chain_journal(runner: "_Runner", names: list[str], stateful: list[bool], option: str) -> dict[int, int]:
    """Journal bytes of each region segment whose state others also write, held inside the chain
    after every forward (later segments eager, their writes journaled: R6, paper §3.1)."""
    out = {}
    for i, name in enumerate(names):
        if stateful[i] and _shares_state(runner.model, name, runner.state):
            plan = [OPTIONS.baseline] * len(names)
            plan[i] = option
            out[i] = runner.step(plan, memory=True, journal=True).preserved_at_backward_bytes
    return out


#: Attributes by which frameworks switch their own (torch) checkpointing on, and how to turn it off.
_FRAMEWORK_SWITCHES = (
    ("gradient_checkpointing", "transformers",
     "model.activation_checkpointing_disable() (gradient_checkpointing_disable() before transformers 5; "
     "stateremat.integrations.transformers.disable(model) after its enable)"),
    ("grad_checkpointing", "timm", "model.set_grad_checkpointing(False)"),
)


def refuse_framework_checkpointing(model: nn.Module, api: str = _API) -> None:
    """Raise ``ValueError`` if a framework's own checkpointing is on in ``model`` (a module with
    ``gradient_checkpointing=True``, transformers, or ``grad_checkpointing=True``, timm): a card
    would then measure ``eager`` with the framework's checkpoint replaying those modules."""
    for attr, framework, off in _FRAMEWORK_SWITCHES:
        on = [n or type(model).__name__ for n, m in model.named_modules() if getattr(m, attr, False) is True]
        if on:
            raise ValueError(f"{api}: the model's own {framework} checkpointing is on ({attr}=True on "
                             f"{on[:3]}{' ...' if len(on) > 3 else ''}); expected it off, or every option measured, "
                             "'eager' included, would run under that checkpoint and the card would be wrong. "
                             f"Tip: call {off} first; apply the plan stateremat makes instead.")


def profile(model: nn.Module, segments: Any, step: Any = None, *, options: Iterable[Any] = OPTIONS,
            device: Any = None, repeats: int = 5, state: Any = "auto", optimizers: Iterable[Any] = (),
            **segment_options: Any) -> ProfileCard:
    """Measure the profile card of ``model``'s segments for one training step on this device.

    Per segment and option (all segments under that option in one step, in context): retained
    bytes ``r`` (live at its forward exit − at its entry), temporary bytes ``q`` (its forward or
    backward peak, replay included, above that exit level) and seconds ``c`` (its forward +
    backward, median of ``repeats`` rounds that interleave the options). ``P`` = the bytes live
    when the first segment starts (parameters, gradients, buffers, optimizer state, the batch and
    what the part before the first segment holds, such as stem activations) + an allowance so that
    ``P + Σ r + max q`` also covers the peaks before the first segment and after the backward
    (the stem's backward, the optimizer step) for every plan. The head and loss, which run with
    every segment's ``r`` live, are charged as the last segment's ``q``. The card's
    ``meta["persistent"]`` says how ``P`` and that ``q`` were made up. Profiling leaves the model as it was: every parameter, gradient,
    buffer and attribute (bytes and bindings), the generator states and the given optimizers'
    state (given or found stepping the model's parameters) are restored afterwards.

    Args:
        model: any ``nn.Module`` (on CPU or one CUDA device).
        segments: module paths (list), a pattern (``"model.layers.*"``: every child of
            ``model.layers``), a container module, or ``None`` (the repeated block); see
            :func:`stateremat.torch._segments.resolve_segments`. The card lists them in the
            order the forward first runs them (eq. 3's chain), whatever their module order.
        step: ``step_fn(model)`` running one whole training step (forward, ``backward()``,
            optimizer step), or a sample batch (a tensor, a tuple of positional arguments or a dict
            of keyword arguments; the step is then ``loss.backward()`` with the output's ``.loss``
            or the mean of its first floating tensor).
        options: option names or :class:`~stateremat.contract.Option` s from
            :data:`~stateremat.contract.OPTIONS` (the required ones included), optionally
            ``"recompute_only"`` (plain ``torch.utils.checkpoint``, for the state-agnostic control).
            ``region`` is measured only for segments with declared state.
        device: where memory is measured; default the model's (CUDA: allocator peaks; CPU: the
            live-storage tracker, see :class:`PeakMemory`).
        repeats: timed rounds per option (int ≥ 1), after the two warm-up steps.
        state: each segment's state: ``"auto"`` (default: what it writes, found), ``"buffers"`` (its
            buffers) or tensors/modules.
        optimizers: optimizers ``step_fn`` steps: their state counts in ``P`` and their
            ``state_dict`` is restored afterwards, with the values (and gradients) of the
            parameters they step outside ``model``. One not given that steps a parameter of
            ``model`` is found at its first step (torch's global optimizer step pre-hook) and
            treated the same way; giving them counts their pre-existing state from the first step.
        **segment_options: ``granularity_bytes`` (bytes), ``on_undeclared``, ``verify``,
            ``preserve_rng_state``, as in :func:`apply_plan`.

    Returns:
        A validated :class:`~stateremat.contract.ProfileCard` (sizes in bytes, times in seconds)
        whose ``meta`` records the device, dtype, memory and timing methods, the make-up of ``P``,
        the segments' declared-state bytes and the load average.

    Raises:
        ValueError: bad segments (see ``resolve_segments``), an unknown option or one missing
            that every card needs, ``repeats < 1``, a segment that does not run or runs twice, or
            segments that run in another order in another step, or a framework's own
            checkpointing switched on (transformers' ``activation_checkpointing_enable()`` /
            ``gradient_checkpointing_enable()``, timm's
            ``set_grad_checkpointing()``: turn it off first), a ``device`` that names no device,
            one other than CPU or CUDA, or CUDA where there is none.
        TypeError: ``step`` is neither a function nor a batch; ``device`` of another type.
        ReplayError: from the checkpoint while a segment runs under a replaying option; this and
            any other error the step raises (``UndeclaredStateError``, ``UnsupportedError`` for a
            KV cache, the step's own) propagate as raised, the model restored.

    Danger:
        ``step_fn`` should do the same work every call; objects it changes other than the model
        and its optimizers (learning-rate schedulers, data iterators) are advanced by the
        ``2 + (1 + repeats) × len(options)`` steps profiling runs (plus one per segment whose
        buffers are shared with other parts of the model). On CPU, bytes allocated outside
        torch's dispatcher are not seen (see :class:`PeakMemory`). A region journal also covers
        later writes to the state it declared (R6): for a segment whose buffers other modules
        also hold, ``r`` of ``region`` is its journal after a whole forward with only it under
        ``region`` and later writes journaled (``meta["region_chain_journal_bytes"]``); a plan
        then needs ``stateremat.torch.journal_writes()`` around the forward, and several region
        segments on one state share one journal, so their summed ``r`` over-counts.

    References:
        Paper §4 (profile cards: r, q, c and P; eq. 3).
    """
    # with a process group, a rank whose checks or measuring raise tells the others, which raise too
    with every_rank_or_none(_API):  # (instead of waiting for it in the next collective forever)
        require_module(model, _API)
        refuse_framework_checkpointing(model)
        check_segment_options(state, segment_options, _API)
        names = resolve_segments(model, segments)
        option_names = _option_names(options)
        _check_repeats(repeats)
        optimizers = check_optimizers(optimizers, _API)
        run, inputs = make_step(model, step)
        device = model_device(model, device)
    with every_rank_or_none(_API, model_collectives=runs_collectives(model)):
        runner = _Runner(model, names, run, inputs, device, state, segment_options, optimizers)
        card = _measured_card(runner, option_names, repeats)
    # with a process group: every figure the max over the ranks, so every rank makes the same plan
    return agree_card(card)


def _measured_card(runner: "_Runner", option_names: list[str], repeats: int) -> ProfileCard:
    """This rank's card: measure, then put the model (and the optimizers) back as they were."""
    model, state = runner.model, runner.state
    snapshot = ModelSnapshot(model, tuple(runner.optimizers))
    try:
        # an optimizer step_fn steps but that was not given is found at its first step: saved and
        # restored like the given ones, its state counted in P
        with snapshot.watching_optimizers(runner.optimizers.append):
            names, mem, secs, stateful, chain = _measure(runner, model, state, option_names, repeats)
    finally:
        for name in runner.names:
            unwrap_module(model.get_submodule(name))
        snapshot.restore()
    return _card(model, names, option_names, mem, secs, runner.device, state, repeats, stateful, chain)


def _check_repeats(repeats: Any) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"{_API}: repeats must be a positive int, got {repeats!r}. Tip: 5 is a good default.")


def _measure(runner: "_Runner", model: nn.Module, state: Any, option_names: list[str], repeats: int) -> tuple:
    """Warm up, learn the segments' order, then measure memory once and time ``repeats`` rounds per option."""
    runner.warm_up()  # gradients, optimizer state, lazily built buffers
    # what a step creates and keeps (carried as roots); the card's segments (eq. 3's chain) are
    # then in the order they first run, which need not be the modules' registration order
    names = runner.learn_order()
    mem = {o: runner.step(o, memory=True) for o in option_names}
    stateful = [_has_state(model.get_submodule(n), state) for n in names]
    journaled = [o for o in option_names if OPTIONS.journals(o)]
    chain = _chain_journal(runner, names, stateful, journaled[0]) if journaled else {}
    secs: dict[str, list[list[float]]] = {o: [] for o in option_names}
    for rep in range(repeats + 1):
        for o in option_names:
            costs = runner.step(o, memory=False)
            if rep:  # the first round is a warm-up
                secs[o].append([s.time_s for s in costs.segments])
    return names, mem, secs, stateful, chain


def _card(model: nn.Module, names: list[str], option_names: list[str], mem: dict[str, StepCosts],
          secs: dict[str, list[list[float]]], device: torch.device, state: Any, repeats: int,
          stateful: list[bool], chain: dict[int, int]) -> ProfileCard:
    runs = list(mem.values())
    head = max(c.head_bytes for c in runs)
    cards = []
    for i, name in enumerate(names):
        costs = {}
        for o in option_names:
            if OPTIONS.journals(o) and not stateful[i]:
                continue
            seg = mem[o].segments[i]
            r = seg.retained_bytes
            if OPTIONS.journals(o) and i in chain:  # its journal inside the chain, later writes included (R6)
                r = max(0, r - seg.preserved_bytes + chain[i])
            # The head and loss run right after the last segment's forward, with every segment's
            # r still live: charge them as that segment's temporary bytes (eq. 3 then covers them).
            q = max(seg.temp_bytes, head) if i == len(names) - 1 else seg.temp_bytes
            costs[o] = OptionCost(r, q, statistics.median(t[i] for t in secs[o]))
        sub = model.get_submodule(name)
        meta = {"state_bytes": sum(b.nbytes for b in sub.buffers()),
                "parameter_bytes": sum(p.nbytes for p in sub.parameters())}
        if i in chain:
            meta["region_chain_journal_bytes"] = chain[i]
        cards.append(SegmentCard(name, costs, meta))
    base = max(c.base_bytes for c in runs)
    entry = max(c.entry_bytes for c in runs)
    q_floor = max(min(c.options[o].temp_bytes for o in c.options) for c in cards)
    r_floor = sum(min(c.options[o].retained_bytes for o in c.options) for c in cards)
    outside = (max(c.pre_peak_bytes for c in runs), max(c.post_peak_bytes for c in runs),
               max(c.pre_backward_peak_bytes for c in runs))
    allowance = max(0, *(p - entry - r_floor - q_floor for p in outside))
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    meta = {
        "model": type(model).__qualname__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "method": memory_method(device),
        "memory_method": memory_method(device),
        "time_method": f"median of {repeats} synchronized steps per option, options interleaved, after "
                       "1 warm-up round; per segment: forward entry to exit + backward start to end",
        "persistent": {"step_start_bytes": base, "first_segment_entry_bytes": entry,
                       "outside_peak_allowance_bytes": allowance, "head_bytes": head,
                       "head_rule": "the last segment's temp_bytes include the head and loss (head_bytes)",
                       "before_first_segment_peak_bytes": outside[0], "after_backward_peak_bytes": outside[1],
                       "before_first_segment_backward_peak_bytes": outside[2]},
        "measured_step_peak_bytes": {o: c.peak_bytes for o, c in mem.items()},
        "segments_rule": "in-context: every segment under one option per measured step; segments in the order "
                         "the step first runs them",
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg": loadavg(),
        "source_hash": source_hash({"model": repr(model), "segments": names,
                                    "shapes": [list(p.shape) for p in model.parameters()]}),
    }
    return ProfileCard(entry + allowance, cards, meta)
