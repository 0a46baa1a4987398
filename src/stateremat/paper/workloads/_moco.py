"""MoCo-style contrastive model with a dense FP32 negative queue that is written during forward.

Seven segments, named by module path so a plan can wrap them: ``encoder_q.stem``,
``encoder_q.layer1`` … ``encoder_q.layer4``, ``head_q`` (pool + projection MLP) and ``queue``
(InfoNCE logits against the queue, then — in ``strict`` mode — the enqueue of this step's keys).
Every segment holds state a replay must preserve: BatchNorm running statistics in train mode and,
in ``queue``, the queue rows and the ring pointer (paper §12, rule R1).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ._resnet import ResNet18

__all__ = ["MoCo", "ProjectionHead", "QueueHead", "SEGMENTS", "two_views"]

SEGMENTS = ("encoder_q.stem", "encoder_q.layer1", "encoder_q.layer2", "encoder_q.layer3",
            "encoder_q.layer4", "head_q", "queue")


class ProjectionHead(nn.Module):
    """Global average pool, then Linear–BN–ReLU–Linear, then L2 normalisation.

    Args:
        in_dim: channels of the trunk output ``(batch, in_dim, h, w)``.
        hidden_dim: hidden width of the MLP.
        out_dim: embedding size ``d`` of the output ``(batch, d)`` (float32, unit rows).
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim, bias=False)
        self.bn = nn.BatchNorm1d(hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.flatten(torch.mean(x, dim=(2, 3)), 1)
        return nn.functional.normalize(self.fc2(torch.relu(self.bn(self.fc1(h)))), dim=1)


class QueueHead(nn.Module):
    """InfoNCE logits of queries against their keys and a ring queue of FP32 negative keys.

    ``mode="strict"`` enqueues the keys inside ``forward`` (after computing the logits), so the
    forward reads the queue version *before* its own write; autograd retains that version through
    a clone, as the original MoCo code does. ``mode="deferred"`` leaves the write to
    :meth:`enqueue`, called by the training loop after backward and the optimizer step.

    Args:
        queue_size: number of negative keys ``K`` (must be a multiple of the batch size).
        dim: key size ``d``; the queue is float32 ``(K, d)`` (``K·d·4`` bytes; 64 MiB at the
            paper's 131,072 × 128).
        temperature: InfoNCE temperature ``τ``.
        generator: seeds the random unit-norm initial queue.

    Returns (forward):
        float32 logits ``(batch, 1 + K)``; column 0 is the positive pair.

    Danger:
        The ring pointer advances by the batch size; a batch that does not divide ``K`` is
        refused rather than wrapped.

    References:
        Paper §12 (strict in-forward enqueue; deferred eager as the legal control).
    """

    def __init__(self, queue_size: int, dim: int, temperature: float,
                 generator: torch.Generator | None = None, mode: str = "strict"):
        super().__init__()
        init = torch.randn(queue_size, dim, generator=generator, dtype=torch.float32)
        self.register_buffer("queue", nn.functional.normalize(init, dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.temperature = float(temperature)
        self.mode = mode

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if self.mode not in ("strict", "deferred"):
            raise ValueError(f"QueueHead: mode must be 'strict' or 'deferred', got {self.mode!r}. "
                             "Tip: 'strict' enqueues during forward (paper §12).")
        # Strict: this forward overwrites rows it also reads, so keep the read version (rule R1).
        negatives = self.queue.clone() if self.mode == "strict" else self.queue
        l_pos = (q * k).sum(dim=1, keepdim=True)
        l_neg = q @ negatives.t()
        logits = torch.cat([l_pos, l_neg], dim=1) / self.temperature
        if self.mode == "strict":
            self.enqueue(k)
        return logits

    @torch.no_grad()
    def enqueue(self, k: torch.Tensor) -> None:
        """Write keys ``k`` ``(batch, d)`` at the ring pointer and advance it (in place)."""
        size, batch = self.queue.shape[0], k.shape[0]
        if size % batch:
            raise ValueError(f"QueueHead.enqueue: queue size {size} is not a multiple of the batch "
                             f"size {batch}. Tip: choose a queue size that the batch divides.")
        p = int(self.ptr)
        self.queue[p:p + batch] = k.detach()
        self.ptr.fill_((p + batch) % size)


class MoCo(nn.Module):
    """Query encoder + projection head, momentum (EMA) key encoder + head, and the queue.

    Args:
        width: ResNet-18 base width ``w``.
        in_channels: image channels.
        dim: embedding size ``d``.
        hidden_dim: projection MLP hidden width.
        queue_size: negatives ``K``.
        temperature: InfoNCE ``τ``.
        momentum: EMA coefficient ``m`` of the key encoder (``θ_k ← m θ_k + (1-m) θ_q``).
        generator: seeds the queue initialisation (parameters use the global torch seed).

    Returns (forward):
        ``(logits (batch, 1+K), keys (batch, d))`` for two views ``(batch, c, h, w)``.

    References:
        Paper §12; He et al. 2020 (MoCo).
    """

    def __init__(self, width: int, in_channels: int, dim: int, hidden_dim: int, queue_size: int,
                 temperature: float, momentum: float, generator: torch.Generator | None = None,
                 mode: str = "strict"):
        super().__init__()
        self.encoder_q = ResNet18(width, in_channels)
        self.head_q = ProjectionHead(self.encoder_q.feature_dim, hidden_dim, dim)
        self.encoder_k = copy.deepcopy(self.encoder_q)
        self.head_k = copy.deepcopy(self.head_q)
        for p in list(self.encoder_k.parameters()) + list(self.head_k.parameters()):
            p.requires_grad_(False)
        self.queue = QueueHead(queue_size, dim, temperature, generator, mode)
        self.momentum = float(momentum)
        # Pair parameters now: wrapping segments later renames them but keeps the objects.
        q_params = list(self.encoder_q.parameters()) + list(self.head_q.parameters())
        k_params = list(self.encoder_k.parameters()) + list(self.head_k.parameters())
        self._pairs = list(zip(q_params, k_params))

    @torch.no_grad()
    def momentum_update(self) -> None:
        """EMA update of the key encoder from the query encoder (outside every segment)."""
        for pq, pk in self._pairs:
            pk.mul_(self.momentum).add_(pq, alpha=1.0 - self.momentum)

    def forward(self, x_q: torch.Tensor, x_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x_q
        for name in ResNet18.segment_names:
            h = getattr(self.encoder_q, name)(h)
        q = self.head_q(h)
        with torch.no_grad():
            g = x_k
            for name in ResNet18.segment_names:
                g = getattr(self.encoder_k, name)(g)
            k = self.head_k(g)
        return self.queue(q, k), k


def two_views(x: torch.Tensor, generator: torch.Generator, pad: int = 2,
              jitter: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independently augmented views: random crop (zero padding), horizontal flip, contrast.

    Every draw comes from ``generator`` on the CPU, so the views are a function of its state.

    Args:
        x: float32 images ``(batch, c, h, w)``, already normalised.
        generator: CPU ``torch.Generator`` (advanced by the call).
        pad: crop padding in pixels.
        jitter: contrast scale is drawn uniformly from ``[1 - jitter, 1 + jitter]``.

    Returns:
        Two float32 tensors ``(batch, c, h, w)``.
    """
    return _augment(x, generator, pad, jitter), _augment(x, generator, pad, jitter)


def _augment(x: torch.Tensor, g: torch.Generator, pad: int, jitter: float) -> torch.Tensor:
    b, _, h, w = x.shape
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=g)
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=g)
    flip = torch.rand(b, generator=g) < 0.5
    scale = 1.0 + jitter * (2.0 * torch.rand(b, generator=g) - 1.0)
    padded = nn.functional.pad(x, (pad, pad, pad, pad))
    rows = (oy[:, None] + torch.arange(h))[:, :, None]          # (b, h, 1)
    cols = ox[:, None] + torch.arange(w)                         # (b, w)
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, :]  # (b, 1, w)
    idx = torch.arange(b)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx, rows, cols].permute(0, 3, 1, 2)  # (b, c, h, w)
    # NCHW strides even for one channel: there (n, 1, h, w) strides (h*w, 1, w, 1) also read as
    # channels_last, and torch 2.13's CPU backward of a 4->8 1x1 stride-2 conv in channels_last
    # corrupts the heap (seen on AMD EPYC; tests/test_datasets_moco.py)
    return (out * scale.to(out.dtype)[:, None, None, None]).clone(memory_format=torch.contiguous_format)
