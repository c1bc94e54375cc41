"""Cheap batch-level augmentations on already-normalised image tensors (B, C, H, W).

Used where a method needs a *second* view of a batch (self-supervised contrast) or an
extra random transform without going back to the dataset, and by the dataset itself
(``ImageArrayDataset.get_batch``) on whatever device the batch lives on.

The random draws (offsets, flips, angles) always come from a generator on the host (the
CPU ``generator`` given, or PyTorch's default one), in a fixed order, and are copied to
the batch's device without blocking (a few bytes per sample): the same draws whatever
the device, and no host wait on an accelerator.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedrcl_flwr.accel import to_device


def random_crop_flip(x: torch.Tensor, pad: int = 4, flip: bool = True,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-sample random crop (zero padding ``pad``) and horizontal flip, vectorised."""
    b, _, h, w = x.shape
    dev = x.device
    padded = F.pad(x, (pad, pad, pad, pad))
    ox = to_device(torch.randint(0, 2 * pad + 1, (b,), generator=generator), dev)
    oy = to_device(torch.randint(0, 2 * pad + 1, (b,), generator=generator), dev)
    rows = (oy[:, None] + torch.arange(h, device=dev)[None, :])  # (B, H)
    cols = (ox[:, None] + torch.arange(w, device=dev)[None, :])  # (B, W)
    if flip:
        do = to_device(torch.rand(b, generator=generator), dev) < 0.5
        cols = torch.where(do[:, None], cols.flip(1), cols)
    idx_b = torch.arange(b, device=dev)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx_b, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


def rotate(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Rotate every image of ``x`` (B, C, H, W) by its own angle ``degrees[b]`` (counter-
    clockwise, about the image centre) with nearest-neighbour sampling and zero fill — what
    torchvision's ``RandomRotation`` does per image with its defaults (NEAREST, fill 0)."""
    b = x.shape[0]
    rad = to_device(degrees, x.device).to(torch.float32) * (math.pi / 180.0)
    cos, sin = torch.cos(rad), torch.sin(rad)
    h, w = x.shape[-2:]
    # affine_grid works in [-1, 1]^2 coordinates; rescale so non-square images rotate
    # rigidly in pixel units
    theta = torch.zeros(b, 2, 3, device=x.device)
    theta[:, 0, 0], theta[:, 0, 1] = cos, -sin * h / w
    theta[:, 1, 0], theta[:, 1, 1] = sin * w / h, cos
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def random_rotation(x: torch.Tensor, max_degrees: float,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-sample rotation by an angle drawn uniformly from [−max_degrees, max_degrees]
    (torchvision ``RandomRotation(max_degrees)``; the FedRCL authors use 10 for CIFAR and
    Tiny-ImageNet, skynbe/FedRCL ``datasets/build.py: get_transform``)."""
    angles = (torch.rand(x.shape[0], generator=generator) * 2.0 - 1.0) * float(max_degrees)
    return rotate(x, angles)
