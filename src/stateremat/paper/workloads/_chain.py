"""The three stateful workloads as chains of segments over one shared, declared state buffer.

Every segment computes a dense block ``h = tanh(x @ w1 + b1)`` of shape ``(batch, hidden)``
(``hidden = 1.25 * width``), reads rows of the state buffer, mixes them into its output
``y = x + h @ w2 + sigmoid(mean(dropout(h[:, :width] @ keys.T / sqrt(width))))`` and then writes
``write_rows`` rows of the buffer in place (``index_copy_``):

- feature queue: enqueues rows of ``h`` at a ring pointer (reads the rows it is about to replace);
- prototype memory: picks ``write_rows`` random distinct prototypes (drawn in O(k),
  :func:`distinct_rows`), reads them and writes an EMA update;
- unrolled recurrence: reads strided memory cells and writes ``tanh(0.5 * old + h)`` back.

Eager execution therefore retains ``h`` and ``y``: 2.25 activation sizes per segment, against
2 for a checkpoint with a whole snapshot (its output plus one state-sized copy when the state is
as large as an activation). That is the ratio the paper's Table 4 implies for its large cells
((46.06 - 42.06) GiB / 16 segments = 0.25 GiB above whole per segment); it is a design choice
of this reimplementation, not a shape the paper states.

Which rows a segment touches depends only on ``(seed, step, segment index)``, so a replay in
backward touches the same rows as the original forward. The *same* math written out-of-place
(state threaded as an input/output) is :meth:`StateSegment.functional`: it is the functional
reference of the semantic checks and the ``functional`` method.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._config import WorkloadConfig

_KEY_ROWS = 16  # rows of the read set mixed into the output (the rest is read for the update)


def _dtype(cfg: WorkloadConfig) -> torch.dtype:
    return torch.float32 if cfg.dtype == "float32" else torch.float64


def distinct_rows(rows: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` distinct row indices drawn uniformly from ``range(rows)``, in O(k) time and memory.

    Sequential sampling without replacement by rejection: the first ``k`` distinct values of a
    sequence of i.i.d. ``torch.randint(rows)`` draws are a uniform random ``k``-subset. The
    sequence starts with ``k`` draws and is extended (by twice the rows still missing) only while
    it holds fewer than ``k`` distinct values; duplicates are found by one stable sort. With
    ``k <= rows / 2`` at most half of any draw repeats, so the expected work is O(k log k) and no
    tensor of ``rows`` elements is made (the ``randperm(rows)`` this replaces cost O(rows) per
    call: 30 ms for 524,288 rows, against 0.2 ms here). A dense request (``k > rows / 2``) takes
    the first ``k`` of ``torch.randperm(rows)``: O(rows) = O(k) there.

    Every draw comes from ``generator`` (a CPU generator), so the result is a deterministic
    function of its state: a replay that seeds it the same way sees the same rows.

    Args:
        rows: size of the population (rows of the state buffer), ``>= 1``.
        k: how many distinct rows, ``1 <= k <= rows``.
        generator: the seeded CPU generator every draw comes from.

    Returns:
        int64 CPU tensor ``(k,)`` of distinct indices in ``[0, rows)``, sorted ascending.

    Raises:
        ValueError: ``k`` outside ``[1, rows]``.
    """
    if not 1 <= k <= rows:
        raise ValueError(f"distinct_rows: k must be in [1, rows={rows}], got {k}. Tip: a segment "
                         "writes at least one and at most every row of the buffer.")
    if 2 * k > rows:
        return torch.sort(torch.randperm(rows, generator=generator)[:k]).values
    draws = torch.randint(rows, (k,), generator=generator, dtype=torch.int64)
    while True:
        ordered, order = torch.sort(draws, stable=True)
        first = torch.ones(draws.numel(), dtype=torch.bool)  # first occurrence of its value
        first[1:] = ordered[1:] != ordered[:-1]
        distinct = int(first.sum())
        if distinct == draws.numel() == k:  # no repeat: the common case
            return ordered
        if distinct >= k:  # the first k distinct values in draw order
            return torch.sort(draws[torch.sort(order[first]).values[:k]]).values
        more = torch.randint(rows, (2 * (k - distinct),), generator=generator, dtype=torch.int64)
        draws = torch.cat([draws, more])


def write_indices(cfg: WorkloadConfig, step: int, segment: int, device) -> torch.Tensor:
    """Rows of the state buffer that segment ``segment`` reads and writes at ``step``.

    Args:
        cfg: workload shape.
        step: training step (Python int; part of the segment's arguments so replay agrees).
        segment: index of the segment in the chain.
        device: where to put the index tensor.

    Returns:
        int64 tensor ``(write_rows,)`` of distinct row indices.
    """
    rows, k = cfg.state_rows, cfg.write_rows
    tick = step * cfg.segments + segment
    if cfg.workload == "feature_queue":  # ring buffer: contiguous window at the pointer
        idx = (tick * k + torch.arange(k)) % rows
    elif cfg.workload == "prototype_memory":  # sparse scatter: random distinct prototypes
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + tick)
        idx = distinct_rows(rows, k, g)
    else:  # unrolled recurrence: strided memory cells, a different phase each tick
        stride = max(1, rows // k)
        idx = (tick % stride + torch.arange(k) * stride) % rows
    return idx.to(device)


class StateSegment(nn.Module):
    """One segment: a dense block that reads and (if live) writes the shared state buffer.

    Args:
        cfg: workload shape.
        index: position in the chain.
        state: the shared ``(rows, width)`` buffer (registered as buffer ``state``) or ``None``
            for a segment that does not touch state.
        generator: CPU generator for parameter initialisation.

    Danger:
        The buffer object is shared by every live segment; moving the module with ``.to()``
        would give each segment its own copy. Build the chain on its final device instead.

    References:
        Paper §8 (workloads), §3.1 (region baseline).
    """

    def __init__(self, cfg: WorkloadConfig, index: int, state: torch.Tensor | None,
                 generator: torch.Generator):
        super().__init__()
        self.cfg, self.index = cfg, index
        w, dt = cfg.width, _dtype(cfg)
        dev = state.device if state is not None else "cpu"
        init = lambda *shape: (torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
                               / math.sqrt(w)).to(dt).to(dev)
        hidden = cfg.hidden
        self.w1 = nn.Parameter(init(w, hidden))
        self.b1 = nn.Parameter(init(hidden) * 0.1)
        self.w2 = nn.Parameter(init(hidden, w) * math.sqrt(w / hidden))
        self.live = state is not None
        if state is not None:
            self.register_buffer("state", state)

    def _block(self, x: torch.Tensor, keys: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(torch.addmm(self.b1, x, self.w1))  # (batch, hidden): the large activation
        y = x + h @ self.w2
        hw = h[:, : self.cfg.width]
        if keys is not None:  # scores against the state rows; dropout there exercises RNG replay
            s = (hw @ keys.T) * (1.0 / math.sqrt(self.cfg.width))
            if self.cfg.dropout > 0:
                s = F.dropout(s, self.cfg.dropout, self.training)
            y = y + torch.sigmoid(s.mean(-1, keepdim=True))
        return y, hw

    def _reads_and_update(self, state: torch.Tensor, x: torch.Tensor, step: int):
        idx = write_indices(self.cfg, step, self.index, state.device)
        kr = min(_KEY_ROWS, idx.numel())
        if self.cfg.workload == "feature_queue":
            old = None
            keys = state.index_select(0, idx[:kr])
        else:
            old = state.index_select(0, idx)
            keys = old[:kr].clone()  # a view would keep all of ``old`` alive as a saved tensor
        y, h = self._block(x, keys)
        src = h.detach()
        k = idx.numel()
        if k <= src.shape[0]:
            src = src[:k]
        else:
            src = src.index_select(0, torch.arange(k, device=src.device) % src.shape[0])
        if self.cfg.workload == "feature_queue":
            vals = src
        elif self.cfg.workload == "prototype_memory":
            vals = 0.9 * old + 0.1 * src
        else:
            vals = torch.tanh(0.5 * old + src)
        return y, idx, vals

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """Stateful forward: returns ``y (batch, width)`` and writes the buffer in place."""
        if not self.live:
            return self._block(x, None)[0]
        y, idx, vals = self._reads_and_update(self.state, x, step)
        self.state.index_copy_(0, idx, vals)
        return y

    def functional(self, x: torch.Tensor, state: torch.Tensor | None, step: int):
        """Out-of-place forward: returns ``(y, new_state)``; ``state`` is not modified."""
        if not self.live:
            return self._block(x, None)[0], state
        y, idx, vals = self._reads_and_update(state, x, step)
        return y, state.index_copy(0, idx, vals)


class StatefulChain(nn.Module):
    """A workload: segments ``seg0 .. seg{n-1}`` (module paths for ``apply_plan``) over one buffer.

    Args:
        cfg: workload shape; the last ``cfg.live_versions`` segments write the buffer.
        device: device to build on (the buffer is shared, so never ``.to()`` the chain).

    Call ``chain(x, step)`` with ``x (batch, width)`` to run the stateful forward.

    References:
        Paper §8–§10.
    """

    def __init__(self, cfg: WorkloadConfig, device: str | torch.device = "cpu"):
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        init = torch.randn(cfg.state_rows, cfg.width, generator=g, dtype=torch.float64)
        state = init.to(_dtype(cfg)).to(device)
        first_live = cfg.segments - cfg.live_versions
        self.segment_names = cfg.segment_names
        for i, name in enumerate(self.segment_names):
            self.add_module(name, StateSegment(cfg, i, state if i >= first_live else None, g))

    @property
    def state(self) -> torch.Tensor:
        """The shared declared state buffer ``(rows, width)``."""
        for seg in self._base:
            if seg.live:
                return seg.state
        raise AttributeError("StatefulChain.state: no live segment holds the state buffer. "
                             "Tip: use live_versions >= 1.")

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        for name in self.segment_names:  # look up by name: apply_plan may replace modules
            x = getattr(self, name)(x, step)
        return x

    def functional(self, x: torch.Tensor, state: torch.Tensor, step: int, *,
                   checkpoint: bool = False):
        """Functional reference: thread ``state`` out-of-place; returns ``(y, final_state)``.

        With ``checkpoint=True`` every segment is wrapped in ``torch.utils.checkpoint``
        (non-reentrant, RNG preserved): the segments are pure, so plain recomputation is
        correct, and every state version stays alive as a checkpoint input (the paper's
        ``functional`` method).
        """
        from torch.utils.checkpoint import checkpoint as tcheckpoint

        for seg in self._base:
            if checkpoint:
                x, state = tcheckpoint(seg.functional, x, state, step, use_reentrant=False)
            else:
                x, state = seg.functional(x, state, step)
        return x, state

    def set_state(self, new_state: torch.Tensor) -> None:
        """Rebind the shared buffer of every live segment to ``new_state`` (same shape)."""
        for seg in self._base:
            if seg.live:
                seg.state = new_state

    @property
    def _base(self) -> list[StateSegment]:
        out = []
        for name in self.segment_names:
            m = getattr(self, name)
            out.append(unwrap_segment(m))
        return out


def unwrap_segment(m: nn.Module) -> StateSegment:
    """The :class:`StateSegment` inside ``m`` (checkpoint wrappers hold it as a child module)."""
    seen = 0
    while not isinstance(m, StateSegment):
        children = list(m.children())
        if not children or seen > 8:
            raise TypeError(f"StatefulChain: cannot find the StateSegment inside {type(m).__name__}. "
                            "Tip: wrap segments with stateremat.torch.apply_plan.")
        m, seen = children[0], seen + 1
    return m


def make_batch(cfg: WorkloadConfig, device: str | torch.device = "cpu") -> torch.Tensor:
    """The input batch ``(batch, width)`` of ``cfg`` (seeded, in ``cfg.dtype``)."""
    g = torch.Generator().manual_seed(cfg.seed + 7)
    return torch.randn(cfg.batch, cfg.width, generator=g, dtype=torch.float64).to(_dtype(cfg)).to(device)


def loss_fn(y: torch.Tensor) -> torch.Tensor:
    """Scalar training loss of the chain output (mean of squares)."""
    return y.square().mean()
