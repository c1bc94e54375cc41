"""ShuffleNet-V2 for 32x32 inputs, trained from scratch (FedRCL supplementary Table C).

From Ma et al., "ShuffleNet V2: Practical Guidelines for Efficient CNN Architecture
Design" (ECCV 2018), Table 5 and Fig. 3(c)/(d): stem 3x3 convolution (24), three stages
of 4 / 8 / 4 units (output widths 116 / 232 / 464 at 1x; 48/96/192 at 0.5x, 176/352/704
at 1.5x, 244/488/976 at 2x), a 1x1 convolution to 1024 (2048 at 2x), global average
pooling and the classifier ``fc``.

* basic unit (stride 1): channel split in halves; one half passes unchanged, the other
  goes 1x1 conv -> norm -> ReLU -> 3x3 depthwise -> norm -> 1x1 conv -> norm -> ReLU;
  concatenate, channel shuffle (2 groups);
* down-sampling unit (stride 2, first unit of a stage): no split; left branch 3x3
  depthwise (stride 2) -> norm -> 1x1 conv -> norm -> ReLU, right branch as above with
  a stride-2 depthwise; concatenate (doubling the width), channel shuffle.

CIFAR sizing: stem stride 1 and no max-pool (the ImageNet network downsamples 4x there),
so 32x32 -> 16 -> 8 -> 4 through the three stages.

Normalisation: ``GroupNorm(groups, C)`` (2 groups, as the paper's ResNet-18) in place of
every BatchNorm.

Not the FedRCL authors' network: their ``ShuffleNet.py`` is ShuffleNet **v1** (Zhang et
al., CVPR 2018, 3 groups, widths 240/480/960), which the paper's reference [43] names;
this project provides v2 (the issue asks for it).

Feature taps, global-average-pooled to ``(B, C)``: ``layer0`` = stem (24, after ReLU),
``layer1``..``layer3`` = the outputs of the three stages (after the last shuffle), and
``penultimate`` = the pooled 1x1-conv head (the input of ``fc``). With the authors'
indexing these are their ``layer0..3`` (their ``layer4`` is the logits);
``levels: [all]`` contrasts the four.

The forward pass is defined once as stages + head (:class:`~fedrcl_flwr.models.staged.
StagedNet`), which also gives FedMLB's block interface (``block_forward`` /
``forward_from``: one block per level, then the head).
"""

from __future__ import annotations

import torch
from torch import nn

from fedrcl_flwr.models.staged import StagedNet

_WIDTHS = {
    0.5: (48, 96, 192, 1024),
    1.0: (116, 232, 464, 1024),
    1.5: (176, 352, 704, 1024),
    2.0: (244, 488, 976, 2048),
}
_REPEATS = (4, 8, 4)


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, g*n, H, W) -> reshape (B, g, n), transpose to (B, n, g), flatten back."""
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


def _dw(ch: int, stride: int, groups: int) -> list[nn.Module]:
    return [
        nn.Conv2d(ch, ch, 3, stride=stride, padding=1, groups=ch, bias=False),
        nn.GroupNorm(groups, ch),
    ]


def _pw(cin: int, cout: int, groups: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 1, bias=False), nn.GroupNorm(groups, cout), nn.ReLU(inplace=True)]


class ShuffleUnit(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int):
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride == 1:
            if cin != cout:
                raise ValueError("a stride-1 ShuffleNet-V2 unit keeps its width")
            self.left = None
            right_in = half
        else:
            self.left = nn.Sequential(*_dw(cin, stride, groups), *_pw(cin, half, groups))
            right_in = cin
        self.right = nn.Sequential(
            *_pw(right_in, half, groups), *_dw(half, stride, groups), *_pw(half, half, groups)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.left is None:
            a, b = x.chunk(2, dim=1)
            out = torch.cat((a, self.right(b)), dim=1)
        else:
            out = torch.cat((self.left(x), self.right(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2GN(StagedNet):
    """ShuffleNet-V2 (CIFAR-sized) with GroupNorm (see the module docstring).
    ``width``: 0.5, 1.0, 1.5 or 2.0 (the paper's multipliers)."""

    levels = ("layer0", "layer1", "layer2", "layer3")

    def __init__(
        self,
        num_classes: int = 100,
        in_channels: int = 3,
        image_size: int = 32,
        *,
        width: float = 1.0,
        groups: int = 2,
    ):
        super().__init__()
        if float(width) not in _WIDTHS:
            raise ValueError(f"width must be one of {sorted(_WIDTHS)}, got {width}")
        *stage_widths, head = _WIDTHS[float(width)]
        bad = [c for c in (24, *(w // 2 for w in stage_widths), head) if c % int(groups)]
        if bad:
            raise ValueError(f"groups={groups} must divide every GroupNorm width (not {bad})")
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 24, 3, padding=1, bias=False),
            nn.GroupNorm(groups, 24),
            nn.ReLU(inplace=True),
        )
        stages, cin = [], 24
        for cout, n in zip(stage_widths, _REPEATS):
            units = [
                ShuffleUnit(cin if i == 0 else cout, cout, 2 if i == 0 else 1, groups)
                for i in range(n)
            ]
            stages.append(nn.Sequential(*units))
            cin = cout
        self.stages = nn.ModuleList(stages)
        self.last = nn.Sequential(*_pw(cin, head, groups))
        self.fc = nn.Linear(head, num_classes)
        self.feature_dim = head
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def stage(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.stem(x) if i == 0 else self.stages[i - 1](x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(x).mean((2, 3))
