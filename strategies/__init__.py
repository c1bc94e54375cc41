"""Flower strategies; YAML's ``server.strategy`` selects one here."""

from __future__ import annotations

from fedrcl_flwr.components import Registry

# strategy name -> "module:Class" (imported lazily, as clients.CLIENTS)
STRATEGIES = Registry("server.strategy", {
    "fedavg": "strategies.fedavg:FedAvg",
    "fedavgm": "strategies.fedavgm:FedAvgM",
    "fedadam": "strategies.fedadam:FedAdam",
    "fedacg": "strategies.fedacg:FedACG",
    "feddyn": "strategies.feddyn:FedDyn",
})

strategy_class = STRATEGIES.load
