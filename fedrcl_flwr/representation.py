"""Representation metrics of a global model on a dataset, for ``metrics.jsonl``
(FedRCL Figures 2-3: effective rank, within/between-class traces, VCI, deviation D(x))."""

from __future__ import annotations

import numpy as np
import torch

from fedrcl_flwr.evaluation import _batches


@torch.no_grad()
def embed(model, dataset, device, *, feature: str = "penultimate", max_samples: int = 2000,
          batch_size: int = 500, seed: int = 0):
    n = len(dataset)
    idx = np.arange(n)
    if n > max_samples:
        idx = np.sort(np.random.default_rng(seed).choice(n, max_samples, replace=False))
    model.eval()
    feats, labels = [], []
    for x, y in _batches(dataset, batch_size, idx):
        _, f = model(x.to(device), return_features=True)
        feats.append(f[feature].double().cpu())
        labels.append(y)
    return torch.cat(feats), torch.cat(labels)


def representation_record(model, dataset, device, *, feature: str = "penultimate",
                          max_samples: int = 2000) -> dict:
    """``{"repr_effective_rank": ..., "repr_vci": ..., ...}`` on up to ``max_samples``."""
    from fedrcl_flwr.metrics import representation_metrics

    z, y = embed(model, dataset, device, feature=feature, max_samples=max_samples)
    return {f"repr_{k}": float(v) for k, v in representation_metrics(z, y).items()}
