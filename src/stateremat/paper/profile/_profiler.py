"""Measure a profile card (r, q, c per segment and option; P) on the running device (paper §4).

For each segment ``i`` in forward order and each option ``o`` the segment runs alone on its real
input (the chain's activation at ``i``, computed by running segments ``0..i-1``), wrapped with
``o``:

* ``r`` (retained bytes): live bytes after the segment's forward minus before it (saved
  activations, snapshot or journal, and the output handed to the next segment);
* ``q`` (temporary bytes): the larger of the forward and the backward (replay included) peak
  above that post-forward level;
* ``c`` (time): least synchronized wall time of forward + backward over at least ``repeats``
  runs (more for sub-millisecond segments) after one warm-up round, measured without the
  memory tracker, the options of a segment interleaved run by run so machine load hits them
  alike.

For ``region``, ``r`` swaps the journal measured alone for the journal the segment holds
inside the chain after a full forward (with every other segment eager, writes journaled), which
also covers later segments' writes that destroy state it needs (R6, paper §3.1: "the union of
its own and later writes"). This is conservative for plans with several region segments: they
share one journal, so the sum over segments counts shared entries more than once.

Memory uses :class:`stateremat.torch._memory.PeakMemory` (CUDA allocator peak, or the CPU
live-storage tracker); the card's meta records which. ``P`` is the bytes of parameters, their
gradients, the state buffer and the input batch.
"""
from __future__ import annotations

import inspect
import math
import time
from typing import Callable, Iterable

import torch

from ...contract import OptionCost, ProfileCard, SegmentCard, card_options, source_hash
from ...torch import PeakMemory, memory_method, storage_bytes
from ..workloads import StatefulChain, WorkloadConfig, loss_fn, make_batch
from ._options import journal_scope, preserved_now, sync, wrap_segment


def _code_digest() -> str:
    import sys

    mods = (sys.modules[StatefulChain.__module__], sys.modules[__name__],
            sys.modules[wrap_segment.__module__])
    return source_hash("".join(inspect.getsource(m) for m in mods))


def workload_source_hash(cfg: WorkloadConfig) -> str:
    """SHA-256 over the workload's source code and its configuration (records cite it).

    The code digest is taken once, when this module is imported, so a long run keeps citing
    the code it actually runs even if the files change meanwhile.
    """
    return source_hash({"source": _CODE_DIGEST, "config": cfg.to_dict()})


def warm_chain(chain: StatefulChain, x: torch.Tensor, step: int = 0) -> None:
    """One eager step so gradient buffers exist (they are persistent bytes from then on)."""
    loss_fn(chain(x, step)).backward()
    for p in chain.parameters():
        p.grad.zero_()


def _measure_memory(module, xin, gy, step, device, roots):
    """``(r, q, preserved)`` of one forward + backward of ``module`` under the memory tracker."""
    with PeakMemory(device, roots=roots) as pm:
        y = module(xin, step)
        retained = pm.current_bytes - pm.baseline_bytes
        preserved = preserved_now()
        fwd_peak = pm.tracked_peak_bytes
        pm.reset_peak()
        y.backward(gy)
        bwd_peak = pm.tracked_peak_bytes
        del y
    xin.grad = None
    return max(0, int(retained)), max(0, int(max(fwd_peak, bwd_peak) - retained)), preserved


def _measure_times(modules: dict, xin, gy, step, device, repeats) -> dict[str, float]:
    """Least forward + backward seconds per option, the options interleaved run by run.

    Interleaving (A B C A B C ...) exposes every option to the same machine load. Rounds are
    repeated at least ``repeats`` times and until about 50 ms were measured (at most 25
    rounds), and the minimum is kept: on a shared machine a sub-millisecond segment is often
    preempted for a whole scheduler slice, which the minimum filters out (as ``timeit`` does).
    """
    times: dict[str, list[float]] = {o: [] for o in modules}
    rounds, rep = repeats, 0
    while rep <= rounds:
        round_s = 0.0
        for o, module in modules.items():
            sync(device)
            t0 = time.perf_counter()
            y = module(xin, step)
            y.backward(gy)
            sync(device)
            dt = time.perf_counter() - t0
            round_s += dt
            if rep:  # the first round is a warm-up
                times[o].append(dt)
            del y
            xin.grad = None
        if rep == 0:
            rounds = max(repeats, min(25, math.ceil(0.05 / max(round_s, 1e-9))))
        rep += 1
    return {o: min(ts) for o, ts in times.items()}


def _chain_journal_bytes(chain: StatefulChain, x, step, granularity_bytes) -> list[int | None]:
    """Journal bytes of each live segment after a full forward with only it under ``region``.

    A region journal also covers later writes that destroy state its segment needs (R6), which
    running a segment alone cannot show; the other segments run eager, so the preserved bytes
    read after the full forward are this segment's journal alone.
    """
    out: list[int | None] = []
    for name in chain.segment_names:
        seg = getattr(chain, name)
        if not seg.live:
            out.append(None)
            continue
        setattr(chain, name, wrap_segment(seg, "region", granularity_bytes=granularity_bytes))
        try:
            with journal_scope():  # later eager writes extend this segment's journal (R6)
                y = chain(x, step)
            out.append(preserved_now())
            loss_fn(y).backward()  # completes the transaction: state reinstated, journal freed
            del y
        finally:
            setattr(chain, name, seg)
    for p in chain.parameters():
        p.grad.zero_()
    return out


def profile_workload(cfg: WorkloadConfig, device: str | torch.device = "cpu", *,
                     options: Iterable[str] | None = None, repeats: int = 3, step: int = 0,
                     on_segment: Callable[[int, int], None] | None = None) -> ProfileCard:
    """Measure the profile card of workload ``cfg`` on ``device``.

    Args:
        cfg: workload shape (its ``dtype`` is the dtype profiled).
        device: ``"cpu"`` or a CUDA device.
        options: options to measure (default ``card_options()``: every registered option
            and ``recompute_only``); ``region`` is skipped for segments without state.
        repeats: least timed runs per segment and option (minimum kept), after one warm-up.
        step: training step whose write indices are used.
        on_segment: progress callback ``(done, total)`` after each segment.

    Returns:
        A validated :class:`~stateremat.contract.ProfileCard` whose meta records device,
        dtype, workload parameters, memory method, timing method and source hash.

    Raises:
        ValueError: on an unknown option.

    Danger:
        Times are measured on a possibly shared machine; the card records ``loadavg`` but cannot
        remove interference. ``r`` of ``region`` includes the later writes (R6) only when
        ``stateremat.torch.preservation_stats`` is available (meta
        ``chain_context_preservation``); several region segments share one journal, so their
        summed ``r`` over-counts (conservative).

    References:
        Paper §4 (r, q, c, P; eq. 3), §8–§10 (matching profiles per shape).
    """
    from ...contract import loadavg

    device = torch.device(device)
    known = card_options()
    options = list(known if options is None else options)
    for o in options:
        if o not in known:
            raise ValueError(f"profile_workload: option {o!r} is not one of {list(known)}. "
                             "Tip: options are registered in stateremat.contract.OPTIONS.")
    torch.manual_seed(cfg.seed)
    chain = StatefulChain(cfg, device)
    x = make_batch(cfg, device)
    warm_chain(chain, x, step)
    params = list(chain.parameters())
    persistent = storage_bytes(params + [p.grad for p in params] + [chain.state, x])

    chain_pres: dict[str, list[int | None]] = {}
    if "region" in options and preserved_now() is not None:
        chain_pres["region"] = _chain_journal_bytes(chain, x, step, cfg.granularity_bytes)

    g = torch.Generator().manual_seed(cfg.seed + 11)
    segments = []
    xi = x
    n = len(chain.segment_names)
    for i, name in enumerate(chain.segment_names):
        seg = getattr(chain, name)
        xin = xi.detach().requires_grad_(i > 0)
        gy = (torch.randn(xi.shape, generator=g, dtype=torch.float64) / xi.numel()).to(xi)
        roots = params + [p.grad for p in params] + [chain.state, xin, gy]
        costs, meta = {}, {"state": bool(seg.live), "write_rows": cfg.write_rows if seg.live else 0}
        modules = {o: wrap_segment(seg, o, granularity_bytes=cfg.granularity_bytes)
                   for o in options if not (o == "region" and not seg.live)}
        mem = {o: _measure_memory(m, xin, gy, step, device, roots) for o, m in modules.items()}
        secs = _measure_times(modules, xin, gy, step, device, repeats)
        for o in modules:
            r, q, iso = mem[o]
            in_chain = chain_pres.get(o, [None] * n)[i]
            if o in chain_pres and in_chain is not None:
                # swap the alone-measured preserved bytes for those held inside the chain (R6)
                meta[f"{o}_preserved_bytes"] = in_chain
                if iso is not None:
                    r = max(0, r - iso + in_chain)
            costs[o] = OptionCost(r, q, secs[o])
        segments.append(SegmentCard(name, costs, meta))
        with torch.no_grad():
            xi = seg(xi, step)
        if on_segment is not None:
            on_segment(i + 1, n)

    meta = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": cfg.dtype,
        "workload": cfg.to_dict(),
        "method": memory_method(device),
        "memory_method": memory_method(device),
        "time_method": f"min of >= {repeats} synchronized forward+backward runs (>= 50 ms per "
                       "option set, <= 25 rounds) after 1 warm-up round, options interleaved",
        "chain_context_preservation": any(v is not None for vs in chain_pres.values() for v in vs),
        "source_hash": workload_source_hash(cfg),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg": loadavg(),
        "step": step,
    }
    return ProfileCard(persistent, segments, meta)


_CODE_DIGEST = _code_digest()
