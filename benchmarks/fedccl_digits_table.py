"""The FedCCL ablation's table on the papers' metric: per-domain accuracy and their
unweighted mean ("Avg", FedCCL Tables 1-2 and FPL's tables), mean ± sample std over
seeds, and paired 95 % intervals over seeds on the domain mean.

    python benchmarks/fedccl_digits_table.py runs/fedccl_ablation_digits [--csv FILE]

Reads every run directory under the sweep's output (``config.yaml``: ``label``, ``seed``;
``summary.json``: ``last5_per_domain``, the mean of the last five evaluated rounds per
domain test set). A run without ``summary.json`` (unfinished) is left out and counted.
``last5_per_domain`` is checked against ``metrics.jsonl`` (its last five
``domain_accuracy`` records). Pairs: every row − ``fedavg``, ``fpl`` − every FedCCL row
(``fedccl*``); a pair is formed only for the seeds both rows finished; the interval is
mean ± t(0.975, n−1)·std/√n of the per-seed differences (points).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

import numpy as np

from fedrcl_flwr.config.loading import read_yaml  # the hardened reader


def load_runs(root: Path) -> tuple[dict, int]:
    """{label: {seed: {domain: acc, ..., "average": acc}}} and the unfinished count."""
    rows: dict = {}
    unfinished = 0
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")):
        cfg_file, summary_file = d / "config.yaml", d / "summary.json"
        if not cfg_file.is_file():
            continue
        if not summary_file.is_file():
            unfinished += 1
            continue
        cfg = read_yaml(cfg_file)
        summary = json.loads(summary_file.read_text())
        per = summary.get("last5_per_domain")
        if not per:
            raise SystemExit(f"{summary_file}: no last5_per_domain (not an inter-domain run)")
        check_against_records(d / "metrics.jsonl", per)
        label = cfg.get("label") or cfg["client"]["method"]
        rows.setdefault(label, {})[int(cfg["seed"])] = per
    return rows, unfinished


def check_against_records(path: Path, per: dict) -> None:
    """``last5_per_domain`` must be the mean of the last five ``domain_accuracy``
    records of ``metrics.jsonl`` (and ``average`` the mean over the domains)."""
    recs = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "domain_accuracy" in r:
            recs.append(r["domain_accuracy"])
    last = recs[-5:]
    for k, v in per.items():
        got = float(np.mean([r[k] for r in last]))
        if abs(got - v) > 1e-9:
            raise SystemExit(f"{path}: last five {k} average {got} != summary {v}")
    domains = [k for k in per if k != "average"]
    if abs(np.mean([per[k] for k in domains]) - per["average"]) > 1e-9:
        raise SystemExit(f"{path}: 'average' is not the unweighted domain mean")


def t_interval(diffs: list[float]) -> tuple[float, float, float, float]:
    """(mean, sample std, low, high) of a 95 % two-sided Student-t interval."""
    from scipy.stats import t

    a = np.asarray(diffs, float)
    m = float(a.mean())
    if len(a) < 2:
        return m, float("nan"), float("nan"), float("nan")
    s = float(a.std(ddof=1))
    h = float(t.ppf(0.975, len(a) - 1)) * s / math.sqrt(len(a))
    return m, s, m - h, m + h


def ordered_labels(rows: dict) -> list[str]:
    first = [x for x in ("fedavg", "fpl", "fedccl") if x in rows]
    return first + sorted(x for x in rows if x not in first)


def table(rows: dict) -> tuple[list[str], list[list[str]]]:
    labels = ordered_labels(rows)
    domains = [k for k in next(iter(next(iter(rows.values())).values())) if k != "average"]
    head = ["row", "n", *domains, "Avg"]
    out = []
    for lab in labels:
        seeds = rows[lab]
        cells = [lab, str(len(seeds))]
        for k in [*domains, "average"]:
            v = 100 * np.array([seeds[s][k] for s in sorted(seeds)])
            sd = f" ± {v.std(ddof=1):.2f}" if len(v) > 1 else ""
            cells.append(f"{v.mean():.2f}{sd}")
        out.append(cells)
    return head, out


def pairs(rows: dict) -> list[tuple[str, str]]:
    labels = ordered_labels(rows)
    out = [(x, "fedavg") for x in labels if x != "fedavg" and "fedavg" in rows]
    if "fpl" in rows:
        out += [("fpl", x) for x in labels if x.startswith("fedccl")]
    return out


def paired(rows: dict) -> list[list[str]]:
    out = []
    for a, b in pairs(rows):
        seeds = sorted(set(rows[a]) & set(rows[b]))
        if not seeds:
            continue
        d = [100 * (rows[a][s]["average"] - rows[b][s]["average"]) for s in seeds]
        m, sd, lo, hi = t_interval(d)
        out.append(
            [
                f"{a} − {b}",
                str(len(seeds)),
                f"{m:+.2f} ± {sd:.2f}",
                f"[{lo:+.2f}, {hi:+.2f}]",
                " ".join(f"{x:+.2f}" for x in d),
            ]
        )
    return out


def markdown(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="the sweep's --out directory")
    ap.add_argument("--csv", type=Path, help="also write the paired comparisons as CSV")
    args = ap.parse_args()
    if not args.root.is_dir():
        sys.exit(f"{args.root}: not a directory")
    rows, unfinished = load_runs(args.root)
    if not rows:
        sys.exit(f"{args.root}: no finished run")
    head, body = table(rows)
    print("last5 accuracy (%) per domain test set and their unweighted mean (Avg),")
    print("mean ± sample std over seeds, n seeds\n")
    print(markdown(head, body))
    print("\npaired over seeds, domain mean (points): mean ± std, 95 % t-interval, per seed\n")
    comp = paired(rows)
    print(markdown(["pair", "n", "mean ± std", "95 % CI", "per seed"], comp))
    if unfinished:
        print(f"\n{unfinished} run(s) unfinished, left out")
    if args.csv:
        with args.csv.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["pair", "n", "mean_std", "ci95", "per_seed"])
            w.writerows(comp)


if __name__ == "__main__":
    main()
