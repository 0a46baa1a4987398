"""Data tensors, frozen-encoder features and the linear probe of the dense-queue application.

The probe is fitted on the fitting split only, monitored on the validation split, and evaluated
once on the official test images: test data select nothing (paper §12). Its per-image test scores
(float32 logits) are the bytes hashed to prove within-seed identity across methods.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..workloads import ImageData, fit_validation_split

__all__ = ["Split", "make_split", "extract_features", "ProbeResult", "linear_probe"]


@dataclass(frozen=True)
class Split:
    """Normalised float32 image tensors ``(n, c, h, w)`` with int64 labels ``(n,)``."""

    dataset: str
    num_classes: int
    fit_x: torch.Tensor
    fit_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def make_split(data: ImageData, n_validation: int, fit_images: int | None,
               validation_images: int | None, test_images: int | None) -> Split:
    """Fixed fitting/validation split of the training images, then optional prefixes.

    Args:
        data: the official partition.
        n_validation: validation images cut from training (10,000 in the paper).
        fit_images / validation_images / test_images: use only this many (prefix of the fixed
            permutation for fit/validation; first images of the official test set); None = all.

    Returns:
        A :class:`Split` normalised by the fitting images' per-channel mean and std.
    """
    n_validation = min(n_validation, len(data.train_x) // 5)
    fit_idx, val_idx = fit_validation_split(len(data.train_x), n_validation)
    fit_idx, val_idx = fit_idx[:fit_images], val_idx[:validation_images]
    test_sl = slice(0, test_images)

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float32) / 255.0

    fit_x = t(data.train_x[fit_idx])
    mean = fit_x.mean(dim=(0, 2, 3), keepdim=True)
    std = fit_x.std(dim=(0, 2, 3), keepdim=True)

    def norm(x: torch.Tensor) -> torch.Tensor:
        return ((x - mean) / std).contiguous()

    return Split(data.name, data.num_classes, norm(fit_x), torch.tensor(data.train_y[fit_idx]),
                 norm(t(data.train_x[val_idx])), torch.tensor(data.train_y[val_idx]),
                 norm(t(data.test_x[test_sl])), torch.tensor(data.test_y[test_sl]))


@torch.no_grad()
def extract_features(encoder: nn.Module, x: torch.Tensor, batch_size: int,
                     device: torch.device) -> torch.Tensor:
    """Frozen-encoder (eval mode: BatchNorm uses its running statistics) features ``(n, f)``."""
    was = encoder.training
    encoder.eval()
    feats = [encoder(x[i:i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)]
    encoder.train(was)
    return torch.cat(feats)


@dataclass(frozen=True)
class ProbeResult:
    """Test scores ``(n_test, classes)`` float32, accuracy (fraction), mean cross-entropy (nats)."""

    test_scores: torch.Tensor
    test_accuracy: float
    test_cross_entropy: float
    validation_accuracy: float


def linear_probe(fit_f: torch.Tensor, fit_y: torch.Tensor, val_f: torch.Tensor, val_y: torch.Tensor,
                 test_f: torch.Tensor, test_y: torch.Tensor, num_classes: int, epochs: int,
                 batch_size: int, lr: float, seed: int) -> ProbeResult:
    """Fit a linear classifier on frozen features with seeded minibatch SGD (momentum 0.9).

    Features are standardised with the fitting set's mean and std. Every draw comes from a
    generator seeded with ``seed``, so identical features give byte-identical scores.

    Returns:
        :class:`ProbeResult`; the test set is evaluated once, after the last epoch.
    """
    mu, sd = fit_f.mean(0, keepdim=True), fit_f.std(0, keepdim=True) + 1e-6
    fit_f, val_f, test_f = (fit_f - mu) / sd, (val_f - mu) / sd, (test_f - mu) / sd
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(fit_f.shape[1], num_classes)
    with torch.no_grad():
        lin.weight.copy_(0.01 * torch.randn(lin.weight.shape, generator=g))
        lin.bias.zero_()
    opt = torch.optim.SGD(lin.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1))
    for _ in range(epochs):
        perm = torch.randperm(len(fit_f), generator=g)
        for i in range(0, len(fit_f), batch_size):
            idx = perm[i:i + batch_size]
            loss = nn.functional.cross_entropy(lin(fit_f[idx]), fit_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sched.step()
    with torch.no_grad():
        val_acc = float((lin(val_f).argmax(1) == val_y).double().mean())
        scores = lin(test_f).contiguous()
        ce = float(nn.functional.cross_entropy(scores.double(), test_y))
        acc = float((scores.argmax(1) == test_y).double().mean())
    return ProbeResult(scores, acc, ce, val_acc)
