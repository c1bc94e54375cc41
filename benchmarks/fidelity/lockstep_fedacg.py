"""The FedACG side of ``lockstep.py`` (geehokim/FedACG @ 62b6e95): their ``Client``
(``configs/client/ACG.yaml``: ``prox_loss`` 1e-3 on Σ(p − g)², g the model received),
``ServerM`` with ``FedACG: True`` (λ 0.85: the look-ahead model sent, momentum of the
average update) and ``ResNet18_base`` with GroupNorm, against our ``fedavg`` client under
our ``fedacg`` strategy (lam 0.85, beta 0.001) and ``resnet18_gn``. ``--method fedavg``,
``fedavgm`` (``ServerM`` 0.4), ``fedadam`` (``ServerAdam``, ``trainer.global_lr=0.01``):
their other servers against ours.

Their side runs through ``_lockstep_trainer.run_trainer``, whose docstring lists every shim
and why none changes a number.

Protocol (defaults): as ``lockstep_fedrcl`` (digits as CIFAR-10, 8 clients, 2 per round,
balanced Dirichlet α 0.3, one local epoch of batch 50, lr 0.1).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _lockstep_trainer as family  # noqa: E402
from lockstep import Quirk  # noqa: E402

NAME = "fedacg"
SOURCE = "geehokim/FedACG @ 62b6e95"
METHODS = ("fedacg", "fedavg", "fedavgm", "fedadam")
DEFAULTS = {
    "clients": 8,
    "participation": 0.25,
    "epochs": 1,
    "batch_size": 50,
    "lr": 0.1,
    "alpha": 0.3,
}
QUIRKS: tuple[Quirk, ...] = (
    Quirk(
        "FedACG's server arithmetic: theirs is float32 throughout (look-ahead w + λ·M, each "
        "client's delta against it, sum / C, M = λ·M + Δ); ours by default keeps M in "
        "float64 and measures Δ from the average (the same formulas, one rounding fewer), "
        "which training amplifies after round 1: set here",
        "server.params.arithmetic: float32",
    ),
)

# method -> (their client group, their server group, their extra overrides, our server)
METHOD_MAP = {
    "fedacg": (
        "ACG",
        "FedACG",
        {},
        {"strategy": "fedacg", "params": {"lam": 0.85, "beta": 0.001, "arithmetic": "float32"}},
    ),
    "fedavg": ("base", "base", {}, {"strategy": "fedavg"}),
    "fedavgm": ("base", "FedAvgM", {}, {"strategy": "fedavgm", "params": {"momentum": 0.4}}),
    "fedadam": (
        "base",
        "FedAdam",
        {"trainer.global_lr": 0.01},
        {"strategy": "fedadam", "params": {"server_lr": 0.01}},
    ),
}


def checkout_problem(path: Path) -> str | None:
    if not (path / "configs" / "server" / "FedACG.yaml").is_file():
        return "no configs/server/FedACG.yaml (a checkout of geehokim/FedACG?)"
    return None


def write_data(a, data: Path) -> None:
    family.write_digits(data)


def our_experiment(a, data: Path, work: Path) -> dict:
    server = METHOD_MAP[a.method][3]
    return family.our_experiment(a, data, work, {"method": "fedavg"}, server)


def their_side(a, plan, data: Path, work: Path, record) -> None:
    client, server, extra, _ = METHOD_MAP[a.method]
    groups = {
        "trainer": "base",
        "client": client,
        "evaler": "base",
        "dataset": "cifar10",
        "server": server,
        "model": "resnet18",
    }
    family.run_trainer(a, plan, data, work, record, groups, extra)
