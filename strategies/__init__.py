"""Flower strategies; YAML's ``server.strategy`` selects one here.

Each entry is ``name: "module:Class"``, imported lazily as ``clients.CLIENTS``. A strategy
declares its parameters (``server.params``) on its class: ``defaults`` with their allowed
values in ``rules`` (:mod:`fedrcl_flwr.components`); ``STRATEGIES.params(name)`` reads them
from there. No Flower is imported here.
"""

from __future__ import annotations

from fedrcl_flwr.components import Registry

STRATEGIES = Registry(
    "server.strategy",
    {
        "fedavg": "strategies.fedavg:FedAvg",
        "fedavgm": "strategies.fedavgm:FedAvgM",
        "fedadam": "strategies.fedadam:FedAdam",
        "fedacg": "strategies.fedacg:FedACG",
        "feddyn": "strategies.feddyn:FedDyn",
    },
)

strategy_class = STRATEGIES.load
