"""Cost of FedRCL's relaxed contrastive loss per local step (goal: ratio <= 1.10).

One local SGD step (``fedrcl_flwr.training.train_local``: forward, loss, backward, clip 10,
SGD lr 0.1 / wd 1e-3) of ResNet-18-GN on a batch of 50 random 32x32x3 images on the CPU
with 2 threads:

* FedAvg: cross-entropy only;
* FedRCL: cross-entropy + RCL (``variant="official"``, default hyper-parameters) over
  the 5 feature levels (the model is asked for its pooled taps).

Steps of the two methods are interleaved (A, B, A, B, ...) after a warm-up so that a
changing machine load hits both alike; the median step time of each is reported, plus the
isolated forward+backward time of the loss itself on the 5 pooled taps (with 2 threads and
with 1: on a shared machine each of its ~100 tiny ops can stall waiting for the second
thread). The last line is the median of the per-pair ratios (each FedRCL step against
the FedAvg step run next to it), which is robust to machine load that drifts during the
run; the ratio of the medians and of the minima are printed above it.

    python benchmarks/bench_fedrcl_step.py [--steps 7] [--warmup 1] [--batch 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from fedrcl_flwr.losses.rcl import rcl_loss
from fedrcl_flwr.models.resnet import ResNet18GN
from fedrcl_flwr.training import (
    LocalTrainSettings,
    LossTerm,
    cross_entropy_term,
    train_local,
)


def _terms(method: str, levels: tuple) -> list:
    if method == "fedavg":
        return [cross_entropy_term()]
    rcl = LossTerm(
        "rcl", lambda b: rcl_loss([b.feats[lv] for lv in levels], b.y), needs_features=True
    )
    return [cross_entropy_term(), rcl]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=7, help="timed steps per method")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per method")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, args.classes, (args.batch,))
    settings = LocalTrainSettings(lr=0.1, momentum=0.0, weight_decay=1e-3, grad_clip=10.0)
    device = torch.device("cpu")

    models, terms = {}, {}
    for method in ("fedavg", "fedrcl"):
        torch.manual_seed(1)
        models[method] = ResNet18GN(num_classes=args.classes)
        terms[method] = _terms(method, models[method].levels)

    def step(method: str) -> float:
        t0 = time.perf_counter()
        train_local(models[method], lambda epoch: [(x, y)], terms[method], settings, device)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {"fedavg": [], "fedrcl": []}
    for i in range(args.warmup + args.steps):
        order = ("fedavg", "fedrcl") if i % 2 == 0 else ("fedrcl", "fedavg")
        for method in order:
            dt = step(method)
            if i >= args.warmup:
                times[method].append(dt)

    # the loss alone: forward + backward on the 5 pooled taps of one batch
    with torch.no_grad():
        _, feats = models["fedrcl"](x, return_features=True)
    taps = [feats[lv].clone().requires_grad_() for lv in models["fedrcl"].levels]
    loss_ms = {}
    for threads in (2, 1):  # tiny ops: with 2 threads a busy second core stalls each op
        torch.set_num_threads(threads)
        ts = []
        for i in range(60):
            t0 = time.perf_counter()
            rcl_loss(taps, y).backward()
            if i >= 10:
                ts.append(time.perf_counter() - t0)
        loss_ms[threads] = statistics.median(ts) * 1e3
    torch.set_num_threads(2)

    med = {m: statistics.median(v) for m, v in times.items()}
    # each FedRCL step ran right next to a FedAvg step: the median of these paired ratios
    # is robust to load that drifts during the run (other processes on the machine)
    paired = statistics.median(r / a for r, a in zip(times["fedrcl"], times["fedavg"]))
    print(
        f"batch {args.batch}, 32x32x3, ResNet-18-GN, CPU, {torch.get_num_threads()} threads, "
        f"{args.steps} timed steps each after {args.warmup} warm-up"
    )
    for m in ("fedavg", "fedrcl"):
        print(
            f"{m:>7}: median step {med[m] * 1e3:8.1f} ms  "
            f"(min {min(times[m]) * 1e3:.1f}, max {max(times[m]) * 1e3:.1f})"
        )
    print(
        f"rcl_loss alone (5 levels, fwd+bwd): median {loss_ms[2]:.2f} ms with 2 threads, "
        f"{loss_ms[1]:.2f} ms with 1 thread"
    )
    print(
        f"ratio of median step times: {med['fedrcl'] / med['fedavg']:.2f}x, "
        f"of min step times: {min(times['fedrcl']) / min(times['fedavg']):.2f}x"
    )
    print(f"fedrcl vs fedavg step time ratio: {paired:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
