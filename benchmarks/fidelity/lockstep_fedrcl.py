"""The FedRCL side of ``lockstep.py`` (skynbe/FedRCL @ 378beb4): their ``RCLClient``
(``configs/client/fedrcl.yaml``), ``Server`` (uniform average) and ``ResNet18_base`` with
GroupNorm, against our ``fedrcl`` client (``variant: official``), ``fedavg`` strategy and
``resnet18_gn``; ``--method fedavg``: their base ``Client`` against ours.

Their side runs through ``_lockstep_trainer.run_trainer``, whose docstring lists every shim
and why none changes a number (initial model, client sampler, batch order, augmentation
draws, observation, environment).

Protocol (defaults; the command line changes them): digits as CIFAR-10 files (1,437
training, 360 test images, 32 px), 8 clients, 2 per round, balanced Dirichlet α 0.3, one
local epoch of batch 50, lr 0.1.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _lockstep_trainer as family  # noqa: E402
from lockstep import Quirk  # noqa: E402

NAME = "fedrcl"
SOURCE = "skynbe/FedRCL @ 378beb4"
METHODS = ("fedrcl", "fedavg")
DEFAULTS = {
    "clients": 8,
    "participation": 0.25,
    "epochs": 1,
    "batch_size": 50,
    "lr": 0.1,
    "alpha": 0.3,
}
QUIRKS: tuple[Quirk, ...] = ()

THEIR_CLIENT = {"fedrcl": "fedrcl", "fedavg": "base"}


def checkout_problem(path: Path) -> str | None:
    if not (path / "clients" / "rcl_client.py").is_file():
        return "no clients/rcl_client.py (a checkout of skynbe/FedRCL?)"
    return None


def write_data(a, data: Path) -> None:
    family.write_digits(data)


def our_experiment(a, data: Path, work: Path) -> dict:
    client = {"method": a.method}
    return family.our_experiment(a, data, work, client, {"strategy": "fedavg"})


def their_side(a, plan, data: Path, work: Path, record) -> None:
    groups = {
        "trainer": "base",
        "client": THEIR_CLIENT[a.method],
        "evaler": "base",
        "dataset": "cifar10",
        "server": "base",
        "model": "resnet18",
    }
    family.run_trainer(a, plan, data, work, record, groups, {})
