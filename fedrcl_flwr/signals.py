"""Feature "signals" (cluster means / prototypes) as they travel between client and server.

Signals are sent as NumPy ``.npz`` bytes (arrays only, loaded with ``allow_pickle=False``)
inside Flower's fit config / fit metrics, never as pickles. A signal set is
``vectors`` (K, D) float32, ``labels`` (K,) int64 class ids and ``counts`` (K,) int64
(how many samples each signal summarises; used for weighting).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np


class SignalError(ValueError):
    """A malformed signal upload (wrong dimension, NaN/Inf, absurd count, bad bytes)."""


@dataclass
class SignalSet:
    vectors: np.ndarray
    labels: np.ndarray
    counts: np.ndarray

    @classmethod
    def empty(cls, dim: int = 0) -> SignalSet:
        return cls(np.zeros((0, dim), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @staticmethod
    def concat(sets: list[SignalSet]) -> SignalSet:
        sets = [s for s in sets if len(s)]
        if not sets:
            return SignalSet.empty()
        return SignalSet(
            np.concatenate([s.vectors for s in sets]).astype(np.float32),
            np.concatenate([s.labels for s in sets]).astype(np.int64),
            np.concatenate([s.counts for s in sets]).astype(np.int64),
        )


def encode_signals(s: SignalSet) -> bytes:
    buf = io.BytesIO()
    np.savez(
        buf,
        vectors=np.asarray(s.vectors, np.float32),
        labels=np.asarray(s.labels, np.int64),
        counts=np.asarray(s.counts, np.int64),
    )
    return buf.getvalue()


def decode_signals(
    blob: object,
    *,
    dim: int | None = None,
    num_classes: int | None = None,
    max_signals: int = 100_000,
    max_count: int = 10_000_000,
) -> SignalSet:
    """Parse and validate signal bytes; raise :class:`SignalError` naming the problem."""
    if not isinstance(blob, (bytes, bytearray)):
        raise SignalError(f"signals must be bytes, got {type(blob).__name__}")
    try:
        with np.load(io.BytesIO(bytes(blob)), allow_pickle=False) as z:
            vectors, labels, counts = z["vectors"], z["labels"], z["counts"]
    except Exception as exc:  # noqa: BLE001 - any undecodable payload is malformed
        raise SignalError(f"undecodable signal payload ({exc.__class__.__name__})") from None
    if vectors.ndim != 2:
        raise SignalError(f"signal vectors must be 2-D, got shape {vectors.shape}")
    k = vectors.shape[0]
    if labels.shape != (k,) or counts.shape != (k,):
        raise SignalError(f"{k} vectors but labels {labels.shape} / counts {counts.shape}")
    if k > max_signals:
        raise SignalError(f"{k} signals exceed the limit of {max_signals}")
    if dim is not None and k and vectors.shape[1] != dim:
        raise SignalError(f"signal dimension {vectors.shape[1]}, expected {dim}")
    if not np.all(np.isfinite(vectors)):
        raise SignalError("signal vectors contain NaN or Inf")
    if k and (counts.min() < 1 or counts.max() > max_count):
        raise SignalError(f"absurd signal counts (min {counts.min()}, max {counts.max()})")
    if num_classes is not None and k and (labels.min() < 0 or labels.max() >= num_classes):
        raise SignalError(f"signal labels outside [0, {num_classes})")
    return SignalSet(vectors.astype(np.float32), labels.astype(np.int64), counts.astype(np.int64))


def class_cluster_signals(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    level: str = "coarsest",
    mode: str = "cluster",
    distance: str = "cosine",
    early_exit: bool = True,
    class_order: str = "sorted",
) -> SignalSet:
    """Per-class signals of a set of embeddings.

    ``mode="cluster"`` (FedCCL Eqs. 8-10): FINCH per class, the means of the clusters of
    the chosen partition level (``finest``, ``coarsest`` or an integer index; levels
    beyond the last available clamp to it; ``early_exit``: FINCH's ``ensure_early_exit``,
    which prunes links longer than the first level's and so stops the hierarchy earlier).
    ``mode="mean"``: one class-mean prototype per
    class (the averaged-signal ablation, and the prototypes of FedProto, FedProc, FPL and
    FedPCL; FINCH is not imported for it). ``class_order``: the classes ``sorted`` or in
    order of ``first_seen`` in ``labels`` (FPL's code builds its prototype dict so).
    """
    if mode not in ("cluster", "mean"):
        raise ValueError(f"class_cluster_signals: mode must be cluster or mean, got {mode!r}")
    vecs, labs, cnts = [], [], []
    for c in classes_in_order(labels, class_order):
        f = features[labels == c]
        if mode == "mean" or len(f) < 3:
            vecs.append(f.mean(0, keepdims=True))
            labs.append(c)
            cnts.append(len(f))
            continue
        from fedrcl_flwr.clustering import finch

        parts, _ = finch(f, distance=distance, ensure_early_exit=early_exit)
        if level == "finest":
            col = 0
        elif level == "coarsest":
            col = parts.shape[1] - 1
        else:
            col = min(int(level), parts.shape[1] - 1)
        assign = parts[:, col]
        for k in np.unique(assign):
            m = assign == k
            vecs.append(f[m].mean(0, keepdims=True))
            labs.append(c)
            cnts.append(int(m.sum()))
    if not vecs:
        return SignalSet.empty(features.shape[1] if features.ndim == 2 else 0)
    return SignalSet(
        np.concatenate(vecs).astype(np.float32),
        np.asarray(labs, np.int64),
        np.asarray(cnts, np.int64),
    )


CLASS_ORDERS = ("sorted", "first_seen")


def classes_in_order(labels: np.ndarray, order: str = "sorted") -> np.ndarray:
    """The distinct ``labels``, ``sorted`` or in order of ``first_seen``."""
    if order not in CLASS_ORDERS:
        raise ValueError(f"class order must be one of {CLASS_ORDERS}, got {order!r}")
    classes, first = np.unique(labels, return_index=True)
    return classes if order == "sorted" else classes[np.argsort(first, kind="stable")]
