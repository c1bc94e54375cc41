"""Embedding a dataset with a model, and the representation metrics of a global model for
``metrics.jsonl`` (FedRCL Figures 2-3: effective rank, within/between-class traces, VCI,
deviation D(x))."""

from __future__ import annotations

import numpy as np
import torch

from fedrcl_flwr.data.datasets import iterate_batches


@torch.no_grad()
def embed(
    model, dataset, device, *, indices=None, feature: str = "penultimate", batch_size: int = 500
) -> tuple[torch.Tensor, torch.Tensor]:
    """The feature ``feature`` of ``dataset[indices]`` (all samples by default, in order,
    un-augmented) in eval mode, as float32 CPU tensors ``(features, labels)``; the model's
    train/eval mode is restored afterwards. The one embedding used by the signal methods
    (their uploads) and by :func:`representation_record`. Batches are delivered on
    ``device`` and the features stay there until one copy back at the end."""
    idx = np.arange(len(dataset)) if indices is None else indices
    was_training = model.training
    model.eval()
    feats, labels = [], []
    try:
        for x, y in iterate_batches(dataset, idx, batch_size, device=device):
            _, f = model(x, return_features=True)
            feats.append(f[feature].float())
            labels.append(torch.as_tensor(y))
    finally:
        model.train(was_training)
    if not feats:
        return torch.zeros(0, 0), torch.zeros(0, dtype=torch.int64)
    return torch.cat(feats).cpu(), torch.cat(labels).cpu()


def representation_record(
    model, dataset, device, *, feature: str = "penultimate", max_samples: int = 2000, seed: int = 0
) -> dict:
    """``{"repr_effective_rank": ..., "repr_vci": ..., ...}`` on up to ``max_samples``
    samples (a seeded subset of a larger dataset)."""
    from fedrcl_flwr.metrics import representation_metrics

    n = len(dataset)
    idx = np.arange(n)
    if n > max_samples:
        idx = np.sort(np.random.default_rng(seed).choice(n, max_samples, replace=False))
    z, y = embed(model, dataset, device, indices=idx, feature=feature)
    return {f"repr_{k}": float(v) for k, v in representation_metrics(z.double(), y).items()}
