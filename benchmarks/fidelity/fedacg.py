"""FedACG side by side: the project against the authors' code (geehokim/FedACG, the code
FedRCL's baselines are built on), same files, same protocol, same split.

    git clone https://github.com/geehokim/FedACG /path/FedACG     # never vendored here
    python benchmarks/fidelity/fedacg.py --authors-code /path/FedACG --seeds 0 1 \\
        --methods fedavg fedacg --rounds 15 --out runs/fidelity/fedacg

Data: scikit-learn's digits rendered as CIFAR-10 batches (``_common.write_digits_as_cifar10``)
read by *their* ``build_datasets`` (torchvision's ``CIFAR10``, their ``datasets/configs.yaml``
constants, RandomRotation(10) -> RandomCrop(32, 4) -> flip) and by ours
(``dataset.name: cifar10``, ``rotation: 10``, ``pad_fill: black``, the same constants).

Protocol (both sides, their ``configs/`` with these overrides): ``--clients`` clients,
``--participation``, their balanced Dirichlet split (``cifar_dirichlet_balanced`` as their
trainer calls it; ours ``partition.generator: fedrcl``, seed 0: index-identical, tested in
tests/datasets/test_authors_split.py), SGD lr ``--lr`` x ``--lr-decay`` per round and per local
epoch (their ``local_lr_decay``; ours ``lr_decay`` and ``epoch_lr_decay``), no momentum,
weight decay 1e-3, ``--epochs`` local epochs of batch ``--batch-size``, gradient-norm clip
10, uniform averaging; float32 (``use_amp: False``, as theirs on a CPU). Methods:
``fedavg`` (server=base client=base), ``fedacg`` (server=FedACG client=ACG: λ 0.85, client
term 1e-3 Σ(p − g)²), ``fedavgm`` (server=FedAvgM: 0.4), ``fedadam`` (server=FedAdam,
``trainer.global_lr=0.01``). Model: the project's ``cnn5`` on both sides (theirs through a
class with their model interface: ``forward -> {"logit", "feature"}``, ``num_layers``).
The metric: the global model's test accuracy after the last round (their evaler's
``Test Accuracy``; ours ``metrics.jsonl``).

Shims on their side (no change to their files; in the child process): hydra is not
used — the harness composes their ``configs/*.yaml`` itself (``config.yaml`` and the
``trainer/base``, ``client/<c>``, ``server/<s>``, ``evaler/base``, ``dataset/cifar10``
groups, as ``federated_train.py``'s defaults) into an attribute dictionary and runs what
``federated_train.main`` runs (``initalize_random_seed``, their client / server / evaler /
trainer types, ``trainer.train()``) on the CPU; stub modules for imports their path never
uses here (``omegaconf`` type hints, ``imageio`` of Tiny-ImageNet, ``tabulate`` of the
registry's printout, ``torchmetrics`` of an unused metric, ``torchinfo`` of VGG-9's
summary); torchvision's CIFAR MD5 check
accepts our files; ``dataset.client_path`` points to an empty folder, so their trainer
draws the split instead of reading a released file.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

ACC = re.compile(r"Test Accuracy: ([0-9.]+)%")
NORMALIZE = {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2023, 0.1994, 0.2010]}
THEIR_GROUPS = {  # method -> (client, server, extra overrides)
    "fedavg": ("base", "base", {}),
    "fedacg": ("ACG", "FedACG", {}),
    "fedavgm": ("base", "FedAvgM", {}),
    "fedadam": ("base", "FedAdam", {"trainer.global_lr": 0.01}),
}


class Cfg(dict):
    """Attribute access and ``.get`` over nested dicts (what their code asks of hydra's
    ``DictConfig``)."""

    def __init__(self, d=None):
        super().__init__()
        for k, v in (d or {}).items():
            self[k] = Cfg(v) if isinstance(v, dict) else v

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None

    def __setattr__(self, k, v):
        self[k] = v


def _floats(d):
    """``1e-3`` is a float to hydra's YAML loader (OmegaConf) and a string to PyYAML's."""
    if isinstance(d, dict):
        return {k: _floats(v) for k, v in d.items()}
    if isinstance(d, str) and re.fullmatch(r"[-+]?[0-9.]+[eE][-+]?[0-9]+", d.strip()):
        return float(d)
    return d


def their_config(code: Path, a, method: str) -> Cfg:
    from fedrcl_flwr.config.loading import parse_yaml  # the hardened reader

    def load(rel):
        path = code / "configs" / rel
        return parse_yaml(path.read_text(), str(path)) or {}

    cfg = _floats(load("config.yaml"))
    cfg.pop("defaults", None)
    client, server, extra = THEIR_GROUPS[method]
    for group, name in (
        ("trainer", "base"),
        ("client", client),
        ("evaler", "base"),
        ("dataset", "cifar10"),
        ("server", server),
        ("model", "resnet18"),
    ):
        cfg[group] = _floats(load(f"{group}/{name}.yaml"))
    sets = {
        "seed": a.seed,
        "use_amp": False,
        "wandb": False,
        "batch_size": a.batch_size,
        "checkpoint_path": str(Path(a.logdir) / "ckpt"),
        "log_dir": str(Path(a.logdir) / "log"),
        "save_freq": 0,
        "dataset.path": a.data,
        "dataset.client_path": str(Path(a.logdir) / "no_client_data"),
        "dataset.download": False,
        "split.mode": "dirichlet",
        "split.alpha": a.alpha,
        "trainer.num_clients": a.clients,
        "trainer.participation_rate": a.participation,
        "trainer.global_rounds": a.rounds,
        "trainer.local_epochs": a.epochs,
        "trainer.local_lr": a.lr,
        "trainer.local_lr_decay": a.lr_decay,
        **extra,
    }
    for key, v in sets.items():
        d = cfg
        *path, last = key.split(".")
        for p in path:
            d = d[p]
        d[last] = v
    return Cfg(cfg)


def their_side(a) -> None:
    import logging

    import torch
    import torch.nn as nn

    for name, attrs in {
        "omegaconf": {"DictConfig": dict, "OmegaConf": object},
        "imageio": {},
        "tabulate": {"tabulate": lambda *x, **k: ""},
        "torchmetrics": {"Metric": nn.Module},
        "torchinfo": {},
    }.items():
        if name not in sys.modules:
            try:
                __import__(name)
            except ImportError:
                import importlib.machinery

                mod = types.ModuleType(name)
                mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
                mod.__dict__.update(attrs)
                sys.modules[name] = mod
    C.patch_torchvision_cifar_integrity()
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    torch.set_num_threads(1)
    code = Path(a.authors_code).resolve()
    sys.path.insert(0, str(code))
    from clients import get_client_type  # noqa: I001 - theirs, first on sys.path
    from datasets.build import build_datasets
    from evalers import get_evaler_type
    from servers import build_server
    from trainers import get_trainer_type
    from utils import initalize_random_seed

    from fedrcl_flwr.models import build_model

    args = their_config(code, a, a.alg)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    initalize_random_seed(args)

    class OurModel(nn.Module):
        """Their model interface around our model."""

        num_layers = 5

        def __init__(self):
            super().__init__()
            self.m = build_model(a.model, num_classes=10, in_channels=3, image_size=32)

        def forward(self, x, **kw):
            logits, feats = self.m(x, return_features=True)
            return {"logit": logits, "feature": feats["penultimate"]}

    model = OurModel()  # where federated_train.main calls build_encoder(args)
    trainer = get_trainer_type(args)(
        model=model,
        client_type=get_client_type(args),
        server=build_server(args),
        evaler_type=get_evaler_type(args),
        datasets=build_datasets(args),
        device=torch.device("cpu"),
        args=args,
        config=None,
    )
    trainer.train()


def run_theirs(a, alg, seed, data, work) -> list[float]:
    log = work / f"theirs_{alg}_{seed}"
    log.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, __file__, "--their-side", "--authors-code", a.authors_code,
        "--data", str(data), "--alg", alg, "--seed", str(seed), "--logdir", str(log),
        *_protocol_args(a),
    ]  # fmt: skip
    env = {**__import__("os").environ, "PYTHONPATH": str(C.ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, cwd=a.authors_code, capture_output=True, text=True, env=env)
    (log / "stdout.txt").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"their trainer failed (rc {p.returncode}), see {log}/stdout.txt")
    return [float(v) for v in ACC.findall(p.stdout)]


def _protocol_args(a) -> list[str]:
    return [
        "--rounds", str(a.rounds), "--epochs", str(a.epochs), "--batch-size",
        str(a.batch_size), "--lr", str(a.lr), "--lr-decay", str(a.lr_decay), "--alpha",
        str(a.alpha), "--clients", str(a.clients), "--participation", str(a.participation),
        "--model", a.model,
    ]  # fmt: skip


def run_ours(a, alg, seed, data, work) -> list[float]:
    import torch

    torch.set_num_threads(1)
    server = {
        "fedavg": {"strategy": "fedavg"},
        "fedacg": {"strategy": "fedacg", "params": {"lam": 0.85, "beta": 0.001}},
        "fedavgm": {"strategy": "fedavgm", "params": {"momentum": 0.4}},
        "fedadam": {"strategy": "fedadam", "params": {"server_lr": 0.01}},
    }[alg]
    exp = {
        "name": f"ours_{alg}_{seed}",
        "seed": seed,
        "dataset": {
            "name": "cifar10",
            "root": str(data),
            "verify_md5": False,
            "normalize": NORMALIZE,
            "rotation": 10,
            "crop_pad": 4,
            "flip": True,
            "pad_fill": "black",
            "cache_dir": str(work / "cache"),
        },
        "partition": {
            "scheme": "dirichlet",
            "alpha": a.alpha,
            "balanced": True,
            "seed": 0,
            "generator": "fedrcl",
        },
        "model": {"name": a.model},
        "federation": {
            "num_clients": a.clients,
            "rounds": a.rounds,
            "participation": a.participation,
            "eval_every": 1,
        },
        "client": {
            "method": "fedavg",
            "optimizer": "sgd",
            "lr": a.lr,
            "lr_decay": a.lr_decay,
            "epoch_lr_decay": a.lr_decay,
            "momentum": 0.0,
            "weight_decay": 1e-3,
            "local_epochs": a.epochs,
            "batch_size": a.batch_size,
            "grad_clip": 10.0,
            "device": "cpu",
        },
        "server": {**server, "weighting": "uniform"},
        "evaluation": {"batch_size": 500},
        "output": {"dir": str(work / f"ours_{alg}_{seed}"), "checkpoint_every": 0},
    }
    return C.run_ours(exp, work / f"ours_{alg}_{seed}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors-code", required=True, help="a checkout of geehokim/FedACG")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--methods", nargs="+", default=["fedavg", "fedacg"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--lr-decay", type=float, default=0.998)
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--participation", type=float, default=0.25)
    ap.add_argument("--model", default="cnn5")
    ap.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    C.add_their_side_arguments(ap)
    a = ap.parse_args()
    if a.their_side:
        their_side(a)
        return
    if not (Path(a.authors_code) / "servers" / "base.py").is_file():
        raise SystemExit(
            f"--authors-code {a.authors_code}: no servers/base.py (a FedACG checkout?)"
        )
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="fidelity_fedacg_"))
    data = work / "data"
    if not (data / "cifar-10-batches-py").is_dir():
        C.write_digits_as_cifar10(data)
    C.side_by_side(a, run_theirs, run_ours, data, work, "FedACG")


if __name__ == "__main__":
    main()
