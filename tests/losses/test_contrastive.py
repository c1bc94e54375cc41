"""The FedCL ablation's NT-Xent / InfoNCE loss against its closed form."""

from __future__ import annotations

import math

import torch

from fedrcl_flwr.losses.contrastive import info_nce


def test_info_nce_closed_form_on_orthogonal_views():
    """Two samples, each view equal to its sample, the samples orthogonal: for every one of
    the 2B = 4 anchors the positive has similarity 1, the other view of itself is the
    positive, and the two remaining embeddings have similarity 0, so
    ℓ = −log(e^{1/τ} / (e^{1/τ} + 2 e^0)) = log(1 + 2 e^{−1/τ})."""
    z = torch.eye(2, 3) * 5.0  # not unit length: info_nce normalises
    tau = 0.5
    expected = math.log(1 + 2 * math.exp(-1 / tau))
    assert math.isclose(info_nce(z, z.clone(), tau).item(), expected, rel_tol=1e-6)


def test_info_nce_falls_as_the_views_agree():
    torch.manual_seed(0)
    a = torch.randn(8, 16)
    noisy, close = a + torch.randn(8, 16), a + 0.01 * torch.randn(8, 16)
    assert info_nce(a, close).item() < info_nce(a, noisy).item()
