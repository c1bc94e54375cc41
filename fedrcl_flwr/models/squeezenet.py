"""SqueezeNet for 32x32 inputs, trained from scratch (FedRCL supplementary Table C).

From Iandola et al., "SqueezeNet: AlexNet-level accuracy with 50x fewer parameters and
<0.5MB model size" (2016), Table 1 (SqueezeNet v1.0) with the "simple bypass" of Sec. 6:

* stem convolution (96) -> norm -> ReLU -> 2x2 max-pool;
* Fire modules fire2..fire9 (squeeze 1x1 s -> norm -> ReLU; expand 1x1 e and 3x3 e, each
  -> norm -> ReLU, concatenated to 2e): (s, 2e) = (16, 128), (16, 128), (32, 256) |
  (32, 256), (48, 384), (48, 384), (64, 512) | (64, 512), with a 2x2 max-pool after fire4
  and fire8 (``|``), and identity bypasses around fire3, fire5, fire7 and fire9 (the
  modules whose input and output widths match);
* the paper's classifier, a 1x1 convolution to the classes followed by global average
  pooling, is written as global average pooling followed by ``fc`` =
  ``Linear(512, classes)`` -- the same function, since both steps are linear (the
  ReLU that the Caffe / torchvision SqueezeNet put on the class map is left out, as in
  the FedRCL authors' file; the dropout before it too).

CIFAR sizing: the stem is a 3x3 / stride 1 convolution (the paper's is 7x7 / stride 2),
so 32x32 -> 16 (stem pool) -> 8 (after fire4) -> 4 (after fire8).

Normalisation: ``GroupNorm(groups, C)`` (2 groups, as the paper's ResNet-18 and the FedRCL
authors' SqueezeNet) after every convolution; SqueezeNet itself has no normalisation.

Feature taps, global-average-pooled to ``(B, C)``, at the authors' layer boundaries:
``layer0`` = stem after the pool (96), ``layer1`` .. ``layer7`` = outputs of fire2 ..
fire8 (bypass added; fire4 and fire8 after their max-pool): 128, 128, 256, 256, 384,
384, 512; ``penultimate`` = pooled fire9 output (512, the input of ``fc``). The authors
contrast ``layer0..4`` (``branch_level: [0, 1, 2, 3, 4]``); the Table C YAML selects
them. (The authors' file has no bypass around fire9; the paper has one.)

The forward pass is defined once as stages + head (:class:`~fedrcl_flwr.models.staged.
StagedNet`), which also gives FedMLB's block interface (``block_forward`` /
``forward_from``: one block per level, then the head).
"""

from __future__ import annotations

import torch
from torch import nn

from fedrcl_flwr.models.staged import StagedNet

# (squeeze, output = 2 * expand, bypass, max-pool after) for fire2..fire9
_FIRES = (
    (16, 128, False, False),
    (16, 128, True, False),
    (32, 256, False, True),
    (32, 256, True, False),
    (48, 384, False, False),
    (48, 384, True, False),
    (64, 512, False, True),
    (64, 512, True, False),
)


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, cout: int, groups: int):
        super().__init__()
        e = cout // 2
        self.squeeze = nn.Sequential(
            nn.Conv2d(cin, squeeze, 1), nn.GroupNorm(groups, squeeze), nn.ReLU(inplace=True)
        )
        self.expand1 = nn.Sequential(
            nn.Conv2d(squeeze, e, 1), nn.GroupNorm(groups, e), nn.ReLU(inplace=True)
        )
        self.expand3 = nn.Sequential(
            nn.Conv2d(squeeze, e, 3, padding=1), nn.GroupNorm(groups, e), nn.ReLU(inplace=True)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return torch.cat((self.expand1(s), self.expand3(s)), dim=1)


class SqueezeNetGN(StagedNet):
    """SqueezeNet v1.0 with simple bypass (CIFAR-sized) and GroupNorm (module docstring).
    ``bypass``: add the identity bypasses (default true)."""

    levels = tuple(f"layer{i}" for i in range(len(_FIRES)))
    feature_dim = 512

    def __init__(
        self,
        num_classes: int = 100,
        in_channels: int = 3,
        image_size: int = 32,
        *,
        groups: int = 2,
        bypass: bool = True,
    ):
        super().__init__()
        if 16 % int(groups):
            raise ValueError(f"groups={groups} must divide 16")
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 96, 3, padding=1),
            nn.GroupNorm(groups, 96),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, 2),
        )
        fires, cin = [], 96
        for squeeze, cout, _, _ in _FIRES:
            fires.append(Fire(cin, squeeze, cout, groups))
            cin = cout
        self.fires = nn.ModuleList(fires)
        self.bypass = bool(bypass)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:  # every conv here has one
                    nn.init.zeros_(m.bias)

    def _fire(self, j: int, x: torch.Tensor) -> torch.Tensor:
        """fire{j+2}, its bypass and the max-pool after it."""
        _, _, bypass, pool = _FIRES[j]
        out = self.fires[j](x)
        if bypass and self.bypass:
            out = out + x
        return self.pool(out) if pool else out

    def stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.stem(x) if i == 0 else self._fire(i - 1, x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self._fire(len(_FIRES) - 1, x).mean((2, 3))  # fire9, pooled
