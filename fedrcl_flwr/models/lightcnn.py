"""Lightweight CNN for larger inputs (STL-10 96x96, PACS / HAM10000 resized), as UniVarFL
uses for STL-10 and its feature-shift benchmarks: four conv-BN-ReLU-maxpool blocks
(32, 64, 128, 256 channels) and global average pooling to a 256-d feature."""

from __future__ import annotations

import torch
from torch import nn


class LightCNN(nn.Module):
    levels = ("block1", "block2", "block3", "block4")

    def __init__(
        self, num_classes: int = 10, in_channels: int = 3, image_size: int = 96, width: int = 32
    ):
        super().__init__()
        chans = [in_channels, width, 2 * width, 4 * width, 8 * width]
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(chans[i], chans[i + 1], 3, padding=1, bias=False),
                nn.BatchNorm2d(chans[i + 1]),
                nn.ReLU(inplace=True),
            )
            for i in range(4)
        )
        self.pool = nn.MaxPool2d(2)
        self.feature_dim = chans[-1]
        self.fc = nn.Linear(self.feature_dim, num_classes)

    def forward(self, x: torch.Tensor, return_features: bool = False):
        feats = {}
        h = x
        for i, block in enumerate(self.blocks):
            h = block(h)
            feats[f"block{i + 1}"] = h.mean((2, 3))
            if h.shape[-1] >= 2:
                h = self.pool(h)
        z = h.mean((2, 3))
        logits = self.fc(z)
        if not return_features:
            return logits
        feats["penultimate"] = z
        return logits, feats
