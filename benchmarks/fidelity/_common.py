"""Shared pieces of the side-by-side harnesses (``benchmarks/fidelity/*.py``): scikit-learn's
digits written as CIFAR-10 batches, the project's side run in-process, one of our models
in an authors' model interface, and the accuracy table with Welch's 95 % interval.

Nothing of the authors' code is here: the harnesses take a path to a checkout of it.
"""

from __future__ import annotations

import argparse
import math
import pickle
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CIFAR_MEAN = [0.4914, 0.4822, 0.4465]  # FedUV's CIFAR-10 Normalize
CIFAR_STD = [0.247, 0.243, 0.261]


def write_digits_as_cifar10(root: Path, test_fraction: float = 0.2, seed: int = 0) -> dict:
    """scikit-learn's 1,797 digits (``benchmarks/make_digits_npz.py``: 8x8 scaled to 0..255,
    a seeded stratified test split), each pixel repeated 4x4 and over three channels: 32x32
    RGB images in ``cifar-10-batches-py`` as distributed (five training pickles,
    ``test_batch``, ``batches.meta``). Returns the arrays."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from make_digits_npz import digits_arrays

    a = digits_arrays(test_fraction, seed)
    d = Path(root) / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)

    def rows(x):  # (N, 8, 8) -> (N, 3072) in CIFAR's channel-major layout
        big = np.kron(x, np.ones((4, 4), np.uint8))  # (N, 32, 32)
        return np.repeat(big[:, None], 3, axis=1).reshape(len(x), 3072)

    xtr, xte = rows(a["x_train"]), rows(a["x_test"])
    for b, chunk in enumerate(np.array_split(np.arange(len(xtr)), 5), start=1):
        with open(d / f"data_batch_{b}", "wb") as f:
            labels = [int(v) for v in a["y_train"][chunk]]
            pickle.dump(
                {
                    "batch_label": f"training batch {b} of 5",
                    "labels": labels,
                    "data": xtr[chunk],
                    "filenames": [f"{i}.png" for i in chunk],
                },
                f,
            )
    with open(d / "test_batch", "wb") as f:
        pickle.dump(
            {
                "batch_label": "testing batch 1 of 1",
                "labels": [int(v) for v in a["y_test"]],
                "data": xte,
                "filenames": [f"t{i}.png" for i in range(len(xte))],
            },
            f,
        )
    with open(d / "batches.meta", "wb") as f:
        pickle.dump(
            {"label_names": [str(i) for i in range(10)], "num_cases_per_batch": 0, "num_vis": 3072},
            f,
        )
    return a


def patch_torchvision_cifar_integrity() -> None:
    """The authors' loaders call torchvision's ``CIFAR10(download=True)``: with our own
    files the official MD5s fail and it would try the network. Accept the files as they
    are (the shape checks of the decoder stay)."""
    from torchvision.datasets import CIFAR10, CIFAR100

    for cls in (CIFAR10, CIFAR100):
        cls.train_list = [[name, None] for name, _ in cls.train_list]
        cls.test_list = [[name, None] for name, _ in cls.test_list]
        cls.meta = {**cls.meta, "md5": None}


def add_their_side_arguments(ap: argparse.ArgumentParser) -> None:
    """The hidden flags with which a harness starts itself again as the child process
    that runs the authors' code (their side): the data, the algorithm, the seed and where
    its log goes."""
    ap.add_argument("--their-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--alg", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--logdir", help=argparse.SUPPRESS)


def run_ours(exp: dict, out: Path) -> list[float]:
    """Our side, in-process (``fedrcl_flwr.app.inprocess.run_inprocess``: the same
    strategy and clients as a Flower run, sequentially). Returns the per-round test
    accuracy (%)."""
    import json

    import yaml

    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config.loading import load_config

    out.mkdir(parents=True, exist_ok=True)
    path = out / "experiment.yaml"
    path.write_text(yaml.safe_dump(exp))
    run_inprocess(load_config(path), out / "run")
    accs = []
    for line in (out / "run" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("test_accuracy") is not None:
            accs.append(100.0 * float(rec["test_accuracy"]))
    return accs


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(a) − mean(b) with Welch's 95 % interval (scipy's t quantile)."""
    from scipy import stats

    ma, mb = float(np.mean(a)), float(np.mean(b))
    va = float(np.var(a, ddof=1)) if len(a) > 1 else 0.0
    vb = float(np.var(b, ddof=1)) if len(b) > 1 else 0.0
    se2 = va / len(a) + vb / len(b)
    if se2 == 0:
        return ma - mb, ma - mb, ma - mb
    df = se2**2 / (
        ((va / len(a)) ** 2 / max(len(a) - 1, 1)) + ((vb / len(b)) ** 2 / max(len(b) - 1, 1))
    )
    t = float(stats.t.ppf(0.975, df))
    h = t * math.sqrt(se2)
    return ma - mb, ma - mb - h, ma - mb + h


def table(rows: dict, label: str) -> str:
    """``rows[method] = {"ours": [acc per seed], "theirs": [...]}`` as Markdown."""
    out = [
        f"| method | ours ({label}) | theirs | difference [Welch 95 %] |",
        "|---|---|---|---|",
    ]

    def ms(v):
        return f"{np.mean(v):.1f} ± {np.std(v, ddof=1):.1f}" if len(v) > 1 else f"{v[0]:.1f}"

    for m, r in rows.items():
        d, lo, hi = welch(r["ours"], r["theirs"])
        seeds = (
            ", ".join(f"{x:.1f}" for x in r["ours"])
            + " / "
            + ", ".join(f"{x:.1f}" for x in r["theirs"])
        )
        out.append(
            f"| {m} | {ms(r['ours'])} | {ms(r['theirs'])} | {d:+.1f} [{lo:+.1f}, {hi:+.1f}] "
            f"(per seed {seeds}) |"
        )
    return "\n".join(out)


def side_by_side(a, run_theirs, run_ours, data: Path, work: Path, title: str) -> None:
    """Run every method of ``a.methods`` and seed of ``a.seeds`` on their side and ours
    (``run_theirs`` / ``run_ours(a, method, seed, data, work)`` return the accuracy curve),
    print a line per run and the final-accuracy table, and keep the curves in
    ``work/curves.json``."""
    import json
    import time

    rows: dict = {}
    curves: dict = {}
    for alg in a.methods:
        rows[alg] = {"ours": [], "theirs": []}
        for seed in a.seeds:
            for side, fn in (("theirs", run_theirs), ("ours", run_ours)):
                t0 = time.time()
                accs = fn(a, alg, seed, data, work)
                rows[alg][side].append(accs[-1])
                curves[f"{side}/{alg}/{seed}"] = accs
                print(
                    f"{side:6s} {alg:7s} seed {seed}: round {len(accs)} acc {accs[-1]:.2f} "
                    f"({time.time() - t0:.0f} s)",
                    flush=True,
                )
    (work / "curves.json").write_text(json.dumps(curves, indent=1))
    print(f"\n{title} side by side, digits as CIFAR-10, {a.rounds} rounds, final test accuracy (%)")
    print(table(rows, "project"))
    print(f"(curves: {work / 'curves.json'})")
