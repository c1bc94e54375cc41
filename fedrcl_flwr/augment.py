"""Batch-level augmentations on image tensors (B, C, H, W), pixel-exact to torchvision's.

Used by the dataset itself (``ImageArrayDataset.get_batch``, on whatever device the batch
lives on) and where a method needs a *second* view of a batch (self-supervised contrast)
without going back to the dataset.

:class:`AugmentSpec` says which of them a dataset's training batches get (each dataset's
standard one is in :data:`fedrcl_flwr.data.sources.table.SOURCES`; the ``dataset.*``
keys adjust it: :func:`fedrcl_flwr.data.datasets.augment_spec`).

Each transform is split into its draws and its application, so that for given draws the
result is that of torchvision's transform on the PIL image (tests/datasets/test_input_pipeline.py):

* :func:`rotate` = ``torchvision.transforms.functional.rotate(img, angle)`` with
  ``RandomRotation``'s defaults (nearest neighbour, no expand, centre, fill 0), i.e.
  Pillow's ``Image.rotate``: the same rotation matrix (``round(cos, 15)``, ...) and
  Pillow's 16.16 fixed-point nearest-neighbour affine loop (``Geometry.c:
  affine_fixed``), done in integer arithmetic, so the same source pixel is taken on any
  device; outside the image the fill is 0;
* :func:`crop_flip` = ``F.pad(img, pad, fill)`` -> ``F.crop(img, top, left, H, W)`` ->
  ``F.hflip`` where flipped (``RandomCrop(size, padding=pad)`` + ``RandomHorizontalFlip``).

The random draws (angles, offsets, flips) always come from a generator on the host (the
CPU ``generator`` given, or PyTorch's default one), in a fixed order, and are copied to
the batch's device without blocking (a few bytes per sample): the same draws whatever
the device, and no host wait on an accelerator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedrcl_flwr.accel import to_device


@dataclass(frozen=True)
class AugmentSpec:
    """The training augmentation, in torchvision's order on the image before
    ``ToTensor`` / ``Normalize``: random rotation by up to ``rotation`` degrees (0 = off;
    nearest neighbour, black corners), random crop with padding ``crop_pad`` (0 = off),
    horizontal flip. ``pad_fill``: ``black`` pads the crop with pixel value 0 before
    normalisation (torchvision's ``RandomCrop(padding=p)`` on a PIL image); ``mean`` pads
    the normalised image with 0, i.e. with the normalisation mean colour."""

    crop_pad: int = 0
    flip: bool = False
    rotation: float = 0.0
    pad_fill: str = "mean"

    @property
    def active(self) -> bool:
        return self.crop_pad > 0 or self.flip or self.rotation > 0


_FIX = 65536.0  # Pillow's 16.16 fixed point


def _fix(v: float) -> int:
    return math.floor(v * _FIX + 0.5)


def pil_rotation_coefficients(angle: float, width: int, height: int) -> list[int]:
    """The six 16.16 fixed-point coefficients with which Pillow's ``Image.rotate(angle,
    NEAREST)`` (no expand, no centre, no translation) maps an output pixel ``(x, y)`` to
    its source: ``x_in = (c2 + x·c0 + y·c1) >> 16``, ``y_in = (c5 + x·c3 + y·c4) >> 16``.
    Computed in double precision with Pillow's expressions and order of operations
    (``Image.rotate``: ``angle % 360``, the matrix of ``-radians(angle)`` rounded to 15
    decimals about the centre ``(w / 2, h / 2)``; ``affine_fixed``: ``FIX(v) =
    floor(v·65536 + 0.5)``, the half-pixel offset folded into ``c2`` / ``c5``). Angles of 0,
    90, 180, 270 degrees give exactly the transposes Pillow uses for them on square images.
    """
    angle = float(angle) % 360.0
    cx, cy = width / 2, height / 2
    rad = -math.radians(angle)
    a, b = round(math.cos(rad), 15), round(math.sin(rad), 15)
    d, e = round(-math.sin(rad), 15), round(math.cos(rad), 15)
    c = a * -cx + b * -cy + 0.0 + cx
    f = d * -cx + e * -cy + 0.0 + cy
    return [
        _fix(a),
        _fix(b),
        _fix(c + a * 0.5 + b * 0.5),
        _fix(d),
        _fix(e),
        _fix(f + d * 0.5 + e * 0.5),
    ]


def _angles(degrees: torch.Tensor | Sequence[float]) -> list[float]:
    """The angles as Python floats (Pillow's coefficients are computed in double precision
    on the host). The training loop's angles are drawn on the host, so reading them is no
    device synchronisation."""
    if isinstance(degrees, torch.Tensor):
        return [float(v) for v in degrees.detach().reshape(-1).tolist()]  # host read
    return [float(v) for v in degrees]


def rotate(x: torch.Tensor, degrees: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """Rotate every image of ``x`` (B, C, H, W), any dtype, by its own angle
    ``degrees[b]`` (counter-clockwise, about the image centre), as torchvision's
    ``F.rotate`` on a PIL image with ``RandomRotation``'s defaults (see
    :func:`pil_rotation_coefficients`); pixels with no source are 0."""
    b, c, h, w = x.shape
    angles = _angles(degrees)
    if len(angles) != b:
        raise ValueError(f"rotate: {len(angles)} angles for {b} images")
    if b == 0:
        return x
    dev = x.device
    coef = to_device(
        torch.tensor([pil_rotation_coefficients(a, w, h) for a in angles], dtype=torch.int64), dev
    )
    k = [coef[:, i, None, None] for i in range(6)]
    xs = torch.arange(w, device=dev, dtype=torch.int64)[None, None, :]
    ys = torch.arange(h, device=dev, dtype=torch.int64)[None, :, None]
    x_in = torch.div(k[2] + xs * k[0] + ys * k[1], 1 << 16, rounding_mode="floor")
    y_in = torch.div(k[5] + xs * k[3] + ys * k[4], 1 << 16, rounding_mode="floor")
    inside = (x_in >= 0) & (x_in < w) & (y_in >= 0) & (y_in < h)  # (B, H, W)
    flat = (y_in.clamp(0, h - 1) * w + x_in.clamp(0, w - 1)).view(b, 1, h * w)
    src = x.reshape(b, c, h * w).gather(2, flat.expand(b, c, h * w)).view(b, c, h, w)
    return torch.where(inside[:, None], src, torch.zeros((), dtype=x.dtype, device=dev))


def random_rotation(
    x: torch.Tensor, max_degrees: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per-sample rotation by an angle drawn uniformly from [−max_degrees, max_degrees]
    (torchvision ``RandomRotation(max_degrees)``; the FedRCL authors use 10 for CIFAR and
    Tiny-ImageNet, skynbe/FedRCL ``datasets/build.py: get_transform``)."""
    return rotate(x, draw_angles(x.shape[0], max_degrees, generator))


def draw_angles(
    b: int, max_degrees: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``b`` angles uniform in [−max_degrees, max_degrees] (one ``torch.rand(b)``)."""
    return (torch.rand(b, generator=generator) * 2.0 - 1.0) * float(max_degrees)


def crop_flip(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    flip: torch.Tensor | None,
    pad: int,
    fill: float = 0.0,
) -> torch.Tensor:
    """Per-sample crop of ``x`` padded by ``pad`` on every side with ``fill``: sample b is
    the (H, W) window at row ``top[b]``, column ``left[b]`` of the padded image (offsets
    in [0, 2·pad]), mirrored left-right where ``flip[b]`` (``None``: no flip). Offsets and
    flips may live on the host; they are copied to ``x``'s device."""
    b, _, h, w = x.shape
    dev = x.device
    padded = F.pad(x, (pad, pad, pad, pad), value=fill) if pad > 0 else x
    rows = to_device(top, dev)[:, None] + torch.arange(h, device=dev)[None, :]  # (B, H)
    cols = to_device(left, dev)[:, None] + torch.arange(w, device=dev)[None, :]  # (B, W)
    if flip is not None:
        cols = torch.where(to_device(flip, dev)[:, None], cols.flip(1), cols)
    idx_b = torch.arange(b, device=dev)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx_b, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()


def draw_crop_flip(b: int, pad: int, flip: bool, generator: torch.Generator | None = None):
    """The draws of :func:`random_crop_flip`, in its order: column offsets
    (``randint(0, 2·pad + 1, (b,))``), row offsets (the same), then flips
    (``rand(b) < 0.5``, only when ``flip``). Returns ``(top, left, flip mask or None)``."""
    left = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    top = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    do = torch.rand(b, generator=generator) < 0.5 if flip else None
    return top, left, do


def random_crop_flip(
    x: torch.Tensor,
    pad: int = 4,
    flip: bool = True,
    generator: torch.Generator | None = None,
    fill: float = 0.0,
) -> torch.Tensor:
    """Per-sample random crop (padding ``pad`` filled with ``fill``) and horizontal flip,
    vectorised (torchvision ``RandomCrop(size, padding=pad)`` + ``RandomHorizontalFlip``)."""
    top, left, do = draw_crop_flip(x.shape[0], pad, flip, generator)
    return crop_flip(x, top, left, do, pad, fill)
