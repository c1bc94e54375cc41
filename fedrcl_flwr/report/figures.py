"""The figures of ``fedrcl-flwr plot``: accuracy per round, one line per row (mean over
seeds, ±std band), one panel per setting (:func:`curves_figure`); for inter-domain runs a
panel per domain and one for their mean (:func:`plot_domains`); with per-client
evaluation the distribution of the clients' accuracies (:func:`plot_client_distribution`).
Rows, columns and the title are :mod:`fedrcl_flwr.report.grouping`'s, as in the table.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from fedrcl_flwr.report.grouping import Group, domain_heading, group_runs, json_key, setting_title
from fedrcl_flwr.report.reading import Run, is_number, load_runs
from fedrcl_flwr.run.plots import legend_below, wrap_title
from fedrcl_flwr.run.summaries import DOMAIN_AVERAGE, domains_of


def default_plot_out(dirs: list) -> Path:
    """Where ``plot DIR...`` writes without ``--out``: beside the run or sweep directory,
    named after it (``plot runs/quickstart`` -> ``runs/quickstart_curves.png`` / ``.pdf``);
    for several directories, ``accuracy_curves`` in the directory that holds them all."""
    paths = [Path(d).expanduser().resolve() for d in dirs]
    if len(paths) == 1:
        return paths[0].parent / f"{paths[0].name or 'runs'}_curves"
    return Path(os.path.commonpath([str(p.parent) for p in paths])) / "accuracy_curves"


def plot_files(out: Path) -> list[Path]:
    """The files ``plot --out OUT`` writes: ``OUT.png`` and ``OUT.pdf`` (a ``.png`` /
    ``.pdf`` suffix of ``OUT`` is dropped first)."""
    out = Path(out).expanduser()
    stem = out.with_suffix("") if out.suffix.lower() in (".png", ".pdf") else out
    return [stem.with_name(stem.name + ext) for ext in (".png", ".pdf")]


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def curves_figure(groups: list[Group], metric_key: str = "test_accuracy", subject: str = ""):
    """The figure of :func:`plot_groups`: one panel per column (setting), one line per
    row (mean over seeds) with a ±std band. Accuracy bands are clipped to [0, 100]; every
    panel shares one y-range (the panels are settings of one study: the same scale lets
    them be compared at a glance, :func:`_share_y_range`); each row has its own colour,
    line style and marker (:func:`_row_styles`: a line hidden under another stays visible
    at its markers); the title names what the runs share (then ``subject``, what the
    curves are, when given) and the panels what differs, and says "mean ± std over seeds"
    only where some line has more than one seed (:func:`_figure_title`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = list(dict.fromkeys(g.col for g in groups))
    style = _row_styles(list(dict.fromkeys(g.row for g in groups)))
    percent = metric_key.endswith("accuracy")
    ncol = min(len(cols), 3)
    nrow = math.ceil(len(cols) / ncol)
    fig, axes = plt.subplots(
        nrow,
        ncol,
        figsize=(5 * ncol, 4.6 * nrow),
        squeeze=False,
        sharey=True,
        layout="constrained",  # room for the wrapped titles and the legends below
    )
    ranges = []  # (lowest band edge, highest band edge) of every line drawn
    for ax, c in zip(axes.flat, cols):
        for g in (g for g in groups if g.col == c):
            ranges += _draw_curve(ax, g, style[g.row], metric_key, percent)
        _finish_panel(ax, c)
    for ax in axes[:, 0]:
        ax.set_ylabel(
            "test accuracy (%)"
            if metric_key == "test_accuracy"
            else metric_key + (" (%)" if percent else "")
        )
    if ranges:
        _share_y_range(axes, ranges, percent)
    for ax in list(axes.flat)[len(cols) :]:
        ax.set_visible(False)
    fig.suptitle(_figure_title(groups, cols, axes, subject), fontsize=11)
    return fig


def _row_styles(rows: list[str]) -> dict:
    """Row -> its colour, line style and marker (cycled in row order)."""
    import matplotlib.pyplot as plt

    return {
        r: dict(
            color=plt.cm.tab10(i % 10),
            linestyle=LINESTYLES[i % len(LINESTYLES)],
            marker=MARKERS[i % len(MARKERS)],
        )
        for i, r in enumerate(rows)
    }


def _seed_count(g: Group) -> int:
    """The distinct seeds of the group's runs (a line's n)."""
    return len({json_key(r.config.get("seed")) for r in g.runs})


def _draw_curve(ax, g: Group, st: dict, metric_key: str, percent: bool) -> list:
    """The group's mean curve and its ±std band (clipped to [0, 100] for a percentage) on
    ``ax``; ``[(lowest, highest)]`` edge of the band, ``[]`` when it has no point."""
    import numpy as np

    rounds, mean, std = _mean_curve(g, metric_key, 100.0 if percent else 1.0)
    if not rounds:
        return []
    lo, hi = mean - std, mean + std
    if percent:
        lo, hi = np.clip(lo, 0.0, 100.0), np.clip(hi, 0.0, 100.0)
    ax.plot(
        rounds,
        mean,
        color=st["color"],
        linestyle=st["linestyle"],
        marker=st["marker"],
        markersize=4,
        markevery=max(1, len(rounds) // 10),
        linewidth=1.5,
        label=f"{g.row} (n={_seed_count(g)})",
    )
    ax.fill_between(rounds, lo, hi, color=st["color"], alpha=0.15, linewidth=0)
    return [(float(lo.min()), float(hi.max()))]


def _finish_panel(ax, col: str) -> None:
    """A panel's title (its setting), round axis with integer ticks, grid and the legend
    below it."""
    from matplotlib.ticker import MaxNLocator

    ax.set_title(wrap_title(col or "", 5.0, 10), fontsize=10)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        legend_below(ax, len(ax.get_legend_handles_labels()[0]))


def _share_y_range(axes, ranges: list, percent: bool) -> None:
    """One y-range for every panel: the bands' extent padded by 3 % (at least 0.03),
    within [0, 100] for a percentage."""
    low, high = min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
    pad = 0.03 * max(high - low, 1.0)
    y0, y1 = low - pad, high + pad
    if percent:
        y0, y1 = max(y0, 0.0), min(y1, 100.0)
    axes.flat[0].set_ylim(y0, y1)  # shared by every panel


def _figure_title(groups: list[Group], cols: list, axes, subject: str) -> str:
    """The figure's title: what every run shares
    (:func:`~fedrcl_flwr.report.grouping.setting_title`; with one panel also its setting,
    which then leaves the panel's own title), then what the curves are."""
    title = setting_title(groups)
    if len(cols) == 1 and cols[0]:  # one panel: its setting belongs in the one title
        title = f"{title}, {cols[0]}" if title else cols[0]
        axes.flat[0].set_title("")
    seeds = max((_seed_count(g) for g in groups), default=0)
    what = "mean ± std over seeds" if seeds > 1 else "one seed per line (no band)"
    what = f"{subject}, {what}" if subject else what
    ncol = axes.shape[1]
    return wrap_title((title + ": " if title else "") + what, 5.0 * ncol, 11)


def _mean_curve(g: Group, metric_key: str, scale: float) -> tuple[list, Any, Any]:
    """Rounds, mean and sample std (``ddof = 1``; 0 for one run) over the group's runs of
    ``metric_key`` per round, times ``scale``."""
    import numpy as np

    curves = []
    for run in g.runs:
        if g.curve:  # a per-domain panel: one domain's test accuracy, or their mean
            curve = {}
            for r in run.records:
                per = domains_of(r.get("domain_accuracy"))
                if g.curve == DOMAIN_AVERAGE and per:
                    curve[int(r["round"])] = sum(per.values()) / len(per)
                elif g.curve in per:
                    curve[int(r["round"])] = per[g.curve]
            curves.append(curve)
            continue
        recs = [r for r in run.records if r.get(metric_key) is not None]
        curves.append({int(r["round"]): float(r[metric_key]) for r in recs})
    rounds = sorted(set().union(*curves)) if curves else []
    mean, std = [], []
    for rd in rounds:
        vs = [cv[rd] for cv in curves if rd in cv]
        mean.append(scale * float(np.mean(vs)))
        std.append(scale * float(np.std(vs, ddof=1)) if len(vs) > 1 else 0.0)
    return rounds, np.array(mean), np.array(std)


def plot_groups(dirs: list, out: Path, metric_key: str = "test_accuracy") -> list[Path]:
    """Accuracy per round, one line per row (mean over seeds, ±std band), one panel per
    setting (:func:`curves_figure`); written as ``out`` with suffix .png and .pdf. With
    per-client evaluation also ``out_clients`` (:func:`plot_client_distribution`)."""
    groups = group_runs(load_runs(dirs))
    fig = curves_figure(groups, metric_key)
    written = plot_files(out)
    written[0].parent.mkdir(parents=True, exist_ok=True)
    _save_figure(fig, written)
    written += plot_domains(groups, domain_plot_files(out))
    return written + plot_client_distribution(groups, client_plot_files(out))


def domain_plot_files(out: Path) -> list[Path]:
    """The per-domain curves' files ``plot --out OUT`` writes for inter-domain runs:
    ``OUT_domains.png`` and ``OUT_domains.pdf``."""
    return [p.with_name(p.stem + "_domains" + p.suffix) for p in plot_files(out)]


def plot_domains(groups: list[Group], paths: list[Path]) -> list[Path]:
    """Inter-domain runs (their records carry ``domain_accuracy``): each domain's test
    accuracy per round, one panel per domain (and setting) and one for their unweighted
    mean, one line per row, as :func:`curves_figure` draws the pooled one. Written to ``paths`` (returned); nothing
    (``[]``) when no run has per-domain records."""
    names: dict = {}
    for g in groups:
        for run in g.runs:
            for r in run.records:
                names.update(dict.fromkeys(domains_of(r.get("domain_accuracy"))))
    if not names:
        return []
    # each domain, then their unweighted mean per round (the records' "average": Avg)
    panels = [
        Group(
            g.key,
            g.runs,
            g.config,
            row=g.row,
            col=domain_heading(g.col, "Avg (domain mean)" if d == DOMAIN_AVERAGE else d),
            flat=g.flat,
            curve=d,
        )
        for d in [*names, DOMAIN_AVERAGE]
        for g in groups
    ]
    _save_figure(curves_figure(panels, "test_accuracy", "test accuracy per domain"), paths)
    return paths


def client_plot_files(out: Path) -> list[Path]:
    """The per-client distribution figure's files ``plot --out OUT`` writes when runs
    have per-client records: ``OUT_clients.png`` and ``OUT_clients.pdf``."""
    return [p.with_name(p.stem + "_clients" + p.suffix) for p in plot_files(out)]


def _save_figure(fig, paths: list[Path]) -> None:
    """Write ``fig`` to each of ``paths``, close it."""
    import matplotlib.pyplot as plt

    for p in paths:
        fig.savefig(p, dpi=120, bbox_inches="tight")
    plt.close(fig)


def last_client_accuracies(run: Run) -> list[float]:
    """The per-client accuracies (``client_accuracy``) of the run's last round that has
    them (per-client evaluation), as fractions; empty when it has none."""
    for r in reversed(run.records):
        per = r.get("client_accuracy")
        if isinstance(per, dict) and per:
            return [float(v) for v in per.values() if is_number(v)]
    return []


def plot_client_distribution(groups: list[Group], paths: list[Path]) -> list[Path]:
    """Per-client accuracy distribution (``evaluation.per_client``): one panel per
    setting, one box per row over the clients of its runs' last per-client evaluation
    (seeds pooled), each client a dot, the mean a triangle. Written to ``paths`` (returned);
    nothing (``[]``) when no run has per-client records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = {
        (g.row, g.col): [100 * a for run in g.runs for a in last_client_accuracies(run)]
        for g in groups
    }
    if not any(data.values()):
        return []
    cols = list(dict.fromkeys(g.col for g in groups))
    rows = list(dict.fromkeys(g.row for g in groups))
    ncol = min(len(cols), 3)
    nrow = math.ceil(len(cols) / ncol)
    fig, axes = plt.subplots(
        nrow, ncol, figsize=(max(5, 1.4 * len(rows) + 2) * ncol, 3.8 * nrow), squeeze=False
    )
    rng = np.random.default_rng(0)  # the dots' horizontal jitter only
    for ax, c in zip(axes.flat, cols):
        present = [r for r in rows if data.get((r, c))]
        values = [data[(r, c)] for r in present]
        if values:
            ax.boxplot(values, showfliers=False)
            for i, v in enumerate(values, 1):
                ax.scatter(i + rng.uniform(-0.15, 0.15, len(v)), v, s=8, alpha=0.5)
                ax.scatter([i], [float(np.mean(v))], marker="^", color="black", zorder=3)
            ax.set_xticks(range(1, len(present) + 1))
            ax.set_xticklabels([f"{r}\n(n={len(v)})" for r, v in zip(present, values)], fontsize=8)
        ax.set_title(c or "all runs", fontsize=10)
        ax.set_ylabel("per-client accuracy (%)")
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(cols) :]:
        ax.set_visible(False)
    fig.tight_layout()
    _save_figure(fig, paths)
    return list(paths)
