"""Self-supervised contrastive loss used by the FedCL ablation (FedRCL paper, Table 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["info_nce"]


def info_nce(z1: torch.Tensor, z2: torch.Tensor, tau: float = 0.5) -> torch.Tensor:
    """NT-Xent / InfoNCE (Chen et al., SimCLR, 2020) between two views.

    For 2B L2-normalised embeddings, each sample's positive is its other view and the
    2B − 2 remaining samples are negatives:
    ℓ_i = −log( e^{s(i, i')/τ} / Σ_{k≠i} e^{s(i,k)/τ} ), averaged over the 2B anchors.
    """
    z = F.normalize(torch.cat([z1, z2], 0), dim=1)
    n = z1.shape[0]
    sim = z @ z.t() / tau
    eye = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    sim = sim.masked_fill(eye, float("-inf"))
    pos = torch.cat([torch.arange(n, 2 * n, device=z.device), torch.arange(0, n, device=z.device)])
    return F.cross_entropy(sim, pos)
