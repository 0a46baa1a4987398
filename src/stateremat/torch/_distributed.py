"""One plan for every rank of a process group (issue 24).

Profiled costs differ from rank to rank (timing noise, data), so plans made per rank differ, and
a collective inside replayed segments (a synchronized BatchNorm) then pairs one rank's replay
with another segment's forward on another rank: a silent divergence. Two rules, active only when
``torch.distributed`` has an initialized process group of more than one rank:

* :func:`agree_card`: ``profile`` (and so ``auto_checkpoint``) reduces every measured figure of
  its card — each segment's ``r``, ``q``, ``c`` per option, ``P`` and the numbers that make up
  ``P`` — with a MAX all-reduce before anyone plans on it. Every rank then holds the same card and
  the deterministic planner makes the same plan; the max is the safe figure for a budget.
* :func:`check_same_plan`: ``apply_plan`` all-gathers a hash of the plan (segment names and
  options) and refuses, on every rank, a plan that differs across ranks (``ValueError`` naming
  the ranks and the fix). Both are collectives: every rank of the group must call them.
* :func:`every_rank_or_none`: a rank whose own checks or measuring raise before one of these
  collectives still joins a collective that tells the other ranks, which then raise naming it,
  instead of waiting for it forever.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import sys
from typing import Any, Iterator

import torch

from stateremat.contract import OptionCost, ProfileCard


def _group_size() -> int:
    """World size of the default process group, 1 without one (``torch.distributed`` not imported,
    unavailable or not initialized)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size()


def _device() -> torch.device:
    import torch.distributed as dist

    backend = str(dist.get_backend())
    return torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")


def _gather_ints(value: int) -> list[int]:
    """Every rank's ``value``, by rank (one all-gather)."""
    import torch.distributed as dist

    mine = torch.tensor([value], dtype=torch.int64, device=_device())
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [int(t.item()) for t in out]


def _gather_digests(text: str) -> list[int]:
    return _gather_ints(_digest(text))


@contextlib.contextmanager
def every_rank_or_none(api: str, model_collectives: bool = False) -> Iterator[None]:
    """Around one rank's part before the group's next collective (its local checks, its measuring).

    On leaving, every rank all-gathers whether its part raised: a rank that failed still joins
    that collective, then raises its own error, and the others raise ``RuntimeError`` naming it,
    instead of waiting for it in the next collective forever. Nothing without a group of more than
    one rank.

    With ``model_collectives`` (the part runs steps of a model whose framework runs collectives of
    its own, DDP's, FSDP2's, DTensor's: ``_framework.runs_collectives``), or when the part issued
    collectives itself before failing (a ``step_fn`` that all-reduces its loss: the group's
    sequence number moved), a rank that fails raises at once and joins nothing: the other ranks
    may be waiting in that collective, not in ours, and a rank waiting in ours would hang them all;
    its process ending (an uncaught error) ends theirs, as without stateremat. (A ``step_fn`` that
    fails in its first call before its first collective still joins ours: then the others wait.)
    """
    if _group_size() == 1:
        yield
        return
    from ._compat import collectives_issued

    issued = collectives_issued()
    try:
        yield
    except BaseException:
        if not model_collectives and collectives_issued() == issued:
            _gather_ints(1)  # tell the others; then this rank's own error
        raise
    flags = _gather_ints(0)
    failed = [rank for rank, f in enumerate(flags) if f]
    if failed:
        import torch.distributed as dist

        raise RuntimeError(
            f"{api}: rank(s) {failed} of the process group raised an error in their part before this collective "
            f"(each raises its own there) while this rank ({dist.get_rank()}) had none, so every rank stops here "
            "instead of waiting for them in the collective forever (expected every rank to succeed). Tip: fix the "
            f"error rank(s) {failed} raised; every rank must call {api} with the same arguments.")


def _by_digest(digests: list[int]) -> str:
    groups: dict[int, list[int]] = {}
    for rank, d in enumerate(digests):
        groups.setdefault(d, []).append(rank)
    return " vs ".join(f"ranks {ranks}" for ranks in groups.values())


def agree_card(card: ProfileCard, api: str = "stateremat.torch.profile") -> ProfileCard:
    """``card`` with every measured figure the MAX over the process group's ranks (``card`` itself
    without a group of more than one rank)."""
    if _group_size() == 1:
        return card
    import torch.distributed as dist

    layout = repr([(s.name, sorted(s.options)) for s in card.segments])
    digests = _gather_digests(layout)
    if len(set(digests)) > 1:
        raise ValueError(f"{api}: the ranks profiled different segments or options ({_by_digest(digests)}; this "
                         f"rank: {layout}), so no plan can be the same on every rank. Tip: pass the same "
                         "segments= and options= on every rank.")
    parts = card.meta.get("persistent", {})
    part_keys = sorted(k for k, v in parts.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    flat = [float(card.persistent_bytes)] + [float(parts[k]) for k in part_keys]
    for s in card.segments:
        for o in sorted(s.options):
            c = s.options[o]
            flat += [float(c.retained_bytes), float(c.temp_bytes), float(c.time_s)]
    t = torch.tensor(flat, dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    vals = t.tolist()
    persistent, i = int(vals[0]), 1
    meta = dict(card.meta)
    meta["persistent"] = {**parts, **{k: int(vals[1 + j]) for j, k in enumerate(part_keys)}}
    i += len(part_keys)
    segments = []
    for s in card.segments:
        costs = {}
        for o in sorted(s.options):
            costs[o] = OptionCost(int(vals[i]), int(vals[i + 1]), vals[i + 2])
            i += 3
        segments.append(dataclasses.replace(s, options={o: costs[o] for o in s.options}))
    meta["ranks_rule"] = (f"every figure is the max over the {dist.get_world_size()} ranks of the process "
                          "group (one plan for every rank)")
    return dataclasses.replace(card, persistent_bytes=persistent, segments=tuple(segments), meta=meta)


def check_same_plan(options: list[str], names: list[str], api: str = "apply_plan") -> None:
    """Refuse a plan that differs across the process group's ranks (nothing without a group).

    Raises:
        ValueError: naming which ranks hold which plan, and the fix.
    """
    if _group_size() == 1:
        return
    plan = repr(list(zip(names, options)))
    digests = _gather_digests(plan)
    if len(set(digests)) > 1:
        raise ValueError(
            f"{api}: the plan differs across the ranks of the process group ({_by_digest(digests)}; this rank's "
            f"plan: {dict(zip(names, options))}), so a collective inside a replayed segment (a synchronized "
            "BatchNorm) would pair one rank's replay with another segment's forward on another rank (expected "
            "the same plan on every rank). Tip: make the plan with stateremat.torch.profile/auto_checkpoint, "
            "which agree on one card across ranks, or plan on rank 0 and broadcast it "
            "(torch.distributed.broadcast_object_list) before apply_plan.")
