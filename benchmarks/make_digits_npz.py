"""Write scikit-learn's bundled handwritten digits as an ``npz`` dataset (no download).

The 1,797 8x8 grey-scale digits of ``sklearn.datasets.load_digits`` (the UCI optical
digits test set; pixel values 0..16) become ``uint8`` images scaled to 0..255, split per
class into a training and a test set (a seeded, stratified ``--test-fraction``), in the
layout ``dataset.name: npz`` reads (``x_train, y_train, x_test, y_test``). Data nobody on
this project wrote, for a small study that runs on a laptop CPU:

    pip install scikit-learn          # or: pip install -e ".[study]"
    python benchmarks/make_digits_npz.py                      # -> runs/data/digits.npz
    fedrcl-flwr sweep experiments/sweeps/digits_study.yaml --jobs 2 --out runs/digits_study
    fedrcl-flwr report runs/digits_study --vs fedavg
    fedrcl-flwr plot runs/digits_study --out runs/digits_study/curves
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def digits_arrays(test_fraction: float = 0.2, seed: int = 0) -> dict:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.rint(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)  # (N, 8, 8)
    y = d.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), bool)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        test[rng.choice(idx, int(round(test_fraction * len(idx))), replace=False)] = True
    return {"x_train": x[~test], "y_train": y[~test], "x_test": x[test], "y_test": y[test]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/data/digits.npz")
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    arrays = digits_arrays(args.test_fraction, args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    print(
        f"{out}: {len(arrays['y_train'])} training and {len(arrays['y_test'])} test "
        f"images, 8x8, 10 classes"
    )


if __name__ == "__main__":
    main()
