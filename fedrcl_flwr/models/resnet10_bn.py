"""FPL's ResNet-10 with BatchNorm (WenkeHuang/RethinkFL @ 74201b3 ``backbone/ResNet.py``,
``resnet10(nclasses, nf=64)``; FPL, CVPR 2023 Sec. 5.1, and the protocol FedCCL's Digits /
Office-Caltech experiments inherit).

Architecture as theirs: ``conv1`` 3x3 / stride 1 / no bias -> ``bn1`` (BatchNorm) -> ReLU,
no max-pool; four stages ``layer1``..``layer4`` of ONE BasicBlock each (``nf``, 2nf, 4nf,
8nf channels, stride 1, 2, 2, 2; 3x3 conv -> BN -> ReLU -> 3x3 conv -> BN, plus the
shortcut, a 1x1 conv + BN where the shape changes, then ReLU); global average pooling
(their ``avg_pool2d(out, out.shape[2])``) -> ``fc`` (their ``linear`` / ``cls``, 8nf ->
classes). PyTorch's default initialisation (theirs has none of its own), the layers
created in their order, so ``torch.manual_seed(s)`` gives their weights for the layers
both have. Their unused ``encoder`` MLP (built after ``linear``, never in FPL's or
FedAvg's path) is left out, so it is neither trained, averaged nor sent.

BatchNorm's running statistics are buffers: the project's FedAvg averages them with the
weights, as their ``aggregate_nets`` averages the whole ``state_dict``.

Feature taps: ``layer1``..``layer4`` = each stage's output after its ReLU, pooled;
``penultimate`` = pooled ``layer4`` (their ``net.features(x)``, FPL's prototype feature,
pooled with their ``avg_pool2d`` so that the logits are theirs bit for bit), the input of
``fc``. Their ``state_dict`` loads into this model with ``linear.* -> fc.*`` and their
``encoder.*`` left out. Parameter: ``nf`` (width, 64 as theirs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


class _Block(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = _conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet10BN(nn.Module):
    """See the module docstring. ``model.name: resnet10_bn``, ``model.params.nf``."""

    levels = ("layer1", "layer2", "layer3", "layer4")

    def __init__(
        self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32, *, nf: int = 64
    ):
        super().__init__()
        if nf < 1:
            raise ValueError(f"nf must be >= 1, got {nf}")
        self.conv1 = _conv3x3(in_channels, nf)
        self.bn1 = nn.BatchNorm2d(nf)
        cin = nf
        for i, mult in enumerate((1, 2, 4, 8), start=1):
            setattr(self, f"layer{i}", nn.Sequential(_Block(cin, nf * mult, 1 if i == 1 else 2)))
            cin = nf * mult
        self.fc = nn.Linear(nf * 8, num_classes)
        self.feature_dim = nf * 8

    def forward(self, x: torch.Tensor, return_features: bool = False):
        out = F.relu(self.bn1(self.conv1(x)))
        taps = {}
        for name in self.levels:
            out = getattr(self, name)(out)
            if return_features:
                taps[name] = out.mean((2, 3))
        # their avg_pool2d(out, out.shape[2]): the same kernel, so the same float sum
        z = F.avg_pool2d(out, out.shape[2:]).flatten(1)
        logits = self.fc(z)
        if not return_features:
            return logits
        taps["penultimate"] = z
        return logits, taps
