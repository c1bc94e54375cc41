"""Flower client per local objective; YAML's ``client.method`` selects one here.

The test double ``faulty`` (``clients/faulty.py``) is not registered here: the test suite
registers it (``tests/conftest.py``, through ``fedrcl_flwr.components.EXTRA_COMPONENTS_ENV``
so that the processes of a run a test starts know it too)."""

from __future__ import annotations

from fedrcl_flwr.components import Registry

# method name -> "module:Class" (imported lazily so one broken method can't break others)
CLIENTS = Registry("client.method", {
    "fedavg": "clients.fedavg:FedAvgClient",
    "fedrcl": "clients.fedrcl:FedRCLClient",
    "fedscl": "clients.fedscl:FedSCLClient",
    "fedcl": "clients.fedcl:FedCLClient",
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
})

client_class = CLIENTS.load
