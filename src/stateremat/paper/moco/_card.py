"""Measure the MoCo model's profile card on the running device, then plan it (paper §4, §12).

The card is measured by the library's generic profiler, :func:`stateremat.torch.profile`, on one
training step of the app (two augmented views, momentum update of the key encoder, InfoNCE loss,
backward, SGD step) with the seven segments named by module path and every option of
:data:`~stateremat.contract.OPTIONS` plus ``recompute_only`` (the cost the state-agnostic control
believes ``whole`` has). Per segment, measured in context (every segment under one option per
step): ``retained_bytes`` r (live bytes at the segment's forward exit minus at its entry:
activations kept for backward, snapshots, journals, the boundary tensor), ``temp_bytes`` q (its
forward or backward peak, replay included, above that exit level; the InfoNCE loss is charged to
the last segment, ``queue``) and ``time_s`` c (forward + backward seconds, median over
``preset.profile_steps`` steps). Persistent bytes P: the live bytes when the first segment starts
(parameters, gradients, optimizer momentum, buffers and the input views). Bytes come from the
library's tracker (:class:`stateremat.torch.PeakMemory`: live storages on CPU, the allocator on
CUDA).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...contract import OPTIONS, RECOMPUTE_ONLY, ProfileCard, load_card, save_card
from ..workloads import MOCO_SEGMENTS as SEGMENTS, MoCo, two_views

__all__ = ["measure_card", "plan_for"]

_PLANNER = {"state_agnostic": "state_agnostic", "joint": "joint"}


def measure_card(preset, split, seed: int, device) -> ProfileCard:
    """Measure the seven segments' costs under each option on ``device`` (see module doc).

    Returns:
        A schema-1 :class:`~stateremat.contract.ProfileCard` named by module path.

    Danger:
        Times are medians of ``preset.profile_steps`` steps on a possibly shared machine.
    """
    from stateremat.torch import profile

    device = torch.device(device)
    torch.manual_seed(seed)
    model = MoCo(preset.width, split.fit_x.shape[1], preset.dim, preset.hidden_dim,
                 preset.queue_size, preset.temperature, preset.momentum,
                 generator=torch.Generator().manual_seed(seed)).to(device)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=preset.lr, momentum=0.9,
                          weight_decay=preset.weight_decay)
    g = torch.Generator().manual_seed(seed)
    n = preset.batch_size

    def step(m: MoCo) -> None:  # one step of the app's training loop (the batch's views are made in it)
        xq, xk = (v.to(device) for v in two_views(split.fit_x[:n], g))
        targets = torch.zeros(n, dtype=torch.long, device=device)
        opt.zero_grad(set_to_none=True)
        m.momentum_update()
        logits, _k = m(xq, xk)
        torch.nn.functional.cross_entropy(logits, targets).backward()
        opt.step()

    card = profile(model, list(SEGMENTS), step, options=[*OPTIONS.names, RECOMPUTE_ONLY], device=device,
                   repeats=max(1, preset.profile_steps), optimizers=[opt],
                   state="buffers")  # the paper's methods declare the segments' buffers
    meta = {**card.meta, "workload": "moco", "preset": preset.name, "seed": seed, "dtype": "float32"}
    return ProfileCard(card.persistent_bytes, card.segments, meta)


def plan_for(preset, split, seed: int, method: str, device, out_dir) -> Any:
    """Measure (or reuse) the seed's card under ``out_dir/cards`` and plan it for ``method``."""
    from ...planner import eager_fraction_budget, plan

    path = Path(out_dir) / "cards" / f"seed-{seed}.json"
    if path.is_file():
        card = load_card(path)
    else:
        card = measure_card(preset, split, seed, device)
        save_card(card, path)
    budget = preset.budget_bytes
    if budget is None:  # the paper's budget/eager ratio applied to this device's measured card
        budget = eager_fraction_budget(card, preset.budget_eager_fraction)
    return plan(card, budget_bytes=budget, planner=_PLANNER[method])
