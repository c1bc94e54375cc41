"""FedCCL's balanced vs imbalanced inter-domain settings on the embedded synthetic data:
fedccl / fedavg / fedproto x seeds, driven in process (fedrcl_flwr.app.inprocess, the
real strategies and clients without Flower's runtime), on experiments/fedccl/
synthetic_interdomain_cpu.yaml. Prints the last5 test accuracy (mean +- std over seeds)
per split and method, plus per-domain last5 and the clients' sizes.

    python benchmarks/interdomain_synthetic.py                      # the whole grid
    python benchmarks/interdomain_synthetic.py --split balanced     # one split (run two
    python benchmarks/interdomain_synthetic.py --split imbalanced   #  in parallel)
    python benchmarks/interdomain_synthetic.py --table              # table from runs

Each run uses one torch thread (a shared 2-core machine is much slower with more).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

YAML = ROOT / "experiments" / "fedccl" / "synthetic_interdomain_cpu.yaml"
SPLITS = {
    "balanced": ["partition.balanced=true"],
    "imbalanced": ["partition.balanced=false", "partition.alpha=0.5"],
}
METHODS = ("fedccl", "fedavg", "fedproto")
SEEDS = (0, 1, 2)


def run(split: str, out: Path) -> None:
    import torch

    torch.set_num_threads(1)
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import load_config
    from fedrcl_flwr.run.runtime import client_partitions

    for method in METHODS:
        for seed in SEEDS:
            d = out / f"{split}_{method}_s{seed}"
            if (d / "summary.json").exists():
                continue
            cfg = load_config(
                YAML, SPLITS[split] + [f"client.method={method}", f"seed={seed}", f"output.dir={d}"]
            )
            t0 = time.time()
            run_inprocess(cfg, d)
            sizes = [len(p) for p in client_partitions(cfg)]
            s = json.loads((d / "summary.json").read_text())
            s["client_sizes"] = sizes
            s["run_s"] = round(time.time() - t0, 1)
            (d / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
            print(
                f"{split} {method} seed {seed}: last5 {100 * s['last5']:.2f}% sizes "
                f"{sizes} ({s['run_s']} s)",
                flush=True,
            )


def table(out: Path) -> str:
    lines = [
        "| split | method | last5 % (mean +- std) | per domain last5 % | client sizes (seed 0) |",
        "|---|---|---|---|---|",
    ]
    for split in SPLITS:
        for method in METHODS:
            ss = [
                json.loads((out / f"{split}_{method}_s{s}" / "summary.json").read_text())
                for s in SEEDS
                if (out / f"{split}_{method}_s{s}" / "summary.json").exists()
            ]
            if not ss:
                continue
            v = 100 * np.array([s["last5"] for s in ss])
            doms = sorted(ss[0].get("last5_per_domain", {}))
            per = ", ".join(
                f"{d} {100 * np.mean([s['last5_per_domain'][d] for s in ss]):.1f}" for d in doms
            )
            sd = v.std(ddof=1) if len(v) > 1 else 0.0
            lines.append(
                f"| {split} | {method} | {v.mean():.2f} +- {sd:.2f} (n={len(v)}) | "
                f"{per} | {ss[0].get('client_sizes')} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=[*SPLITS, "both"], default="both")
    ap.add_argument("--out", default="runs/interdomain_synthetic")
    ap.add_argument("--table", action="store_true", help="only print the table")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.table:
        for split in SPLITS if args.split == "both" else [args.split]:
            run(split, out)
    print(table(out))


if __name__ == "__main__":
    main()
