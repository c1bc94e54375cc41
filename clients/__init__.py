"""Flower client per local objective; YAML's ``client.method`` selects one here.

Each entry is ``name: "module:Class"``, the class imported lazily (one broken method
cannot break the others). A method declares its hyper-parameters (``client.params``) on
its class, next to the code that uses them: ``defaults`` (the type of each default is the
parameter's type) and their allowed values in ``rules`` (:mod:`fedrcl_flwr.components`);
``CLIENTS.params(name)`` reads them from there (and so imports the class).

The test double ``faulty`` (``clients/faulty.py``) is not registered here: the test suite
registers it (``tests/conftest.py``, through ``fedrcl_flwr.components.EXTRA_COMPONENTS_ENV``
so that the processes of a run a test starts know it too)."""

from __future__ import annotations

from fedrcl_flwr.components import Registry

CLIENTS = Registry(
    "client.method",
    {
        "fedavg": "clients.fedavg:FedAvgClient",
        "fedrcl": "clients.fedrcl:FedRCLClient",
        "fedscl": "clients.fedscl:FedSCLClient",
        "fedcl": "clients.fedcl:FedCLClient",
        "univarfl": "clients.univarfl:UniVarFLClient",
        "freeze": "clients.freeze:FreezeClient",
        "fedccl": "clients.fedccl:FedCCLClient",
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
    },
)

client_class = CLIENTS.load
