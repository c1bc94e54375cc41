"""Centralised evaluation of a global model and the papers' EMA accuracy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


@dataclass
class EvalResult:
    loss: float
    accuracy: float
    num_samples: int
    per_group: dict = field(default_factory=dict)  # e.g. per-domain accuracy


@torch.no_grad()
def evaluate_model(model: nn.Module, dataset: Dataset, device: torch.device, *,
                   batch_size: int = 500, groups: Optional[np.ndarray] = None,
                   group_names: Optional[list] = None) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``dataset``.

    ``groups`` (one id per sample, e.g. the domain) adds per-group accuracy and their
    unweighted average under ``per_group``.
    """
    model.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=0)
    loss_sum, correct, n = 0.0, 0, 0
    preds = []
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        p = logits.argmax(1)
        correct += int((p == y).sum())
        n += int(y.shape[0])
        if groups is not None:
            preds.append((p == y).cpu().numpy())
    result = EvalResult(loss=loss_sum / max(n, 1), accuracy=correct / max(n, 1),
                        num_samples=n)
    if groups is not None:
        hit = np.concatenate(preds)
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

    The first value initialises the average (EMA_1 = acc_1).
    """

    def __init__(self, factor: float = 0.9, value: Optional[float] = None):
        self.factor = factor
        self.value = value

    def update(self, acc: float) -> float:
        if self.value is None:
            self.value = acc
        else:
            self.value = self.factor * self.value + (1.0 - self.factor) * acc
        return self.value
