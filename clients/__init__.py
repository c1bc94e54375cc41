"""Flower client per local objective; YAML's ``client.method`` selects one here.

Each entry names the client class (``"module:Class"``, imported lazily so one broken
method can't break others) and declares the method's hyper-parameters (``client.params``):
``defaults`` (the type of each default is the parameter's type) and the allowed values in
``rules`` (:mod:`fedrcl_flwr.components`). This module imports no Flower: ``report``
reads a method's defaults here (a paper reference's ``when: {client.params: ...}``), and
each client class takes its ``defaults`` / ``rules`` from its entry
(``defaults, rules = CLIENTS.params(method)``).

The test double ``faulty`` (``clients/faulty.py``) is not registered here: the test suite
registers it (``tests/conftest.py``, through ``fedrcl_flwr.components.EXTRA_COMPONENTS_ENV``
so that the processes of a run a test starts know it too); registered so from outside, it
declares its parameters on its class."""

from __future__ import annotations

from fedrcl_flwr.components import (
    Declared,
    Registry,
    at_least,
    between,
    block_indices,
    feature_tap,
    finch_level,
    non_negative,
    one_of,
    positive,
    tap_levels,
)

# FedRCL's loss (clients/fedrcl.py); FedSCL (clients/fedscl.py) takes its SCL part
_RCL_RULES = {
    "beta": non_negative(),
    "tau": positive(),
    "lam": between(-1, 1),
    "rcl_weight": non_negative(),
    "levels": tap_levels(),
    "variant": one_of("official", "paper"),
    "topk_pos": at_least(1),
    "topk_neg": at_least(1),
}
_SCL_KEYS = ("tau", "rcl_weight", "levels", "variant", "topk_pos", "topk_neg")

CLIENTS = Registry(
    "client.method",
    {
        "fedavg": "clients.fedavg:FedAvgClient",
        "fedrcl": Declared(
            "clients.fedrcl:FedRCLClient",
            defaults={
                "beta": 1.0,
                "tau": 0.05,
                "lam": 0.7,
                "rcl_weight": 1.0,
                "levels": ["all"],
                "variant": "official",
                "topk_pos": 1,
                "topk_neg": 2,
            },
            rules=_RCL_RULES,
        ),
        "fedscl": Declared(
            "clients.fedscl:FedSCLClient",
            defaults={
                "tau": 0.05,
                "rcl_weight": 1.0,
                "levels": ["all"],
                "variant": "official",
                "topk_pos": 1,
                "topk_neg": 2,
            },
            rules={k: _RCL_RULES[k] for k in _SCL_KEYS},
        ),
        "fedcl": Declared(
            "clients.fedcl:FedCLClient",
            defaults={"tau": 0.5, "cl_weight": 1.0, "levels": ["all"], "pad": 4},
            rules={
                "tau": positive(),
                "cl_weight": non_negative(),
                "levels": tap_levels(),
                "pad": non_negative(),
            },
        ),
        "univarfl": Declared(
            "clients.univarfl:UniVarFLClient",
            defaults={
                "mu": 0.5,
                "lam": -1.0,
                "variant": "univarfl",
                "feature": "penultimate",
                "eps": -1.0,
            },
            rules={
                "mu": non_negative(),
                "lam": between(0.0, also=(-1.0,)),
                "variant": one_of("univarfl", "feduv"),
                "feature": feature_tap(),
                "eps": between(0.0, lo_open=True, also=(-1.0,)),
            },
        ),
        "freeze": "clients.freeze:FreezeClient",
        "fedccl": Declared(
            "clients.fedccl:FedCCLClient",
            defaults={
                "tau": 0.07,
                "w_local": 1.0,
                "w_global": 1.0,
                "use_local": True,
                "use_global": True,
                "local_signal": "cluster",
                "global_signal": "cluster",
                "signal_level": "coarsest",
                "feature": "penultimate",
                "adversarial": False,
                "eps": 8 / 255,
                "step": 2 / 255,
                "steps": 10,
                "embed_batch": 500,
            },
            rules={
                "tau": positive(),
                "w_local": non_negative(),
                "w_global": non_negative(),
                "local_signal": one_of("cluster", "mean"),
                "global_signal": one_of("cluster", "mean"),
                "signal_level": finch_level(),
                "feature": feature_tap(),
                "eps": positive(),
                "step": positive(),
                "steps": at_least(1),
                "embed_batch": at_least(1),
            },
        ),
        # baselines (FedRCL / UniVarFL / FedCCL comparisons)
        "fedprox": Declared(
            "clients.fedprox:FedProxClient",
            defaults={"mu": 0.001, "halve": True},
            rules={"mu": non_negative()},
        ),
        "moon": Declared(
            "clients.moon:MOONClient",
            defaults={"mu": 1.0, "tau": 0.5, "feature": "penultimate"},
            rules={"mu": non_negative(), "tau": positive(), "feature": feature_tap()},
        ),
        "fedlc": Declared(
            "clients.fedlc:FedLCClient",
            defaults={"tau": 1.0, "absent": "drop"},
            rules={"tau": non_negative(), "absent": one_of("drop", "clamp")},
        ),
        "fedntd": Declared(
            "clients.fedntd:FedNTDClient",
            defaults={"beta": 0.3, "temp": 1.0, "ce_weight": 1.0},
            rules={"beta": non_negative(), "temp": positive(), "ce_weight": non_negative()},
        ),
        "feddecorr": Declared(
            "clients.feddecorr:FedDecorrClient",
            defaults={"beta": 0.01, "feature": "penultimate"},
            rules={"beta": non_negative(), "feature": feature_tap()},
        ),
        "fedmlb": Declared(
            "clients.fedmlb:FedMLBClient",
            defaults={"lam1": 1.0, "lam2": 1.0, "temp": 1.0, "branches": ["all"]},
            rules={
                "lam1": non_negative(),
                "lam2": non_negative(),
                "temp": positive(),
                "branches": block_indices(),
            },
        ),
        "fitnet": Declared(
            "clients.fitnet:FitNetClient",
            defaults={"lam": 0.001, "feature": "penultimate"},
            rules={"lam": non_negative(), "feature": feature_tap()},
        ),
        "fedproc": Declared(
            "clients.fedproc:FedProcClient",
            defaults={"tau": 0.07, "alpha": -1.0, "feature": "penultimate", "embed_batch": 500},
            rules={
                "tau": positive(),
                "alpha": between(0.0, 1.0, also=(-1.0,)),
                "feature": feature_tap(),
                "embed_batch": at_least(1),
            },
        ),
        "fedproto": Declared(
            "clients.fedproto:FedProtoClient",
            defaults={"lam": 1.0, "feature": "penultimate", "embed_batch": 500},
            rules={"lam": non_negative(), "feature": feature_tap(), "embed_batch": at_least(1)},
        ),
        "fpl": Declared(
            "clients.fpl:FPLClient",
            defaults={
                "tau": 0.07,
                "lam": 1.0,
                "feature": "penultimate",
                "embed_batch": 500,
                "mean_over": "valid",
                "proto_source": "after_training",
            },
            rules={
                "tau": positive(),
                "lam": non_negative(),
                "feature": feature_tap(),
                "embed_batch": at_least(1),
                "mean_over": one_of("valid", "batch"),
                "proto_source": one_of("after_training", "last_epoch"),
            },
        ),
        "fedpcl": Declared(
            "clients.fedpcl:FedPCLClient",
            defaults={
                "tau": 0.07,
                "w_global": 1.0,
                "w_local": 1.0,
                "ce_weight": 1.0,
                "feature": "penultimate",
                "embed_batch": 500,
            },
            rules={
                "tau": positive(),
                "w_global": non_negative(),
                "w_local": non_negative(),
                "ce_weight": non_negative(),
                "feature": feature_tap(),
                "embed_batch": at_least(1),
            },
        ),
        "feddyn": "clients.feddyn:FedDynClient",  # α is server.params.alpha (the strategy's)
    },
)

client_class = CLIENTS.load
