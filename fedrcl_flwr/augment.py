"""Cheap batch-level augmentations on already-normalised image tensors (B, C, H, W).

Used where a method needs a *second* view of a batch (self-supervised contrast) or an
extra random transform without going back to the dataset.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_crop_flip(x: torch.Tensor, pad: int = 4, flip: bool = True,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-sample random crop (zero padding ``pad``) and horizontal flip, vectorised."""
    b, _, h, w = x.shape
    dev = x.device
    padded = F.pad(x, (pad, pad, pad, pad))
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=generator).to(dev)
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=generator).to(dev)
    rows = (oy[:, None] + torch.arange(h, device=dev)[None, :])  # (B, H)
    cols = (ox[:, None] + torch.arange(w, device=dev)[None, :])  # (B, W)
    if flip:
        do = torch.rand(b, generator=generator).to(dev) < 0.5
        cols = torch.where(do[:, None], cols.flip(1), cols)
    idx_b = torch.arange(b, device=dev)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx_b, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2).contiguous()
