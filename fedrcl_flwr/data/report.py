"""Partition report: per-client class counts as a table and as a heatmap PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np


def class_counts(parts: list, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_clients, num_classes) sample counts."""
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def format_counts_table(counts: np.ndarray, max_rows: Optional[int] = None) -> str:
    """Markdown table: one row per client (size and count per class) plus a summary."""
    n_clients, k = counts.shape
    header = ["client", "size", "classes"] + [str(c) for c in range(k)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = range(n_clients) if max_rows is None else range(min(max_rows, n_clients))
    for i in rows:
        row = counts[i]
        lines.append("| " + " | ".join([str(i), str(int(row.sum())), str(int((row > 0).sum()))]
                                       + [str(int(v)) for v in row]) + " |")
    if max_rows is not None and n_clients > max_rows:
        lines.append(f"| ... {n_clients - max_rows} more clients |")
    sizes = counts.sum(1)
    lines.append("")
    lines.append(f"{n_clients} clients, {int(sizes.sum())} samples; size min/mean/max "
                 f"{int(sizes.min())}/{sizes.mean():.1f}/{int(sizes.max())}; classes per "
                 f"client mean {(counts > 0).sum(1).mean():.2f}")
    return "\n".join(lines)


def plot_counts_heatmap(counts: np.ndarray, path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_clients, k = counts.shape
    fig, ax = plt.subplots(figsize=(min(2 + 0.4 * k, 14), min(2 + 0.08 * n_clients, 14)))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or "samples per client and class")
    fig.colorbar(im, ax=ax, label="samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
