"""Shared forward for the Table C backbones (VGG-9, MobileNet-V2, ShuffleNet-V2,
SqueezeNet): the network is ``stage_0 .. stage_{L-1}`` (one per entry of ``levels``),
then ``head`` (map -> the pooled penultimate feature) and the linear classifier ``fc``.

One definition serves the project's model interface (``forward`` with
``return_features``: each level = the global average of its stage's output map) and
FedMLB's block interface (``block_forward`` / ``forward_from``, ``clients/fedmlb.py``):
the blocks are the L stages plus the head, so ``branches: [all]`` puts a hybrid branch
after every level and after the penultimate feature.
"""

from __future__ import annotations

import torch
from torch import nn


class StagedNet(nn.Module):
    """Subclasses define ``levels``, ``stage(i, x)``, ``head(x)`` and ``fc``."""

    levels: tuple = ()
    fc: nn.Module  # the final linear classifier (set by each subclass)

    def stage(self, i: int, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def head(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def forward(self, x: torch.Tensor, return_features: bool = False):
        maps = self.block_forward(x)
        z = maps.pop()
        logits = self.fc(z)
        if not return_features:
            return logits
        feats = {name: m.mean((2, 3)) for name, m in zip(self.levels, maps)}
        feats["penultimate"] = z
        return logits, feats

    def block_forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The output maps of the stages (one per level) and, last, the penultimate
        feature (the input of ``fc``)."""
        maps = []
        for i in range(len(self.levels)):
            x = self.stage(i, x)
            maps.append(x)
        maps.append(self.head(x))
        return maps

    def forward_from(self, k: int, h: torch.Tensor, return_features: bool = False):
        """Logits from ``h`` = the output of block ``k`` (index into
        :meth:`block_forward`'s list); with ``return_features`` also
        ``{"penultimate": z}``."""
        n = len(self.levels)
        if not 0 <= k <= n:
            raise ValueError(f"block index {k} out of range [0, {n + 1})")
        if k < n:
            for i in range(k + 1, n):
                h = self.stage(i, h)
            h = self.head(h)
        logits = self.fc(h)
        return (logits, {"penultimate": h}) if return_features else logits
