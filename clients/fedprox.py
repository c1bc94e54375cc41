"""FedProx (Li et al., MLSys 2020, "Federated Optimization in Heterogeneous Networks").

Local objective (the paper's h_k, Algorithm 2):

    h_k(w; w^t) = CE(w) + (μ/2)·‖w − w^t‖²

with w^t the received global model, over the trainable parameters. The proximal term is
the base client's :meth:`~clients.base.FederatedClient.distance_to_received_term` with
weight μ/2 (loss term ``prox``).

Parameters (``client.params``): ``mu`` (μ) = 0.001, FedRCL supplementary Sec. E ("0.001 in
FedProx"). UniVarFL tunes μ = 0.01 (its Sec. 4, hyper-parameters). ``halve`` = true: the
weight of Σ‖w − w^t‖² is μ/2, the FedProx paper's h_k (default, because μ in Li et al. and
in UniVarFL is stated in that notation). ``halve: false`` gives weight μ: what the FedRCL
authors run (skynbe/FedRCL ``clients/rcl_client.py``, loss ``prox`` = Σ(p − p_g)², and
geehokim/FedACG ``clients/base_client.py`` with ``configs/client/Prox.yaml`` weight 1e-3),
i.e. twice as strong as the paper's μ/2; the FedRCL paper YAMLs use ``{mu: 0.001, halve:
false}``.
"""

from __future__ import annotations

from clients.base import FederatedClient
from fedrcl_flwr.components import non_negative
from fedrcl_flwr.training import cross_entropy_term


class FedProxClient(FederatedClient):
    method = "fedprox"
    defaults = {"mu": 0.001, "halve": True}
    rules = {"mu": non_negative()}

    def loss_terms(self):
        mu = float(self.p["mu"])
        return [
            cross_entropy_term(),
            self.distance_to_received_term("prox", 0.5 * mu if self.p["halve"] else mu),
        ]
