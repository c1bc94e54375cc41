"""Centralised evaluation of a global model and the papers' EMA accuracy."""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from fedrcl_flwr.data.datasets import iterate_batches


@dataclass
class EvalResult:
    loss: float
    accuracy: float
    num_samples: int
    per_group: dict = field(default_factory=dict)  # e.g. per-domain accuracy


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    dataset: Dataset,
    device: torch.device,
    *,
    batch_size: int = 500,
    indices: np.ndarray | None = None,
    groups: np.ndarray | None = None,
    group_names: list | None = None,
) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``dataset`` (un-augmented; only
    the samples ``indices`` when given).

    ``groups`` (one id per sample, e.g. the domain) adds per-group accuracy and their
    unweighted average under ``per_group``.

    Batches go to ``device`` as ``uint8`` and are normalised there; the loss (a float64
    sum of the per-batch float32 sums, as before) and the hit counts stay on the device
    until the end: one read-back per call.
    """
    model.eval()
    idx = np.arange(len(cast(Sized, dataset))) if indices is None else indices
    loader = iterate_batches(dataset, idx, batch_size, device=device)
    dev = torch.device(device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
    correct = torch.zeros((), dtype=torch.int64, device=dev)
    n = 0
    hits = []
    for x, y in loader:
        logits = model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
        hit = logits.argmax(1) == y
        correct += hit.sum()
        n += int(y.shape[0])
        if groups is not None:
            hits.append(hit)
    loss_total, correct_total = torch.stack([loss_sum, correct.double()]).tolist()
    result = EvalResult(
        loss=loss_total / max(n, 1), accuracy=int(correct_total) / max(n, 1), num_samples=n
    )
    if groups is not None:
        hit = torch.cat(hits).cpu().numpy() if hits else np.zeros(0, bool)
        names = group_names or [str(g) for g in sorted(set(groups.tolist()))]
        accs = {}
        for g in sorted(set(groups.tolist())):
            mask = groups == g
            accs[names[g] if g < len(names) else str(g)] = float(hit[mask].mean())
        result.per_group = accs
        result.per_group["average"] = float(np.mean(list(accs.values())))
    return result


class EMATracker:
    """EMA_t = factor * EMA_{t-1} + (1 - factor) * acc_t, as FedRCL reports.

    The FedRCL paper reports "accuracies at the target round ... based on the exponential
    moving average results with parameter 0.9" (Table 1 caption, Figure A); the authors'
    released code (skynbe/FedRCL ``trainers/base_trainer.py``) logs each round's test
    accuracy and computes no EMA, so the start is ours: the first value initialises the
    average (EMA_1 = acc_1), so there is no zero-start bias to correct. The average
    trails a rising accuracy by about 1 / (1 - factor) evaluations (10 for 0.9): it is
    the number to compare with FedRCL's tables at their target rounds (``ema@ROUND``),
    not a running estimate of the current model (progress lines show it only for runs
    that report it, :func:`fedrcl_flwr.run.progress.shows_ema`).
    """

    def __init__(self, factor: float = 0.9, value: float | None = None):
        self.factor = factor
        self.value = value

    def update(self, acc: float) -> float:
        if self.value is None:
            self.value = acc
        else:
            self.value = self.factor * self.value + (1.0 - self.factor) * acc
        return self.value


def robust_accuracy(
    model: nn.Module,
    dataset: Dataset,
    device: torch.device,
    *,
    eps: float,
    step: float,
    steps: int = 20,
    max_samples: int = 1000,
    batch_size: int = 250,
    seed: int = 0,
) -> dict:
    """Clean, FGSM and PGD-``steps`` accuracy of ``model`` on up to ``max_samples``
    samples (FedCCL Table 8). The attacks work in [0, 1] **pixel space**: ``eps``/``step``
    are pixel units (8/255, 2/255 for the usual PGD-20), adversarial pixels are clamped to
    [0, 1], and the dataset's normalisation (its ``mean``/``std``) is applied inside the
    attacked model (``losses.fedccl.PixelSpace``)."""
    from fedrcl_flwr.losses.fedccl import dataset_pixel_stats, fgsm_attack, pgd_attack

    mean, std = dataset_pixel_stats(dataset)

    n = len(cast(Sized, dataset))  # our datasets are map-style, with a length
    idx = np.arange(n)
    if n > max_samples:
        idx = np.sort(np.random.default_rng(seed).choice(n, max_samples, replace=False))
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    hits = {"clean": 0, "fgsm": 0, f"pgd{steps}": 0}
    total = 0
    for x, y in iterate_batches(dataset, idx, batch_size, device=device):
        with torch.no_grad():
            hits["clean"] += int((model(x).argmax(1) == y).sum())
        x_f = fgsm_attack(model, x, y, eps=eps, mean=mean, std=std)
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        x_p = pgd_attack(model, x, y, eps=eps, step=step, steps=steps, mean=mean, std=std)
        with torch.no_grad():
            hits["fgsm"] += int((model(x_f).argmax(1) == y).sum())
            hits[f"pgd{steps}"] += int((model(x_p).argmax(1) == y).sum())
        total += int(y.shape[0])
    return {f"robust_{k}_accuracy": v / max(total, 1) for k, v in hits.items()}
