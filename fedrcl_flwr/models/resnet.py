"""ResNet-18 with GroupNorm, the backbone of FedRCL (Seo et al., CVPR 2024, Sec. 5:
"ResNet-18 ... where we replace the batch normalization with the group normalization").

Architecture (matches the authors' ``models/resnet_base.py: ResNet18_base`` with
``GroupNorm(2, C)``, parameter names and shapes included, so its ``state_dict`` keys load
one-to-one):

* stem ``conv1`` 3x3 / stride 1 / no bias -> ``bn1`` = GroupNorm -> ReLU, no max-pool
  (CIFAR stem). With ``stem="imagenet"`` (chosen automatically by ``stem="auto"`` when
  ``image_size > 64``) the stem is the standard 7x7 / stride 2 convolution followed by a
  3x3 / stride 2 max-pool; Tiny-ImageNet's 64x64 images keep the CIFAR stem, as in the
  FedRCL code base.
* four stages ``layer1``..``layer4`` of two BasicBlocks each (64, 128, 256, 512
  channels; stride 2 at the first block of stages 2-4, with a 1x1 conv + GroupNorm
  ``downsample`` shortcut), GroupNorm after every convolution;
* global average pooling of the (ReLU-ed) last stage -> ``fc`` (512 -> classes).

Feature taps (``model(x, return_features=True)``), exactly where the FedRCL reference
taps them for its multi-level contrastive loss (paper Sec. 4.4): the stem output after
GroupNorm and the output of every stage after the residual addition, all **before** the
ReLU that follows them, global-average-pooled to ``(B, C)``:

``layer0`` (stem, 64), ``layer1`` (64), ``layer2`` (128), ``layer3`` (256), ``layer4``
(512); plus ``penultimate`` = pooled ``relu(layer4 map)``, the input of ``fc``.

``block_forward`` / ``forward_from`` expose the same function as 5 blocks + classifier
for FedMLB (``clients/fedmlb.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with GroupNorm and an identity / 1x1-conv shortcut."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = _conv3x3(in_planes, planes, stride)
        self.bn1 = nn.GroupNorm(groups, planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.GroupNorm(groups, planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                nn.GroupNorm(groups, planes),
            )

    def forward(self, x: torch.Tensor, no_relu: bool = False) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out = out + (x if self.downsample is None else self.downsample(x))
        return out if no_relu else F.relu(out)


class ResNet18GN(nn.Module):
    """ResNet-18 with ``GroupNorm(groups, C)`` everywhere (see the module docstring).

    Parameters: ``num_classes``, ``in_channels``, ``image_size``; keyword-only
    ``groups`` (GroupNorm groups, 2 as in FedRCL) and ``stem`` (``"auto"``,
    ``"cifar"`` or ``"imagenet"``). Any other keyword raises ``TypeError``.
    """

    levels = ("layer0", "layer1", "layer2", "layer3", "layer4")
    feature_dim = 512
    # the four stages, set by name in __init__ (their state_dict keys)
    layer1: nn.Sequential
    layer2: nn.Sequential
    layer3: nn.Sequential
    layer4: nn.Sequential

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        image_size: int = 32,
        *,
        groups: int = 2,
        stem: str = "auto",
    ):
        super().__init__()
        if stem == "auto":
            stem = "imagenet" if image_size > 64 else "cifar"
        if stem not in ("cifar", "imagenet"):
            raise ValueError(f"stem must be 'auto', 'cifar' or 'imagenet', got {stem!r}")
        if 64 % groups:
            raise ValueError(f"groups={groups} must divide 64")
        self.stem = stem
        if stem == "cifar":
            self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
            self.maxpool = None
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.bn1 = nn.GroupNorm(groups, 64)
        widths = (64, 128, 256, 512)
        in_planes = 64
        for idx, planes in enumerate(widths, start=1):
            stride = 1 if idx == 1 else 2
            stage = nn.Sequential(
                BasicBlock(in_planes, planes, stride, groups), BasicBlock(planes, planes, 1, groups)
            )
            setattr(self, f"layer{idx}", stage)
            in_planes = planes
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.GroupNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, return_features: bool = False):
        out = self.bn1(self.conv1(x))
        taps = [out] if return_features else None
        out = F.relu(out)
        if self.maxpool is not None:
            out = self.maxpool(out)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            out = stage[0](out)
            out = stage[1](out, no_relu=True)
            if taps is not None:
                taps.append(out)
            out = F.relu(out)
        z = out.mean((2, 3))
        logits = self.fc(z)
        if not return_features:
            return logits
        assert taps is not None  # collected when return_features
        feats = {name: t.mean((2, 3)) for name, t in zip(self.levels, taps)}
        feats["penultimate"] = z
        return logits, feats

    # ---- FedMLB block interface (clients/fedmlb.py): the network as blocks conv1,
    # conv2_x .. conv5_x (+ pooling) and the classifier; block i's output feeds block i+1.
    def block_forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Outputs of the 5 blocks: the stem map (after ReLU / max-pool), the maps of
        ``layer1``..``layer3`` (after ReLU) and the pooled ``layer4`` output (=
        ``penultimate``, the input of ``fc``)."""
        out = F.relu(self.bn1(self.conv1(x)))
        if self.maxpool is not None:
            out = self.maxpool(out)
        maps = [out]
        for stage in (self.layer1, self.layer2, self.layer3):
            out = stage(out)
            maps.append(out)
        maps.append(self.layer4(out).mean((2, 3)))
        return maps

    def forward_from(self, k: int, h: torch.Tensor, return_features: bool = False):
        """Logits from ``h`` = the output of block ``k`` (index into
        :meth:`block_forward`'s list): runs the later stages, the pooling and ``fc``;
        with ``return_features`` also ``{"penultimate": z}``."""
        if not 0 <= k < 5:
            raise ValueError(f"block index {k} out of range [0, 5)")
        if k < 4:
            for stage in (self.layer1, self.layer2, self.layer3, self.layer4)[k:]:
                h = stage(h)
            h = h.mean((2, 3))
        logits = self.fc(h)
        return (logits, {"penultimate": h}) if return_features else logits
