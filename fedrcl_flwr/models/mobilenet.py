"""MobileNet-V2 for 32x32 inputs, trained from scratch (FedRCL supplementary Table C).

From Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks" (CVPR 2018),
Table 2: a 3x3 convolution (32) followed by seven stages of inverted-residual bottlenecks
``(t, c, n, s)`` = (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
(6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1), a 1x1 convolution to 1280, global average
pooling and the classifier. Each bottleneck is 1x1 expansion (x t; skipped when t = 1) ->
norm -> ReLU6 -> 3x3 depthwise (stride s on the first block of a stage) -> norm -> ReLU6
-> 1x1 linear projection -> norm, with an identity shortcut when stride is 1 and the
widths match.

CIFAR sizing (as usual for 32x32 inputs): the stem convolution has stride 1 instead of 2
and the 24-channel stage stride 1 instead of 2, so the 32x32 input is downsampled 8x
(32 -> 16 -> 8 -> 4) instead of 32x. (The FedRCL authors' ``MobileNet.py`` also
downsamples 8x but at the 24/32/64 stages, with a 1x1 stem; the widths are the same.)
No dropout before the classifier (the paper has none); the classifier is ``fc``
(``Linear(1280, classes)``), equivalent to the paper's final 1x1 convolution.

Normalisation: ``GroupNorm(groups, C)`` (2 groups, as the paper's ResNet-18 and the FedRCL
authors' MobileNet) in place of every BatchNorm.

Feature taps, global-average-pooled to ``(B, C)``: ``layer0`` = the stem (32, after
ReLU6), ``layer1``..``layer7`` = the outputs of the seven bottleneck stages (16, 24, 32,
64, 96, 160, 320; linear bottleneck outputs, as the authors tap them), and
``penultimate`` = pooled 1280-d head (the input of ``fc``). The authors' ``layer0..4``
are the same taps (stem, stages 1-4), and they contrast those five (``branch_level:
[0, 1, 2, 3, 4]``); the Table C YAML selects them.

The forward pass is defined once as stages + head (:class:`~fedrcl_flwr.models.staged.
StagedNet`), which also gives FedMLB's block interface (``block_forward`` /
``forward_from``: one block per level, then the head).
"""

from __future__ import annotations

import torch
from torch import nn

from fedrcl_flwr.models.staged import StagedNet

# (t, c, n, s) of the paper's Table 2, with the CIFAR strides (see the module docstring)
_CFG = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, t: int, groups: int):
        super().__init__()
        hidden = cin * t
        layers: list[nn.Module] = []
        if t != 1:
            layers += [
                nn.Conv2d(cin, hidden, 1, bias=False),
                nn.GroupNorm(groups, hidden),
                nn.ReLU6(inplace=True),
            ]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.GroupNorm(groups, hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.GroupNorm(groups, cout),
        ]
        self.body = nn.Sequential(*layers)
        self.shortcut = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out + x if self.shortcut else out


class MobileNetV2GN(StagedNet):
    """MobileNet-V2 (CIFAR-sized) with GroupNorm (see the module docstring)."""

    levels = tuple(f"layer{i}" for i in range(len(_CFG) + 1))
    feature_dim = 1280

    def __init__(
        self, num_classes: int = 100, in_channels: int = 3, image_size: int = 32, *, groups: int = 2
    ):
        super().__init__()
        if 16 % int(groups):
            raise ValueError(f"groups={groups} must divide 16")
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=False),
            nn.GroupNorm(groups, 32),
            nn.ReLU6(inplace=True),
        )
        stages, cin = [], 32
        for t, c, n, s in _CFG:
            blocks = [
                InvertedResidual(cin if i == 0 else c, c, s if i == 0 else 1, t, groups)
                for i in range(n)
            ]
            stages.append(nn.Sequential(*blocks))
            cin = c
        self.stages = nn.ModuleList(stages)
        self.last = nn.Sequential(
            nn.Conv2d(cin, 1280, 1, bias=False), nn.GroupNorm(groups, 1280), nn.ReLU6(inplace=True)
        )
        self.fc = nn.Linear(1280, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")

    def stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.stem(x) if i == 0 else self.stages[i - 1](x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(x).mean((2, 3))
