"""CIFAR-adapted ResNet-18 in plain torch (torchvision does not import beside the CPU torch here).

The CIFAR adaptation (He et al. 2016, §4.2; the MoCo CIFAR recipes): a 3×3 stride-1 stem, no
max-pool, BasicBlock × [2, 2, 2, 2] with widths ``w·(1, 2, 4, 8)``. The network is a sequence of
named segments — ``stem``, ``layer1`` … ``layer4`` — so a plan can name them by module path.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "ResNet18"]


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers with an identity (or 1×1 conv-BN projection) shortcut.

    Args:
        in_channels: channels of the input ``(batch, in_channels, h, w)``.
        out_channels: channels of the output.
        stride: stride of the first convolution and of the projection shortcut.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR ResNet-18 trunk: ``stem`` → ``layer1..4`` → global average pool.

    Args:
        width: base width ``w``; stage widths are ``w·(1, 2, 4, 8)`` (``w=64`` is the standard
            11.2 M-parameter network, 11.17 M without the classifier).
        in_channels: image channels (3 for CIFAR, 1 for Fashion-MNIST).

    Returns (forward):
        float32 ``(batch, 8·width)`` pooled features for images ``(batch, in_channels, h, w)``.

    References:
        Paper §12 (CIFAR-adapted ResNet18 query and momentum encoders).
    """

    segment_names = ("stem", "layer1", "layer2", "layer3", "layer4")

    def __init__(self, width: int = 64, in_channels: int = 3):
        super().__init__()
        if width < 1 or in_channels < 1:
            raise ValueError(f"ResNet18: expected width >= 1 and in_channels >= 1, got width={width}, "
                             f"in_channels={in_channels}. Tip: the paper uses width=64, in_channels=3.")
        self.width = width
        self.feature_dim = 8 * width
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        widths = [width, 2 * width, 4 * width, 8 * width]
        layers, c_in = [], width
        for i, c_out in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)))
            c_in = c_out
        self.layer1, self.layer2, self.layer3, self.layer4 = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x)))))
        return torch.flatten(torch.mean(x, dim=(2, 3)), 1)
