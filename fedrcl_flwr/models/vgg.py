"""VGG-9 for 32x32 inputs, trained from scratch (FedRCL supplementary Table C).

VGG-9 is the nine-layer VGG (Simonyan & Zisserman, ICLR 2015: stacks of 3x3 convolutions,
2x2 max-pooling between stacks, three fully connected layers) used by FedMA (Wang et al.,
ICLR 2020) and by the FedRCL authors for Table C:

* six 3x3 / stride 1 / padding 1 convolutions of widths 32, 64 | 128, 128 | 256, 256, each
  followed by the normalisation and ReLU; a 2x2 max-pool closes each pair (``|``), so a
  32x32 input ends as 256 x 4 x 4 = 4096 values;
* an adaptive average pool to 4x4 (the identity at 32x32; lets other sizes through),
  flatten, ``Linear(4096, 512)`` -> ReLU -> ``Linear(512, 512)`` -> ReLU -> ``fc``
  (``Linear(512, classes)``).

Normalisation: ``GroupNorm(groups, C)`` (2 groups, as the paper's ResNet-18 and as the
FedRCL authors' ``VGG9_base``) after every convolution; VGG itself has no normalisation.
No dropout (the authors' ``VGG9_base`` has none). Convolutions keep their biases (VGG);
weights are Kaiming-normal (fan-out, ReLU) = the authors' ``normal(0, sqrt(2 / (k*k*C_out)))``,
biases zero.

Feature taps (``model(x, return_features=True)``), one per convolution block, at the
block boundaries of the authors' ``VGG9_base`` (``layer<i>`` = output of convolution i+1
after GroupNorm + ReLU, and after the max-pool where one closes the block), each
global-average-pooled to ``(B, C)``: ``layer0`` (32), ``layer1`` (64), ``layer2`` (128),
``layer3`` (128), ``layer4`` (256), ``layer5`` (256); plus ``penultimate`` = the second
512-d hidden layer (the input of ``fc``). The authors contrast their layers 0-4
(``branch_level: [0, 1, 2, 3, 4]``); the Table C YAML selects ``layer0``..``layer4``.
Their ``layer5`` is the flattened 4096-d map; ours is its 256-d average.

The forward pass is defined once as stages + head (:class:`~fedrcl_flwr.models.staged.
StagedNet`), which also gives FedMLB's block interface (``block_forward`` /
``forward_from``: one block per level, then the head).
"""

from __future__ import annotations

import torch
from torch import nn

from fedrcl_flwr.models.staged import StagedNet

# (width, max-pool after the block)
_CFG = ((32, False), (64, True), (128, False), (128, True), (256, False), (256, True))


class VGG9GN(StagedNet):
    """VGG-9 with GroupNorm (see the module docstring). ``groups``: GroupNorm groups."""

    levels = tuple(f"layer{i}" for i in range(len(_CFG)))
    feature_dim = 512

    def __init__(
        self, num_classes: int = 100, in_channels: int = 3, image_size: int = 32, *, groups: int = 2
    ):
        super().__init__()
        if 32 % int(groups):
            raise ValueError(f"groups={groups} must divide 32")
        if image_size < 8:
            raise ValueError(f"image_size {image_size} is too small for three 2x2 poolings")
        blocks, cin = [], in_channels
        for width, pool in _CFG:
            layers = [
                nn.Conv2d(cin, width, 3, padding=1),
                nn.GroupNorm(groups, width),
                nn.ReLU(inplace=True),
            ]
            if pool:
                layers.append(nn.MaxPool2d(2, 2))
            blocks.append(nn.Sequential(*layers))
            cin = width
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.fc1 = nn.Linear(256 * 16, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:  # every conv here has one
                    nn.init.zeros_(m.bias)

    def stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[i](x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(self.pool(x).flatten(1)))
        return torch.relu(self.fc2(h))
