"""Two-layer projector between an encoder and a new linear classifier (UniVarFL Sec. 3):

    encoder -> penultimate feature h -> [Linear-BN-ReLU] x 2 (width W) -> z -> fc(z)

UniVarFL's hyperspherical-uniformity term L_HE is applied to the projector output ``z``
(exposed as ``feats["projector"]`` and as ``feats["penultimate"]``, since it is what the
classifier sees); the encoder's own taps stay available. BatchNorm buffers in the
projector follow the project's aggregation policy (averaged, counters not averaged).
Selected from YAML with ``model.params.projector: 256`` (or 512) on any registered model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class WithProjector(nn.Module):
    def __init__(self, encoder: nn.Module, num_classes: int, width: int = 256):
        super().__init__()
        self.encoder = encoder
        # a built model (checked against models.interface where it was built): its
        # levels, fc and feature_dim are plain attributes, not Module.__getattr__'s types
        enc: Any = encoder
        in_dim = enc.feature_dim
        self.projector = nn.Sequential(
            nn.Linear(in_dim, width),
            nn.BatchNorm1d(width),
            nn.ReLU(inplace=True),
            nn.Linear(width, width),
            nn.BatchNorm1d(width),
            nn.ReLU(inplace=True),
        )
        self.fc = nn.Linear(width, num_classes)
        self.feature_dim = width
        self.levels = tuple("encoder" if lv == "penultimate" else lv for lv in enc.levels) + (
            "projector",
        )
        # the encoder's own classifier is unused: freeze it so it neither trains nor
        # costs optimizer state (it still travels with the weights, unchanged)
        for p in enc.fc.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor, return_features: bool = False):
        _, feats = self.encoder(x, return_features=True)
        z = self.projector(feats["penultimate"])
        logits = self.fc(z)
        if not return_features:
            return logits
        feats = dict(feats)
        feats["encoder"] = feats["penultimate"]
        feats["projector"] = z
        feats["penultimate"] = z
        return logits, feats
