"""The raw form every dataset source is read into (``uint8`` images, ``int64`` labels) and
the checks that bring an array to it. A leaf of ``fedrcl_flwr.data``: the readers of
this package (``hf.py`` among them) and the loader (``fedrcl_flwr/data/datasets.py``) all
build on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrcl_flwr.errors import ConfigError

# the most classes (and domains) a dataset may have: a label is below it (ImageNet-21k has
# 21,841 classes; a label of 10**9 would make a classifier of 10**9 outputs)
MAX_CLASSES = 100_000


class DatasetError(ConfigError):
    """A dataset that cannot be found or read (a user-input problem: exit code 2)."""


@dataclass
class RawSplit:
    x: np.ndarray  # uint8 (N, H, W, C)
    y: np.ndarray  # int64 (N,)
    d: np.ndarray | None = None  # int64 domain ids
    # classes the source's own class list names (CIFAR's batches.meta: torchvision's
    # ``classes``, the FedRCL authors' K = len(class_to_idx)); None = from the labels
    classes: int | None = None


def hwc(x, what: str = "images") -> np.ndarray:
    """Any image array (N,H,W), (N,H,W,C) or (N,C,H,W) -> uint8 (N,H,W,C).

    Layout rule: 4-D arrays are channels-last unless only the channels-first reading has 1
    or 3 channels. When both readings have 1 or 3 channels (e.g. (N, 3, 16, 3)) the one
    that gives square images wins; if that does not decide it, it is an error.

    Values: ``uint8`` as is; other integer types must lie in [0, 255]; floats must be
    finite and in [0, 1] (scaled by 255 and rounded). Anything else (NaN/Inf pixels, floats
    outside [0, 1], strings, objects) is a :class:`DatasetError` naming ``what``.
    """
    x = np.asarray(x)
    if x.dtype.kind not in "uifb":
        raise DatasetError(
            f"{what}: pixel array of type {x.dtype} (need numbers: uint8 in "
            "[0, 255] or floats in [0, 1])"
        )
    if x.ndim == 3:
        x = x[..., None]
    elif x.ndim == 4:
        last, first = x.shape[-1] in (1, 3), x.shape[1] in (1, 3)
        if first and not last:
            x = x.transpose(0, 2, 3, 1)
        elif first and last:
            sq_last, sq_first = x.shape[1] == x.shape[2], x.shape[2] == x.shape[3]
            if sq_first and not sq_last:
                x = x.transpose(0, 2, 3, 1)
            elif sq_last == sq_first:
                raise DatasetError(
                    f"{what}: shape {x.shape} is ambiguous (channels-first and channels-last "
                    "both possible); store images as N x H x W x C with H == W"
                )
    if x.ndim != 4:
        raise DatasetError(
            f"{what}: images must be N x H x W or N x H x W x C, got shape {x.shape}"
        )
    if x.dtype != np.uint8:
        if x.dtype.kind == "f":
            finite = np.isfinite(x)
            if not finite.all():
                raise DatasetError(f"{what}: {int((~finite).sum())} NaN/Inf pixel values")
            if x.size and (x.min() < 0.0 or x.max() > 1.0):
                raise DatasetError(
                    f"{what}: float pixels must be in [0, 1], found values in "
                    f"[{float(x.min()):.4g}, {float(x.max()):.4g}] (scale them to [0, 1], or "
                    "store uint8 in [0, 255])"
                )
            x = np.rint(x.astype(np.float32) * np.float32(255.0)).astype(np.uint8)
        else:
            if x.size and (x.min() < 0 or x.max() > 255):
                raise DatasetError(
                    f"{what}: integer pixels must be in [0, 255], found values in "
                    f"[{int(x.min())}, {int(x.max())}]"
                )
            x = x.astype(np.uint8)
    return np.ascontiguousarray(x)


def int_labels(y, what: str) -> np.ndarray:
    """Labels as int64: integers, or floats that are whole numbers (1.0 -> 1); NaN/Inf,
    fractional, negative or non-numeric labels, and labels of :data:`MAX_CLASSES` or more,
    are a :class:`DatasetError`."""
    y = np.asarray(y)
    if y.dtype.kind not in "uif":
        raise DatasetError(f"{what}: labels of type {y.dtype} (need non-negative integers)")
    y = y.ravel()
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise DatasetError(f"{what}: {int((~np.isfinite(y)).sum())} NaN/Inf labels")
        if (y != np.round(y)).any():
            bad = y[y != np.round(y)][:3].tolist()
            raise DatasetError(f"{what}: fractional labels such as {bad} (need whole numbers)")
    if len(y) and y.min() < 0:
        raise DatasetError(f"{what}: negative labels (min {y.min()})")
    if len(y) and y.max() >= MAX_CLASSES:
        raise DatasetError(
            f"{what}: label {int(y.max())} (labels are class numbers 0..{MAX_CLASSES - 1:,}: "
            f"at most {MAX_CLASSES:,} classes)"
        )
    return y.astype(np.int64)


def resize_u8(x: np.ndarray, size: int) -> np.ndarray:
    """Resize uint8 (N, H, W, C) to ``size x size`` (torch's antialiased bilinear), in
    chunks."""
    import torch
    import torch.nn.functional as F

    if x.shape[1] == size and x.shape[2] == size:
        return x
    out = np.empty((x.shape[0], size, size, x.shape[3]), np.uint8)
    for i in range(0, len(x), 2048):
        t = torch.from_numpy(x[i : i + 2048]).permute(0, 3, 1, 2).float()
        r = F.interpolate(
            t, size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )
        out[i : i + 2048] = r.round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
    return out
