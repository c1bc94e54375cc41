"""Flower strategies; YAML's ``server.strategy`` selects one here.

Each entry names the strategy class (``"module:Class"``, imported lazily, as
``clients.CLIENTS``) and declares its parameters (``server.params``): ``defaults`` with the
allowed values in ``rules`` (:mod:`fedrcl_flwr.components`); the class takes them from its
entry (``defaults, rules = STRATEGIES.params(name)``). No Flower is imported here.
"""

from __future__ import annotations

from fedrcl_flwr.components import Declared, Registry, between, non_negative, positive

STRATEGIES = Registry(
    "server.strategy",
    {
        "fedavg": "strategies.fedavg:FedAvg",
        "fedavgm": Declared(
            "strategies.fedavgm:FedAvgM",
            defaults={"momentum": 0.4, "server_lr": 1.0},
            rules={"momentum": between(0, 1, hi_open=True), "server_lr": positive()},
        ),
        "fedadam": Declared(
            "strategies.fedadam:FedAdam",
            defaults={
                "server_lr": 0.01,
                "beta1": 0.9,
                "beta2": 0.99,
                "tau": 1e-3,
                "v_init_tau_sq": True,
            },
            rules={
                "server_lr": positive(),
                "beta1": between(0, 1, hi_open=True),
                "beta2": between(0, 1, hi_open=True),
                "tau": positive(),
            },
        ),
        "fedacg": Declared(
            "strategies.fedacg:FedACG",
            defaults={"lam": 0.85, "beta": 0.001},
            rules={"lam": between(0, 1, hi_open=True), "beta": non_negative()},
        ),
        "feddyn": Declared(
            "strategies.feddyn:FedDyn", defaults={"alpha": 0.1}, rules={"alpha": positive()}
        ),
    },
)

strategy_class = STRATEGIES.load
