"""Profile cards of the built-in chain workloads, measured by the library's profiler (paper §4).

:func:`profile_workload` builds a :class:`~stateremat.paper.workloads.StatefulChain` and its
batch and hands one training step (``loss_fn(chain(x, step)).backward()``) to the generic
:func:`stateremat.torch.profile` — the one code path every card in this project is measured by.
Per segment ``i`` and option ``o``, measured in context (every segment under ``o`` in one step):

* ``r`` (retained bytes): live bytes at the segment's forward exit minus at its entry (saved
  activations, snapshot or journal, and the output handed to the next segment);
* ``q`` (temporary bytes): the larger of its forward and backward (replay included) peak above
  that exit level; the loss is charged to the last segment;
* ``c`` (time): median synchronized seconds of its forward + backward over ``repeats`` steps per
  option, the options interleaved step by step so machine load hits them alike.

For ``region``, ``r`` holds the journal the segment keeps inside the chain after a full forward
(every other segment eager, writes journaled), which also covers later segments' writes that
destroy state it needs (R6, paper §3.1: "the union of its own and later writes"); the segment's
meta keeps it as ``region_preserved_bytes``. This is conservative for plans with several region
segments: they share one journal, so the sum over segments counts shared entries more than once.

Memory is :class:`stateremat.torch.PeakMemory` (CUDA allocator peak, or the CPU live-storage
tracker); the card's meta records which. ``P`` is the bytes live when the first segment starts:
parameters, their gradients, the state buffer and the input batch.
"""
from __future__ import annotations

import inspect
import sys
from typing import Callable, Iterable

import torch

from ...contract import ProfileCard, SegmentCard, card_options
from ..._shared.io import loadavg, source_hash
from ..workloads import StatefulChain, WorkloadConfig, loss_fn, make_batch
from ._options import wrap_segment


def _code_digest() -> str:
    from stateremat.torch import profile

    mods = (sys.modules[StatefulChain.__module__], sys.modules[__name__],
            sys.modules[wrap_segment.__module__], inspect.getmodule(profile))
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


def profile_workload(cfg: WorkloadConfig, device: str | torch.device = "cpu", *,
                     options: Iterable[str] | None = None, repeats: int = 3, step: int = 0,
                     on_segment: Callable[[int, int], None] | None = None) -> ProfileCard:
    """Measure the profile card of workload ``cfg`` on ``device``.

    Args:
        cfg: workload shape (its ``dtype`` is the dtype profiled).
        device: ``"cpu"`` or a CUDA device.
        options: options to measure (default ``card_options()``: every registered option
            and ``recompute_only``); ``region`` is skipped for segments without state.
        repeats: timed steps per option (median kept), after one warm-up round.
        step: training step whose write indices are used.
        on_segment: progress callback ``(done, total)``, called per segment once the card is measured.

    Returns:
        A validated :class:`~stateremat.contract.ProfileCard` whose meta records device,
        dtype, workload parameters, memory method, timing method and source hash.

    Raises:
        ValueError: on an unknown option.

    Danger:
        Times are measured on a possibly shared machine; the card records ``loadavg`` but cannot
        remove interference. Several region segments share one journal, so their summed ``r``
        over-counts (conservative).

    References:
        Paper §4 (r, q, c, P; eq. 3), §8–§10 (matching profiles per shape).
    """
    from stateremat.torch import profile

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

    def train_step(m: StatefulChain) -> None:
        loss_fn(m(x, step)).backward()

    card = profile(chain, list(chain.segment_names), train_step, options=options, device=device,
                   repeats=repeats, granularity_bytes=cfg.granularity_bytes,
                   state="buffers")  # the paper's methods declare the segments' buffers (§4)
    segments = []
    for i, seg in enumerate(card.segments):  # in the order the chain runs them (the card's)
        live = bool(chain.get_submodule(seg.name).live)
        meta = {"state": live, "write_rows": cfg.write_rows if live else 0}
        if "region_chain_journal_bytes" in seg.meta:
            meta["region_preserved_bytes"] = seg.meta["region_chain_journal_bytes"]
        segments.append(SegmentCard(seg.name, seg.options, meta))
        if on_segment is not None:
            on_segment(i + 1, len(card.segments))
    meta = {**card.meta, "dtype": cfg.dtype, "workload": cfg.to_dict(),
            "chain_context_preservation": any("region_preserved_bytes" in s.meta for s in segments),
            "source_hash": workload_source_hash(cfg), "loadavg": loadavg(), "step": step}
    return ProfileCard(card.persistent_bytes, segments, meta)


_CODE_DIGEST = _code_digest()
