"""Partition report: per-client class counts as a table and as a heatmap PNG, titled by
the experiment's name and split (:func:`partition_title`).

For inter-domain splits the domains each client holds (:func:`client_domains`) are shown
as a ``domains`` column in the table and as y tick labels plus a colour strip (one colour
per domain) beside the heatmap."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def class_counts(parts: list, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_clients, num_classes) sample counts."""
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def client_domains(
    parts: list, domains: np.ndarray | None, names: list | None = None
) -> list | None:
    """Per client, the ``+``-joined names of the domains its samples come from (``None``
    for single-domain data). ``names[d]`` names domain id ``d`` (default ``domain<d>``)."""
    if domains is None:
        return None
    domains = np.asarray(domains)
    names = list(names or [])

    def name(d: int) -> str:
        return str(names[d]) if 0 <= d < len(names) else f"domain{d}"

    return ["+".join(name(int(d)) for d in np.unique(domains[p])) for p in parts]


def format_counts_table(
    counts: np.ndarray, max_rows: int | None = None, domains: list | None = None
) -> str:
    """Markdown table: one row per client (size and count per class) plus a summary;
    ``domains`` (from :func:`client_domains`) adds a column naming each client's domains."""
    n_clients, k = counts.shape
    header = (
        ["client"]
        + (["domains"] if domains else [])
        + ["size", "classes"]
        + [str(c) for c in range(k)]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = range(n_clients) if max_rows is None else range(min(max_rows, n_clients))
    for i in rows:
        row = counts[i]
        lead = [str(i)] + ([domains[i]] if domains else [])
        lines.append(
            "| "
            + " | ".join(
                lead + [str(int(row.sum())), str(int((row > 0).sum()))] + [str(int(v)) for v in row]
            )
            + " |"
        )
    if max_rows is not None and n_clients > max_rows:
        lines.append(f"| ... {n_clients - max_rows} more clients |")
    sizes = counts.sum(1)
    lines.append("")
    lines.append(
        f"{n_clients} clients, {int(sizes.sum())} samples; size min/mean/max "
        f"{int(sizes.min())}/{sizes.mean():.1f}/{int(sizes.max())}; classes per "
        f"client mean {(counts > 0).sum(1).mean():.2f}"
    )
    return "\n".join(lines)


def plot_counts_heatmap(
    counts: np.ndarray, path: str | Path, title: str = "", domains: list | None = None
) -> None:
    """Write :func:`counts_heatmap_figure` to ``path``."""
    import matplotlib.pyplot as plt

    fig = counts_heatmap_figure(counts, title, domains)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def counts_heatmap_figure(counts: np.ndarray, title: str = "", domains: list | None = None):
    """Heatmap of samples per client (rows) and class (columns), ticks on whole client
    and class numbers; with ``domains`` (from :func:`client_domains`) rows are labelled
    ``client: domains`` and a strip on the left colours each row by its domain set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    n_clients, k = counts.shape
    height = min(2 + (0.25 if domains else 0.08) * n_clients, 14)
    if domains:
        fig, (strip, ax) = plt.subplots(
            1,
            2,
            figsize=(min(4 + 0.4 * k, 16), height),
            gridspec_kw={"width_ratios": [1, max(k, 4)], "wspace": 0.02},
            sharey=True,
        )
        kinds = sorted(set(domains))
        strip.imshow(
            np.array([[kinds.index(d)] for d in domains]),
            aspect="auto",
            cmap="tab10" if len(kinds) <= 10 else "tab20",
            interpolation="nearest",
            vmin=0,
            vmax=max(len(kinds) - 1, 1),
        )
        strip.set_xticks([0], ["domain"])
        strip.set_yticks(range(n_clients), [f"{i}: {d}" for i, d in enumerate(domains)])
        strip.set_ylabel("client")
    else:
        fig, ax = plt.subplots(figsize=(min(2 + 0.4 * k, 14), height))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not domains:
        ax.set_ylabel("client")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title or "samples per client and class")
    fig.colorbar(im, ax=ax, label="samples")
    if not domains:
        fig.tight_layout()
    return fig


def partition_title(cfg) -> str:
    """``name: N clients, <scheme and its parameter>`` for the partition heatmap."""
    from fedrcl_flwr.config.catalog import PARTITION_SCHEMES

    p = cfg.partition
    what = PARTITION_SCHEMES.get(p.scheme, p.scheme)
    what += {
        "dirichlet": f" α={p.alpha:g}" + ("" if p.balanced else ", unbalanced"),
        "shards": f" γ={p.shards_per_client}",
        "pathological": f" k={p.classes_per_client}",
        "flwr_datasets": _flower_partitioner_words(p.partitioner or {}),
        "domain": "" if p.balanced else f", imbalanced α={p.alpha:g}",
        "file": f" {Path(str(p.path)).name}",
    }.get(p.scheme, "")
    return f"{cfg.name}: {cfg.federation.num_clients} clients, {what}"


def _flower_partitioner_words(spec: dict) -> str:
    """`` DirichletPartitioner α=0.3``: a Flower Datasets partitioner by name, with its
    concentration ``alpha`` when it has one (a number, or a list of one per partition)."""
    words = f" {spec.get('name', '')}"
    alpha = spec.get("alpha")
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        words += f" α={alpha:g}"
    elif isinstance(alpha, (list, tuple)) and alpha:
        words += (
            f" α=[{', '.join(f'{a:g}' if isinstance(a, (int, float)) else '?' for a in alpha[:4])}"
        )
        words += ", ...]" if len(alpha) > 4 else "]"
    return words
