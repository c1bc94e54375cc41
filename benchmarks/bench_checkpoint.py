"""Cost of checkpointing (``output.checkpoint_every: 1``) per round.

For each setting the server is built exactly as a run builds it (``build_server``), the
strategy's state is filled by one aggregation (so momentum / Adam moments / FedACG buffer
exist), and the checkpoint the run writes every k rounds (global model, server-optimizer
state, EMA, RNG states, written to a temp file, fsynced, renamed) is saved ``--repeats``
times. It prints the median save time and file size, and the time relative to a round:
the median ``round_time_s`` of a short in-process run of the same experiment without
checkpoints. The last line is the largest of those overhead ratios.

    python benchmarks/bench_checkpoint.py [--repeats 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.app.server_app import build_server
from fedrcl_flwr.config import load_config
from fedrcl_flwr.run.checkpoint import CHECKPOINT_FILE, save_checkpoint
from fedrcl_flwr.run.results import read_metrics

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {
    "quickstart cnn5 + fedacg": (
        ROOT / "experiments" / "quickstart.yaml",
        ["server.strategy=fedacg"],
    ),
    "fedrcl resnet18-gn + fedadam": (
        ROOT / "experiments" / "quickstart.yaml",
        ["server.strategy=fedadam", "model.name=resnet18_gn", "dataset.synthetic.image_size=32"],
    ),
}


class _Proxy:  # what aggregate_fit needs from a ClientProxy
    cid = "bench"


def _fill_state(strategy) -> None:
    """One aggregation with a perturbed client update, so optimizer buffers are populated."""
    weights = [
        w + np.float32(0.01) if np.issubdtype(w.dtype, np.floating) else w for w in strategy.weights
    ]
    res = FitRes(
        status=Status(Code.OK, ""),
        parameters=ndarrays_to_parameters(weights),
        num_examples=10,
        metrics={"partition_id": 0},
    )
    strategy.aggregate_fit(1, [(_Proxy(), res)], [])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    ratios = []
    for name, (exp, sets) in SETTINGS.items():
        sets = sets + [
            "output.checkpoint_every=0",
            f"federation.rounds={args.rounds}",
            "client.device=cpu",
        ]
        cfg = load_config(exp, sets)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            strategy, _ = build_server(cfg, out / "srv")
            _fill_state(strategy)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                save_checkpoint(
                    out / "srv",
                    {"round": 1, "strategy": strategy.state_dict(), "ema": 0.5, "wall_time_s": 1.0},
                )
                times.append(time.perf_counter() - t0)
            size = (out / "srv" / CHECKPOINT_FILE).stat().st_size
            run_inprocess(cfg, out / "run")
            round_s = statistics.median(r["round_time_s"] for r in read_metrics(out / "run"))
        save_s = statistics.median(times)
        ratios.append(save_s / round_s)
        print(
            f"{name}: checkpoint {size / 2**20:.1f} MiB saved in {1000 * save_s:.0f} ms "
            f"(median of {args.repeats}); round {round_s:.2f}s; "
            f"overhead per round at checkpoint_every=1: {100 * save_s / round_s:.1f}%"
        )
    print(f"checkpoint overhead per round (worst setting): {max(ratios):.3f}x of a round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
