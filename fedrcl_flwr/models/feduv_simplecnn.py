"""FedUV's SimpleCNN (sonhamin/FedUV @ dd2e3c5 ``nets/models.py: SimpleCNN(output_dim,
n_classes, width)``, built by ``train_fl.py`` as ``SimpleCNN(args.out_dim, n_classes,
args.simp_width)``; Son et al., CVPR 2024, the CIFAR-10 model).

Architecture as theirs, layer for layer and in their order of construction (so that
``torch.manual_seed(s)`` followed by building this model gives the weights their class
draws after the same seed): eight convolutions without bias and without padding, each
followed by its BatchNorm and a ReLU —

    conv1 3x3 (16w) · conv2 1x1 (16w) · conv3 3x3 / 2 (32w) · conv4 3x3 (32w) ·
    conv5 1x1 (32w) · conv6 3x3 / 2 (64w) · conv7 3x3 (64w) · conv8 1x1 (64w)

then global average pooling (their ``AdaptiveAvgPool2d((1, 1))``), the projector
``fc1`` -> ``fc1_bn`` (BatchNorm1d) -> ReLU -> ``fc2`` -> ``fc2_bn`` -> ReLU (width
``out_dim``, their ``--out_dim`` 256) and the classifier, which the model interface calls
``fc`` (their ``fc3``). PyTorch's default initialisation everywhere (theirs has none of
its own). Every other parameter and buffer has their name, so a ``state_dict`` of theirs
loads into this model with the one renaming ``fc3.* -> fc.*``.

Their ``forward`` returns ``(0, x, y, 0, 0)``: ``x`` the projector output (after
``fc2_bn`` and its ReLU), on which FedUV's uniformity term acts, ``y`` the logits. Here
``forward(x)`` returns the logits and ``forward(x, return_features=True)`` the logits
and the taps: ``conv2``, ``conv5``, ``conv8`` (the feature maps before each stride-2
convolution and the last one, after their ReLU, pooled), ``encoder`` (the pooled
64w-wide feature that enters the projector), ``projector`` and ``penultimate`` (both
their ``x``, the input of ``fc``) — the same convention as
:class:`fedrcl_flwr.models.projector.WithProjector`. The pooled taps other than
``encoder`` are extra reads of maps their forward computes anyway; they change no value.

Their class takes 3 input channels; ``in_channels`` here is the dataset's. The input
must be at least 21 pixels on each side (three unpadded 3x3 convolutions and two of
stride 2 leave a 3x3 map before ``conv7``), checked when the model is built.
Parameters: ``out_dim`` (256) and ``width`` (their ``--simp_width``, 1).
"""

from __future__ import annotations

import torch
from torch import nn

MIN_IMAGE_SIZE = 21


def _side_after_convs(size: int) -> int:
    """The feature map's side entering ``conv8`` for a ``size`` x ``size`` input."""
    for kernel, stride in ((3, 1), (1, 1), (3, 2), (3, 1), (1, 1), (3, 2), (3, 1)):
        size = (size - kernel) // stride + 1
    return size


class FedUVSimpleCNN(nn.Module):
    """See the module docstring. ``model.name: feduv_simplecnn``, ``model.params.out_dim``,
    ``model.params.width``."""

    levels = ("conv2", "conv5", "conv8", "encoder", "projector")

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        image_size: int = 32,
        *,
        out_dim: int = 256,
        width: int = 1,
    ):
        super().__init__()
        if out_dim < 2:
            raise ValueError(f"out_dim must be >= 2 (its BatchNorm1d), got {out_dim}")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if image_size < MIN_IMAGE_SIZE or _side_after_convs(image_size) < 1:
            raise ValueError(
                f"needs images of at least {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE} (unpadded "
                f"convolutions), got {image_size}x{image_size}; set dataset.image_size"
            )
        w = width
        # their order of construction (it is the order of the initial draws)
        self.conv1 = nn.Conv2d(in_channels, 16 * w, kernel_size=3, bias=False)
        self.conv1_bn = nn.BatchNorm2d(16 * w)
        self.conv2 = nn.Conv2d(16 * w, 16 * w, 1, bias=False)
        self.conv2_bn = nn.BatchNorm2d(16 * w)
        self.relu = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(16 * w, 32 * w, 3, stride=2, bias=False)
        self.conv3_bn = nn.BatchNorm2d(32 * w)
        self.conv4 = nn.Conv2d(32 * w, 32 * w, 3, bias=False)
        self.conv4_bn = nn.BatchNorm2d(32 * w)
        self.conv5 = nn.Conv2d(32 * w, 32 * w, 1, bias=False)
        self.conv5_bn = nn.BatchNorm2d(32 * w)
        self.conv6 = nn.Conv2d(32 * w, 64 * w, 3, stride=2, bias=False)
        self.conv6_bn = nn.BatchNorm2d(64 * w)
        self.conv7 = nn.Conv2d(64 * w, 64 * w, 3, bias=False)
        self.conv7_bn = nn.BatchNorm2d(64 * w)
        self.conv8 = nn.Conv2d(64 * w, 64 * w, 1, bias=False)
        self.conv8_bn = nn.BatchNorm2d(64 * w)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc1 = nn.Linear(64 * w, out_dim)
        self.fc1_bn = nn.BatchNorm1d(out_dim)
        self.fc2 = nn.Linear(out_dim, out_dim)
        self.fc2_bn = nn.BatchNorm1d(out_dim)
        self.fc = nn.Linear(out_dim, num_classes)  # their fc3
        self.feature_dim = out_dim

    def _conv(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.relu(getattr(self, f"conv{i}_bn")(getattr(self, f"conv{i}")(x)))

    def forward(self, x: torch.Tensor, return_features: bool = False):
        taps = {}
        for i in range(1, 9):
            x = self._conv(i, x)
            if return_features and i in (2, 5, 8):
                taps[f"conv{i}"] = x.mean((2, 3))
        x = self.avgpool(x)
        x = x.view(-1, x.shape[1] * x.shape[2] * x.shape[3])
        if return_features:
            taps["encoder"] = x
        x = self.relu(self.fc1_bn(self.fc1(x)))
        x = self.relu(self.fc2_bn(self.fc2(x)))
        logits = self.fc(x)
        if not return_features:
            return logits
        taps["projector"] = x
        taps["penultimate"] = x
        return logits, taps
