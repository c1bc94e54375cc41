"""Flower client per local objective; YAML's ``client.method`` selects one here."""

from __future__ import annotations

import importlib

# method name -> "module:Class" (imported lazily so one broken method can't break others)
CLIENTS: dict[str, str] = {
    "fedavg": "clients.fedavg:FedAvgClient",
    "fedrcl": "clients.fedrcl:FedRCLClient",
    "fedscl": "clients.fedscl:FedSCLClient",
    "fedcl": "clients.fedcl:FedCLClient",
    "faulty": "clients.faulty:FaultyClient",
    "univarfl": "clients.univarfl:UniVarFLClient",
    "freeze": "clients.freeze:FreezeClient",
    "fedccl": "clients.fedccl:FedCCLClient",
    # baselines (FedRCL / UniVarFL / FedCCL comparisons)
    "fedprox": "clients.fedprox:FedProxClient",
    "moon": "clients.moon:MOONClient",
    "fedlc": "clients.fedlc:FedLCClient",
    "fedntd": "clients.fedntd:FedNTDClient",
    "feddecorr": "clients.feddecorr:FedDecorrClient",
    "fedmlb": "clients.fedmlb:FedMLBClient",
    "fitnet": "clients.fitnet:FitNetClient",
    "fedproc": "clients.fedproc:FedProcClient",
    "fedproto": "clients.fedproto:FedProtoClient",
    "fpl": "clients.fpl:FPLClient",
    "fedpcl": "clients.fedpcl:FedPCLClient",
    "feddyn": "clients.feddyn:FedDynClient",
}


def client_class(method: str):
    if method not in CLIENTS:
        from fedrcl_flwr.config import ConfigError

        raise ConfigError(f"'client.method' must be one of {', '.join(sorted(CLIENTS))}, "
                          f"got {method!r}")
    module, cls = CLIENTS[method].split(":")
    return getattr(importlib.import_module(module), cls)
