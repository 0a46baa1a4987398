"""Measure the MoCo model's profile card on the running device, then plan it (paper §4, §12).

For each option (eager, whole, region, and the never-executed ``recompute_only`` that only the
state-agnostic control reads) every segment is wrapped with that option and a few training steps
are run. Per segment:

* ``retained_bytes`` r: bytes of storages the segment's forward created that are still alive when
  forward ends (activations kept for backward, snapshots, journals, boundary tensors);
* ``temp_bytes`` q: peak live bytes during the segment's backward window (replay included) above
  the live bytes when the window opened;
* ``time_s`` c: forward time plus backward-window time (median over steps, no tracker running).

Persistent bytes P: parameters, gradients, optimizer momentum, buffers and the input views.
Bytes come from a storage tracker on CPU (creator-attributed) and the allocator on CUDA.
"""
from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ...contract import ProfileCard, load_card, save_card
from ..workloads import MOCO_SEGMENTS as SEGMENTS, MoCo, two_views
from ._methods import _set

__all__ = ["measure_card", "plan_for"]

_PLANNER = {"state_agnostic": "state_agnostic", "joint": "joint"}


class _Tracker(TorchDispatchMode):
    """Live bytes of storages created by ops, attributed to the segment running at creation."""

    def __init__(self) -> None:
        super().__init__()
        self.label: str | None = None
        self.live = 0
        self.peak = 0
        self.by_label: dict[str | None, int] = {}
        self._size: dict[int, tuple[int, str | None]] = {}
        self._lock = threading.Lock()

    def _free(self, key: int) -> None:
        with self._lock:
            n, lab = self._size.pop(key, (0, None))
            self.live -= n
            self.by_label[lab] = self.by_label.get(lab, 0) - n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0]
               if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = id(st)
            with self._lock:
                if key in ins or key in self._size:
                    continue
                n = st.nbytes()
                self._size[key] = (n, self.label)
                self.live += n
                self.by_label[self.label] = self.by_label.get(self.label, 0) + n
                self.peak = max(self.peak, self.live)
            weakref.finalize(st, self._free, key)
        return out


def _wrap(model: MoCo, option: str) -> None:
    from torch.utils.checkpoint import checkpoint

    if option == "eager":
        return
    if option == "recompute_only":  # cost model only: replay without preserving state
        class _Plain(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *a):
                return checkpoint(self.m, *a, use_reentrant=False)
        for p in SEGMENTS:
            _set(model, p, _Plain(model.get_submodule(p)))
        return
    from ...torch import StatefulCheckpoint

    for p in SEGMENTS:
        _set(model, p, StatefulCheckpoint(model.get_submodule(p), state="buffers", preserve=option))


def _measure_option(preset, split, seed: int, option: str, device) -> dict[str, dict[str, float]]:
    torch.manual_seed(seed)
    model = MoCo(preset.width, split.fit_x.shape[1], preset.dim, preset.hidden_dim,
                 preset.queue_size, preset.temperature, preset.momentum,
                 generator=torch.Generator().manual_seed(seed)).to(device)
    _wrap(model, option)
    g = torch.Generator().manual_seed(seed)
    x = split.fit_x[:preset.batch_size]
    targets = torch.zeros(len(x), dtype=torch.long, device=device)
    mods = {p: model.get_submodule(p) for p in SEGMENTS}
    clock: dict[str, Any] = {}
    tracker: _Tracker | None = None
    win: dict[str, Any] = {"open": None}
    fwd_t = {p: 0.0 for p in SEGMENTS}
    bwd_t = {p: 0.0 for p in SEGMENTS}
    temp = {p: 0 for p in SEGMENTS}

    def sync() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def close_window(now: float) -> None:
        p = win["open"]
        if p is not None:
            bwd_t[p] = now - win["t"]
            if tracker is not None:
                temp[p] = max(0, tracker.peak - win["live"])
        win["open"] = None

    def open_window(p: str) -> None:
        now = sync()
        close_window(now)
        win.update(open=p, t=now)
        if tracker is not None:
            win["live"] = tracker.live
            tracker.peak = tracker.live

    def pre(p):
        def hook(_m, _a):
            clock[p] = sync()
            if tracker is not None:
                tracker.label = p
        return hook

    def post(p):
        def hook(_m, _a, out):
            fwd_t[p] = sync() - clock[p]
            if tracker is not None:
                tracker.label = None
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda _gr: open_window(p))
        return hook

    for p, m in mods.items():
        m.register_forward_pre_hook(pre(p))
        m.register_forward_hook(post(p))
    rows = []
    for step in range(preset.profile_steps + 1):
        xq, xk = (v.to(device) for v in two_views(x, g))
        tracker = _Tracker() if step == 0 else None
        if tracker is not None:
            tracker.__enter__()
        model.momentum_update()
        logits, _k = model(xq, xk)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        retained = {p: (tracker.by_label.get(p, 0) if tracker is not None else 0) for p in SEGMENTS}
        loss.backward()
        close_window(sync())
        if tracker is not None:
            tracker.__exit__(None, None, None)
            rows_bytes = (retained, dict(temp))
        else:
            rows.append({p: fwd_t[p] + bwd_t[p] for p in SEGMENTS})
        for prm in model.parameters():
            prm.grad = None
    times = {p: float(np.median([r[p] for r in rows])) for p in SEGMENTS}
    retained, temp_b = rows_bytes
    return {p: {"retained_bytes": int(retained[p]), "temp_bytes": int(temp_b[p]),
                "time_s": times[p]} for p in SEGMENTS}


def measure_card(preset, split, seed: int, device) -> ProfileCard:
    """Measure the seven segments' costs under each option on ``device`` (see module doc).

    Returns:
        A schema-1 :class:`~stateremat.contract.ProfileCard` named by module path.

    Danger:
        The first step of each option is the byte-tracked one; times come from the following
        ``preset.profile_steps`` steps. Both are noisy on a shared machine.
    """
    from ...torch import storage_bytes

    per = {o: _measure_option(preset, split, seed, o, device)
           for o in ("eager", "whole", "region", "recompute_only")}
    torch.manual_seed(seed)
    model = MoCo(preset.width, split.fit_x.shape[1], preset.dim, preset.hidden_dim,
                 preset.queue_size, preset.temperature, preset.momentum)
    params = [p for p in model.parameters()]
    batch = preset.batch_size * int(np.prod(split.fit_x.shape[1:])) * 4
    persistent = (storage_bytes([*params, *model.buffers()])
                  + 2 * storage_bytes([p for p in params if p.requires_grad]) + 2 * batch)
    card = {"schema_version": 1, "persistent_bytes": int(persistent),
            "segments": [{"name": p, "options": {o: per[o][p] for o in per}} for p in SEGMENTS],
            "meta": {"device": str(device), "dtype": "float32", "workload": "moco",
                     "preset": preset.name, "seed": seed,
                     "method": "storage tracker (creator-attributed), median step times"}}
    return ProfileCard.from_dict(card)


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
