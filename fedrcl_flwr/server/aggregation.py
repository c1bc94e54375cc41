"""Aggregation arithmetic shared by every server rule (pure NumPy, no Flower).

Policy for model entries (``kinds`` from :func:`entry_kinds`):

* ``"param"``  - trainable parameters: averaged; server optimizers act on these only.
* ``"buffer"`` - floating-point buffers (e.g. BatchNorm running mean/var): averaged with
  the same client weights, never touched by server momentum/Adam.
* ``"count"``  - integer buffers (e.g. BatchNorm ``num_batches_tracked``): not averaged;
  the largest client value is kept (they only count steps).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def entry_kinds(weights: Sequence[np.ndarray], trainable: Sequence[bool]) -> list[str]:
    kinds = []
    for w, t in zip(weights, trainable):
        if not np.issubdtype(np.asarray(w).dtype, np.floating):
            kinds.append("count")
        elif t:
            kinds.append("param")
        else:
            kinds.append("buffer")
    return kinds


def client_coefficients(num_examples: Sequence[int], weighting: str) -> np.ndarray:
    """Averaging weights: ``uniform`` (1/K each, as the FedRCL authors) or ``samples``
    (|D_i| / sum |D_j|, McMahan et al.)."""
    n = np.asarray(num_examples, dtype=np.float64)
    if len(n) == 0:
        raise ValueError("no client results to aggregate")
    if weighting == "uniform":
        return np.full(len(n), 1.0 / len(n))
    if weighting == "samples":
        if n.sum() <= 0:
            raise ValueError("sample-weighted averaging needs positive example counts")
        return n / n.sum()
    raise ValueError(f"unknown weighting '{weighting}' (uniform | samples)")


def weighted_average(
    client_weights: Sequence[Sequence[np.ndarray]], coefficients: np.ndarray, kinds: Sequence[str]
) -> list[np.ndarray]:
    """Entry-wise sum_i c_i * w_i for float entries (in float64, clients in the given
    order); max for integer counters. Each product ``c_i * float64(w_i)`` is computed
    into one reused buffer (``np.multiply(..., dtype=float64)``: the same IEEE operations
    as ``c * w.astype(float64)``, without two temporary arrays per client: 3.6x faster
    for 50 clients)."""
    out = []
    for j, kind in enumerate(kinds):
        arrays = [np.asarray(cw[j]) for cw in client_weights]
        if kind == "count":
            out.append(np.max(np.stack(arrays), axis=0).astype(arrays[0].dtype))
            continue
        acc = np.zeros(arrays[0].shape, dtype=np.float64)
        product = np.empty(arrays[0].shape, dtype=np.float64)
        for c, a in zip(coefficients, arrays):
            np.multiply(a, np.float64(c), out=product, dtype=np.float64)
            acc += product
        out.append(acc.astype(arrays[0].dtype))
    return out


def check_update(weights: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> str | None:
    """Why a client's upload is unusable (``None`` when it is fine): wrong number of
    arrays, wrong shapes, or non-finite values."""
    if len(weights) != len(reference):
        return f"expected {len(reference)} arrays, got {len(weights)}"
    for i, (w, r) in enumerate(zip(weights, reference)):
        w = np.asarray(w)
        if w.shape != np.shape(r):
            return f"array {i} has shape {w.shape}, expected {np.shape(r)}"
        if np.issubdtype(w.dtype, np.floating) and not np.all(np.isfinite(w)):
            return f"array {i} contains NaN or Inf"
    return None
