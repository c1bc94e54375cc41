"""A run's figure, ``accuracy.png`` (test and EMA accuracy per round), and its title
(:func:`run_title`); the title wrapping and legend placement the reports' figures share."""

from __future__ import annotations

import os
from pathlib import Path

from fedrcl_flwr.run.run_files import guarded_write, new_file


def run_title(cfg) -> str:
    """What a run's ``accuracy.png`` is of: ``name: method (+ optimizer) on dataset,
    partition (α), clients (per round), rounds``."""
    from fedrcl_flwr.config.catalog import PARTITION_SCHEMES, dataset_info

    method = cfg.client.method
    if cfg.server.strategy != "fedavg":
        method += f" + {cfg.server.strategy}"
    data = cfg.dataset.name
    info = dataset_info(data)
    key = info.location_key if info.titled else None
    where = getattr(cfg.dataset, key.removeprefix("dataset."), None) if key else None
    if where:
        data += f" {Path(str(where)).name}"
    p = cfg.partition
    part = PARTITION_SCHEMES.get(p.scheme, p.scheme)
    if p.scheme == "dirichlet" or (p.scheme == "domain" and not p.balanced):
        part += f" α={p.alpha:g}"
    elif p.scheme == "shards":
        part += f" γ={p.shards_per_client}"
    fed = cfg.federation
    return (
        f"{cfg.name}: {method} on {data}, {part}, {fed.num_clients} clients "
        f"({fed.sampled_per_round()} per round), {fed.rounds} rounds"
    )


def wrap_title(title: str, width_in: float, fontsize: float = 11) -> str:
    """``title`` broken into lines that fit a figure ``width_in`` inches wide (about
    0.55 · fontsize points per character), so that no title is cut at the edges."""
    import textwrap

    chars = max(20, int(width_in * 72 / (0.55 * fontsize)) - 2)
    return "\n".join(textwrap.wrap(title, chars)) if title else ""


def legend_below(ax, entries: int) -> None:
    """The axes' legend under them (never over the curves), in up to two columns."""
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=1 if entries < 3 else 2,
        fontsize=8,
        frameon=False,
    )


def plot_accuracy(records: list[dict], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rs = [r for r in records if r.get("test_accuracy") is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    if rs:
        x = [r["round"] for r in rs]
        ax.plot(x, [100 * r["test_accuracy"] for r in rs], label="test accuracy", alpha=0.6)
        ax.plot(
            x,
            [100 * r["ema_accuracy"] for r in rs],
            label="EMA accuracy (moving average: trails the test accuracy)",
        )
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (%)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(wrap_title(title, 6.0, 10), fontsize=10)
    ax.grid(alpha=0.3)
    if rs:
        legend_below(ax, 2)
    tmp = path.with_name(path.stem + ".tmp.png")
    try:
        with guarded_write(path, tmp):
            with new_file(tmp) as fh:
                fig.savefig(fh, format="png", dpi=100, bbox_inches="tight")
            os.replace(tmp, path)
    finally:
        plt.close(fig)
