"""FedProx (Li et al., MLSys 2020, "Federated Optimization in Heterogeneous Networks").

Local objective (the paper's h_k, Algorithm 2):

    h_k(w; w^t) = CE(w) + (μ/2)·‖w − w^t‖²

with w^t the received global model, over the trainable parameters. The proximal term is
the base client's :meth:`~clients.base.FederatedClient.distance_to_received_term` with
weight μ/2 (loss term ``prox``).

Parameter (``client.params``): ``mu`` (μ) = 0.001, FedRCL supplementary Sec. E ("0.001 in
FedProx"). UniVarFL tunes μ = 0.01 (its Sec. 4, hyper-parameters). Note: FedRCL's
released code multiplies Σ‖w − w_g‖² itself by 0.001 (no 1/2), i.e. μ = 0.002 in the
paper's notation; set ``mu: 0.002`` to match that code exactly.
"""

from __future__ import annotations

from clients.base import FederatedClient
from fedrcl_flwr.components import non_negative
from fedrcl_flwr.training import cross_entropy_term


class FedProxClient(FederatedClient):
    method = "fedprox"
    defaults = {"mu": 0.001}

    rules = {"mu": non_negative()}

    def loss_terms(self):
        return [cross_entropy_term(),
                self.distance_to_received_term("prox", 0.5 * float(self.p["mu"]))]
