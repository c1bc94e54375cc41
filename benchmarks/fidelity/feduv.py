"""FedUV side by side: the project against the authors' code (sonhamin/FedUV), same files,
same protocol, same split.

    git clone https://github.com/sonhamin/FedUV /path/FedUV      # never vendored here
    python benchmarks/fidelity/feduv.py --authors-code /path/FedUV --seeds 0 1 \\
        --methods fedavg feduv --rounds 5 --out runs/fidelity/feduv

Data: scikit-learn's digits rendered as CIFAR-10 batches (``_common.write_digits_as_cifar10``;
1,437 training and 360 test images, 32x32), read by *their* ``load_cifar10_data`` /
``get_dataloader`` (torchvision's ``CIFAR10``; their CIFAR-10 pipeline: no augmentation,
``Normalize((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261))``) and by ours
(``dataset.name: cifar10``, ``augment: false``, the same constants).

Protocol (both sides): 10 clients, all every round, their ``partition_data`` ('noniid',
α = ``--alpha``; ours ``partition.generator: feduv``: the same index lists), SGD momentum
0.9, weight decay 1e-5, lr ``--lr`` annealed by their cosine over the rounds (ours
``client.lr_schedule: cosine``), ``--epochs`` local epochs of batch ``--batch-size``, no
clipping, FedAvg weighted by client size; FedUV: CE + 2.5 std + 0.5 uniformity on the
projector output (ours ``univarfl`` with ``variant: feduv, lam: 2.5, mu: 0.5``); FedAvg:
CE. Model: the project's ``cnn5`` + 256-wide projector on both sides (theirs through a
class with their ``SimpleCNN`` interface, ``forward -> (0, projector output, logits, 0,
0)``), so the comparison is of the federated code, not of two architectures. The metric:
the global model's test accuracy after the last round (their log's ``Global Model Test
accuracy``; ours ``metrics.jsonl``).

Shims on their side (no change to their files; applied in the child process before their
``train_fl.py`` runs with its own argparse): ``nn.Module.cuda`` returns the module (their
``compute_accuracy`` calls ``model.cuda()`` even with ``--device cpu``); ``DataLoader``
with ``num_workers=0`` (no ``persistent_workers`` / ``pin_memory``; their 8 workers per
loader x 22 loaders on a 2-core machine); torchvision's CIFAR MD5 check accepts our files;
``nets.models.SimpleCNN`` is the model above. Their ``drop_last=True`` is kept, and ours
drops the last incomplete batch too (``client.drop_last: true``).
"""

from __future__ import annotations

import argparse
import re
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

ACC = re.compile(r">> Global Model Test accuracy: ([0-9.]+)")


def our_model_in_their_interface(model_name: str):
    import torch.nn as nn

    from fedrcl_flwr.models import build_model

    class OurModel(nn.Module):
        """``SimpleCNN(out_dim, n_classes, width)``'s interface around our model."""

        def __init__(self, output_dim=256, n_classes=10, width=1):
            super().__init__()
            self.m = build_model(
                model_name,
                num_classes=n_classes,
                in_channels=3,
                image_size=32,
                params={"projector": output_dim},
            )

        def forward(self, x):
            logits, feats = self.m(x, return_features=True)
            return 0, feats["penultimate"], logits, 0, 0

    return OurModel


def their_side(a) -> None:
    """In the child: shims, then their ``train_fl.py`` as ``__main__``."""
    import torch
    import torch.utils.data as tud

    torch.nn.Module.cuda = lambda self, *args, **kw: self  # type: ignore[method-assign]
    base = tud.DataLoader

    class CPULoader(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kw):
            kw.update(num_workers=0, persistent_workers=False, pin_memory=False)
            kw.pop("worker_init_fn", None)
            super().__init__(*args, **kw)

    tud.DataLoader = CPULoader  # type: ignore[misc]
    C.patch_torchvision_cifar_integrity()
    code = str(Path(a.authors_code).resolve())
    sys.path.insert(0, code)
    import nets.models  # their module

    nets.models.SimpleCNN = our_model_in_their_interface(a.model)
    torch.set_num_threads(1)
    sys.argv = [
        "train_fl.py",
        "--dataset", "cifar10", "--datadir", a.data, "--partition", "noniid",
        "--alpha", str(a.alpha), "--n_parties", str(a.clients), "--sample_fraction", "1.0",
        "--comm_round", str(a.rounds), "--epochs", str(a.epochs),
        "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--alg", a.alg,
        "--model", "simple-cnn", "--out_dim", "256", "--seed", str(a.seed),
        "--device", "cpu", "--logdir", a.logdir, "--optimizer", "sgd", "--reg", "1e-5",
    ]  # fmt: skip
    runpy.run_path(str(Path(code) / "train_fl.py"), run_name="__main__")


def run_theirs(a, alg: str, seed: int, data: Path, work: Path) -> list[float]:
    log = work / f"theirs_{alg}_{seed}"
    log.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, __file__, "--their-side", "--authors-code", a.authors_code,
        "--data", str(data), "--alg", alg, "--seed", str(seed), "--rounds", str(a.rounds),
        "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", str(a.lr),
        "--alpha", str(a.alpha), "--clients", str(a.clients), "--logdir", str(log),
        "--model", a.model,
    ]  # fmt: skip
    p = subprocess.run(
        cmd,
        cwd=a.authors_code,
        capture_output=True,
        text=True,
        env={**_env(), "PYTHONPATH": str(C.ROOT)},
    )
    (log / "stdout.txt").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"their train_fl.py failed (rc {p.returncode}), see {log}/stdout.txt")
    return [100.0 * float(v) for v in ACC.findall(p.stdout)]


def _env() -> dict:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run_ours(a, alg: str, seed: int, data: Path, work: Path) -> list[float]:
    import torch

    torch.set_num_threads(1)
    method = "univarfl" if alg == "feduv" else "fedavg"
    params = {"variant": "feduv", "lam": 2.5, "mu": 0.5} if alg == "feduv" else {}
    exp = {
        "name": f"ours_{alg}_{seed}",
        "seed": seed,
        "dataset": {
            "name": "cifar10",
            "root": str(data),
            "verify_md5": False,
            "augment": False,
            "normalize": {"mean": C.CIFAR_MEAN, "std": C.CIFAR_STD},
            "cache_dir": str(work / "cache"),
        },
        "partition": {
            "scheme": "dirichlet",
            "alpha": a.alpha,
            "balanced": False,
            "min_size": 10,
            "generator": "feduv",
        },
        "model": {"name": a.model, "params": {"projector": 256}},
        "federation": {
            "num_clients": a.clients,
            "rounds": a.rounds,
            "participation": 1.0,
            "eval_every": 1,
        },
        "client": {
            "method": method,
            "params": params,
            "optimizer": "sgd",
            "lr": a.lr,
            "lr_decay": 1.0,
            "lr_schedule": "cosine",
            "momentum": 0.9,
            "weight_decay": 1e-5,
            "local_epochs": a.epochs,
            "batch_size": a.batch_size,
            "drop_last": True,
            "grad_clip": None,
            "device": "cpu",
        },
        "server": {"strategy": "fedavg", "weighting": "samples"},
        "evaluation": {"batch_size": 500},
        "output": {"dir": str(work / f"ours_{alg}_{seed}"), "checkpoint_every": 0},
    }
    return C.run_ours(exp, work / f"ours_{alg}_{seed}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors-code", required=True, help="a checkout of sonhamin/FedUV")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--methods", nargs="+", default=["fedavg", "feduv"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--model", default="cnn5")
    ap.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    C.add_their_side_arguments(ap)
    a = ap.parse_args()
    if a.their_side:
        their_side(a)
        return
    if not (Path(a.authors_code) / "train_fl.py").is_file():
        raise SystemExit(f"--authors-code {a.authors_code}: no train_fl.py (a FedUV checkout?)")
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="fidelity_feduv_"))
    data = work / "data"
    if not (data / "cifar-10-batches-py").is_dir():
        C.write_digits_as_cifar10(data)
    C.side_by_side(a, run_theirs, run_ours, data, work, "FedUV")


if __name__ == "__main__":
    main()
