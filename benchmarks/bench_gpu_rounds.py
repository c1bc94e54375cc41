"""Rounds per hour of the FedRCL CIFAR-100 setting on one GPU, three ways.

The setting (FedRCL Table 1, ``experiments/fedrcl/table1_cifar100_a0.3.yaml``): ResNet-18
with GroupNorm (``resnet18_gn``), 100 clients, 5 per round, 5 local epochs x 10
iterations (batch 50 from 500 samples per client), method ``fedrcl``, rotation + crop +
flip augmentation, centralised evaluation every round; data: CIFAR-sized synthetic images
(50,000 x 32x32x3 for training, 10,000 for testing, 100 classes), so no download.

Modes, each in its own fresh process, timed as a user would see them:

* ``bare``: the project's sequential in-process runner
  (``fedrcl_flwr.app.inprocess.run_inprocess``): the same strategy and clients, one
  after the other, no Flower runtime, no Ray;
* ``1 actor``: ``fedrcl-flwr run`` with ``simulation.num_gpus=1`` (Ray runs one virtual
  client at a time on the GPU);
* ``5 actors``: ``fedrcl-flwr run`` with ``simulation.num_gpus=0.2`` (five virtual
  clients share the GPU: a round's five clients train at once).

Rounds per hour come from the median round time of rounds 2..R (the steady state; round
one pays CUDA / cuDNN warm-up and, under Flower, the workers' start); the whole-process
wall time and the seconds outside rounds (start-up, teardown) are printed beside them.

    python benchmarks/bench_gpu_rounds.py [--rounds 6] [--amp off|bf16|fp16]
    python benchmarks/bench_gpu_rounds.py --tiny     # CPU, seconds: keeps the script alive

``--tiny`` runs on the CPU in a CI-sized setting (a small synthetic dataset, CNN-5,
4 clients, 2 per round, 2 local steps, 2 rounds), and the actor modes become one actor
vs two actors of one CPU each (``simulation.init_num_cpus`` 1 vs 2). Its numbers say the
script works, not how fast a GPU is. Without ``--tiny`` a CUDA GPU is required.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXPERIMENT = ROOT / "experiments" / "fedrcl" / "table1_cifar100_a0.3.yaml"

# the FedRCL CIFAR-100 setting on CIFAR-sized synthetic data (no download)
FULL = [
    "dataset.name=synthetic",
    "dataset.rotation=10",
    "dataset.crop_pad=4",
    "dataset.synthetic={num_train: 50000, num_test: 10000, num_classes: 100, image_size: 32, "
    "channels: 3}",
    "evaluation.report_metric=final",
    "evaluation.target_rounds=[]",
    "output.checkpoint_every=0",
    "reference=null",
    "client.device=cuda",
]
# CI-sized: seconds on a CPU
TINY = [
    "dataset.name=synthetic",
    "dataset.rotation=10",
    "dataset.synthetic={num_train: 200, num_test: 100, num_classes: 10, image_size: 16, "
    "channels: 3}",
    "model.name=cnn5",
    "model.init=model",
    "federation.num_clients=4",
    "federation.participation=null",
    "federation.clients_per_round=2",
    "client.local_epochs=1",
    "client.iterations_per_epoch=2",
    "evaluation.report_metric=final",
    "evaluation.target_rounds=[]",
    "output.checkpoint_every=0",
    "reference=null",
    "client.device=cpu",
]


def modes(tiny: bool) -> list[tuple[str, list[str] | None]]:
    """``(label, simulation --set items)``; ``None`` = the sequential in-process runner."""
    if tiny:
        # the bare loop and one Flower mode: the script's whole path in CI time
        return [
            ("bare sequential loop (in-process)", None),
            (
                "flower, 2 actors (1 CPU each)",
                ["simulation.num_cpus=1", "simulation.num_gpus=0", "simulation.init_num_cpus=2"],
            ),
        ]
    return [
        ("bare sequential loop (in-process)", None),
        (
            "flower, 1 actor per GPU (num_gpus=1)",
            ["simulation.num_cpus=1", "simulation.num_gpus=1"],
        ),
        ("flower, 5 actors at 0.2 GPU", ["simulation.num_cpus=1", "simulation.num_gpus=0.2"]),
    ]


def write_experiment(sets: list[str], path: Path) -> None:
    """The resolved experiment (checked now: a bad setting fails before any run)."""
    from fedrcl_flwr.config import dump_config, load_config

    dump_config(load_config(EXPERIMENT, sets), path)


def run_mode(exp: Path, out: Path, sim: list[str] | None) -> tuple[int, float, str]:
    """One mode in a fresh process: (exit code, wall seconds, output tail)."""
    if sim is None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--run-inprocess", str(exp), str(out)]
    else:
        cmd = [sys.executable, "-m", "fedrcl_flwr.cli", "run", str(exp), "--out", str(out)]
        for s in sim:
            cmd += ["--set", s]
    t0 = time.time()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - t0
    return res.returncode, wall, (res.stdout + res.stderr)[-3000:]


def round_times(out: Path) -> list[float]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [
        json.loads(line)["round_time_s"] for line in path.read_text().splitlines() if line.strip()
    ]


def inprocess_main(exp: str, out: str) -> int:
    """``--run-inprocess``: the sequential runner, as a user's own loop would run it."""
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import load_config

    run_inprocess(load_config(exp), Path(out))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU, CI-sized setting")
    ap.add_argument(
        "--rounds", type=int, default=None, help="rounds per mode (default: 6; --tiny: 2)"
    )
    ap.add_argument(
        "--amp", choices=("off", "bf16", "fp16"), default="off", help="client.amp for the GPU runs"
    )
    ap.add_argument(
        "--channels-last",
        choices=("auto", "true", "false"),
        default="auto",
        help="client.channels_last for the GPU runs",
    )
    ap.add_argument(
        "--run-inprocess", nargs=2, metavar=("EXPERIMENT", "OUT"), help=argparse.SUPPRESS
    )
    args = ap.parse_args(argv)
    if args.run_inprocess:
        return inprocess_main(*args.run_inprocess)

    import torch

    rounds = args.rounds or (2 if args.tiny else 6)
    if rounds < 2:
        ap.error("--rounds must be >= 2 (round one is not the steady state)")
    if args.tiny:
        sets = [*TINY, f"federation.rounds={rounds}"]
        device = "CPU (--tiny)"
    else:
        if not torch.cuda.is_available():
            print(
                "bench_gpu_rounds: no CUDA GPU is visible on this machine; the GPU "
                "benchmark needs one (run with --tiny for the CPU-sized check)",
                file=sys.stderr,
            )
            return 2
        sets = [
            *FULL,
            f"federation.rounds={rounds}",
            f"client.amp={args.amp}",
            f"client.channels_last={args.channels_last}",
        ]
        device = (
            f"{torch.cuda.get_device_name(0)} (amp {args.amp}, channels_last "
            f"{args.channels_last}), torch {torch.__version__}"
        )

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-rounds-") as tmp:
        exp = Path(tmp) / "experiment.yaml"
        write_experiment(sets, exp)
        for i, (label, sim) in enumerate(modes(args.tiny)):
            out = Path(tmp) / f"run{i}"
            rc, wall, tail = run_mode(exp, out, sim)
            times = round_times(out)
            if rc != 0 or len(times) != rounds:
                print(
                    f"{label}: failed (exit {rc}, {len(times)}/{rounds} rounds)\n{tail}",
                    file=sys.stderr,
                )
                return 1
            steady = statistics.median(times[1:])
            rows.append((label, wall, times[0], steady, 3600.0 / steady, wall - sum(times)))

    print(f"FedRCL CIFAR-100 setting, {rounds} rounds per mode, on {device}")
    head = (
        f"{'mode':38s} {'wall s':>8s} {'round 1 s':>10s} {'round s':>8s} "
        f"{'rounds/h':>9s} {'outside s':>10s} {'vs bare':>8s}"
    )
    print(head)
    print("-" * len(head))
    bare = rows[0][4]
    for label, wall, first, steady, per_hour, outside in rows:
        print(
            f"{label:38s} {wall:8.1f} {first:10.2f} {steady:8.3f} {per_hour:9.0f} "
            f"{outside:10.1f} {per_hour / bare:7.2f}x"
        )
    print(
        "round s = median of rounds 2..R; rounds/h = 3600 / round s; outside s = wall "
        "time not spent in rounds (start-up, teardown)"
    )
    # the last mode against the one before it (GPU: 5 actors vs 1 actor; --tiny: vs bare)
    print(f"ratio {rows[-1][0]} / {rows[-2][0]}: {rows[-1][4] / rows[-2][4]:.2f}x rounds per hour")
    return 0


if __name__ == "__main__":
    sys.exit(main())
