"""Small CNNs used by FedCCL (and many FL papers) for MNIST-like and CIFAR-like data.

Both end in a 128-d "decision" feature (the paper's Sec. 5.1: "decision-making layers of
both CNN models having a dimension of 128") followed by the linear classifier ``fc``.
They follow the project-wide model interface: ``model(x)`` -> logits and
``model(x, return_features=True)`` -> ``(logits, feats)`` with pooled taps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _flat_size(channels: int, image_size: int, pools: int) -> int:
    side = image_size
    for _ in range(pools):
        side = side // 2
    if side < 1:
        raise ValueError(f"image_size {image_size} is too small for {pools} 2x2 poolings")
    return channels * side * side


class CNN4(nn.Module):
    """4-layer CNN (2 conv + 2 fc) for MNIST / Fashion-MNIST; 128-d feature before ``fc``."""

    levels = ("conv1", "conv2", "penultimate")

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(_flat_size(64, image_size, 2), 128)
        self.fc = nn.Linear(128, num_classes)
        self.feature_dim = 128

    def forward(self, x: torch.Tensor, return_features: bool = False):
        c1 = F.relu(self.conv1(x))
        h = F.max_pool2d(c1, 2)
        c2 = F.relu(self.conv2(h))
        h = F.max_pool2d(c2, 2)
        z = F.relu(self.fc1(h.flatten(1)))
        logits = self.fc(z)
        if not return_features:
            return logits
        feats = {"conv1": c1.mean((2, 3)), "conv2": c2.mean((2, 3)), "penultimate": z}
        return logits, feats

    # ---- FedMLB block interface (block i's output feeds block i+1; the last is the
    # penultimate feature, the input of ``fc``)
    def block_forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Outputs of the blocks [conv1+pool, conv2+pool, fc1 (= penultimate)]."""
        h1 = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h2 = F.max_pool2d(F.relu(self.conv2(h1)), 2)
        z = F.relu(self.fc1(h2.flatten(1)))
        return [h1, h2, z]

    def forward_from(self, k: int, h: torch.Tensor, return_features: bool = False):
        """Logits from ``h`` = the output of block ``k`` (index into
        :meth:`block_forward`'s list): runs blocks k+1.. and ``fc``; with
        ``return_features`` also ``{"penultimate": z}``."""
        if not 0 <= k < 3:
            raise ValueError(f"block index {k} out of range [0, 3)")
        if k < 1:
            h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        if k < 2:
            h = F.relu(self.fc1(h.flatten(1)))
        logits = self.fc(h)
        return (logits, {"penultimate": h}) if return_features else logits


class CNN5(nn.Module):
    """5-layer CNN (2 conv + 3 fc) for CIFAR-10-like data; 128-d feature before ``fc``."""

    levels = ("conv1", "conv2", "fc1", "penultimate")

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(_flat_size(64, image_size, 2), 512)
        self.fc2 = nn.Linear(512, 128)
        self.fc = nn.Linear(128, num_classes)
        self.feature_dim = 128

    def forward(self, x: torch.Tensor, return_features: bool = False):
        c1 = F.relu(self.conv1(x))
        h = F.max_pool2d(c1, 2)
        c2 = F.relu(self.conv2(h))
        h = F.max_pool2d(c2, 2)
        f1 = F.relu(self.fc1(h.flatten(1)))
        z = F.relu(self.fc2(f1))
        logits = self.fc(z)
        if not return_features:
            return logits
        feats = {
            "conv1": c1.mean((2, 3)),
            "conv2": c2.mean((2, 3)),
            "fc1": f1,
            "penultimate": z,
        }
        return logits, feats

    # ---- FedMLB block interface (block i's output feeds block i+1; the last is the
    # penultimate feature, the input of ``fc``)
    def block_forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Outputs of the blocks [conv1+pool, conv2+pool, fc1, fc2 (= penultimate)]."""
        h1 = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h2 = F.max_pool2d(F.relu(self.conv2(h1)), 2)
        f1 = F.relu(self.fc1(h2.flatten(1)))
        z = F.relu(self.fc2(f1))
        return [h1, h2, f1, z]

    def forward_from(self, k: int, h: torch.Tensor, return_features: bool = False):
        """Logits from ``h`` = the output of block ``k`` (index into
        :meth:`block_forward`'s list): runs blocks k+1.. and ``fc``; with
        ``return_features`` also ``{"penultimate": z}``."""
        if not 0 <= k < 4:
            raise ValueError(f"block index {k} out of range [0, 4)")
        if k < 1:
            h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        if k < 2:
            h = F.relu(self.fc1(h.flatten(1)))
        if k < 3:
            h = F.relu(self.fc2(h))
        logits = self.fc(h)
        return (logits, {"penultimate": h}) if return_features else logits
