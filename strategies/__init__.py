"""Flower strategies; YAML's ``server.strategy`` selects one here."""

from __future__ import annotations

import importlib

STRATEGIES: dict[str, str] = {
    "fedavg": "strategies.fedavg:FedAvg",
    "fedavgm": "strategies.fedavgm:FedAvgM",
    "fedadam": "strategies.fedadam:FedAdam",
    "fedacg": "strategies.fedacg:FedACG",
    "feddyn": "strategies.feddyn:FedDyn",
}


def strategy_class(name: str):
    if name not in STRATEGIES:
        from fedrcl_flwr.config import ConfigError

        raise ConfigError(f"'server.strategy' must be one of "
                          f"{', '.join(sorted(STRATEGIES))}, got {name!r}")
    module, cls = STRATEGIES[name].split(":")
    return getattr(importlib.import_module(module), cls)
