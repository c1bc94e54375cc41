"""FINCH speed: ``fedrcl_flwr.clustering.finch`` vs the reference package ``finch-clust``
(goal: ≥ 3x) on 5,000 x 512 synthetic features, with identical partitions (all levels, up
to relabelling). Prints the speed-up ratio as its last line.

    pip install finch-clust==0.2.1      # bench-only dependency (pyproject extra "bench")
    python benchmarks/bench_finch.py [--n 5000] [--dim 512] [--repeats 5] [--euclidean]

The reference is run with its defaults (``FINCH(X, distance=..., ensure_early_exit=True,
verbose=False)``, ``use_ann_above_samples=70000``): below 70,000 samples it computes exact
first neighbours with ``sklearn.metrics.pairwise_distances`` (pynndescent is only
imported, never used, at this size). Both sides run in this process on the same BLAS;
each time is the minimum over ``--repeats`` interleaved runs (the machine may be shared).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedrcl_flwr.clustering import canonical_labels, finch

canonical = canonical_labels


def features(n: int, dim: int, k: int = 20, seed: int = 0) -> np.ndarray:
    """ReLU'd Gaussian mixture (k components): embedding-like, non-negative, clustered."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim))
    z = centres[rng.integers(0, k, n)] + 1.5 * rng.normal(size=(n, dim))
    return np.maximum(z, 0).astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--euclidean", action="store_true")
    ap.add_argument("--no-early-exit", action="store_true")
    args = ap.parse_args()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "pynndescent not installed"
            from finch import FINCH
    except ImportError:
        print("finch-clust is not installed: pip install finch-clust==0.2.1", file=sys.stderr)
        return 2

    x = features(args.n, args.dim)
    distance = "euclidean" if args.euclidean else "cosine"
    ee = not args.no_early_exit

    def ours():
        return finch(x, distance=distance, ensure_early_exit=ee)

    def reference():
        with contextlib.redirect_stdout(io.StringIO()):
            c, num, _ = FINCH(x, distance=distance, ensure_early_exit=ee, verbose=False)
        return c, num

    p_ours, n_ours = ours()  # warm-up (BLAS threads, page cache)
    p_ref, n_ref = reference()
    if (
        list(n_ours) != list(n_ref)
        or p_ours.shape != np.shape(p_ref)
        or not np.array_equal(canonical(p_ours), canonical(p_ref))
    ):
        print(
            f"partitions differ: ours {list(n_ours)} vs finch-clust {list(n_ref)}", file=sys.stderr
        )
        return 1
    t_ours, t_ref = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        reference()
        t_ref.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ours()
        t_ours.append(time.perf_counter() - t0)
    print(
        f"data: {args.n} x {args.dim} ReLU'd Gaussian mixture, distance={distance}, "
        f"ensure_early_exit={ee}"
    )
    print(f"partitions identical up to relabelling: clusters per level {list(n_ours)}")
    print(
        f"finch-clust 0.2.1 (exact sklearn distances, no pynndescent): "
        f"min {min(t_ref):.3f}s  median {np.median(t_ref):.3f}s"
    )
    print(f"fedrcl_flwr.clustering.finch: min {min(t_ours):.3f}s  median {np.median(t_ours):.3f}s")
    print(f"finch speed-up vs finch-clust: {min(t_ref) / min(t_ours):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
