"""FedNTD (Lee et al., NeurIPS 2022, "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning").

Local objective: L = CE + β·L_NTD with the not-true distillation

    L_NTD = KL(q̃_g^τ ‖ q̃_l^τ) = −Σ_{c≠y} q̃_g^τ(c)·log(q̃_l^τ(c) / q̃_g^τ(c))

where q̃^τ are temperature-τ softmaxes over the not-true classes of the frozen global
model (teacher; one no-grad forward per batch through a cached second model instance) and
of the local model. Loss term ``ntd``; :func:`fedrcl_flwr.losses.baselines.fedntd_loss`.

Parameters: ``beta`` (β) = 0.3, FedRCL supplementary Sec. E ("0.3 in FedNTD");
``temp`` (τ) = 1 (FedNTD's default); ``ce_weight`` = 1: the FedNTD paper's CE + β·L_NTD
(default, because that is the method's definition). The FedRCL authors' baseline code
weights CE by 1 − β (geehokim/FedACG ``clients/base_client.py``: ``weights["cls"] = 1 -
NTD.weight``, ``configs/client/NTD.yaml``: NTD 0.3, ce 0.7), i.e. 0.7·CE + 0.3·L_NTD: the
FedRCL paper YAMLs set ``ce_weight: 0.7``.
"""

from __future__ import annotations

import torch

from clients.base import FederatedClient
from fedrcl_flwr.components import non_negative, positive
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FedNTDClient(FederatedClient):
    method = "fedntd"
    defaults = {"beta": 0.3, "temp": 1.0, "ce_weight": 1.0}
    rules = {"beta": non_negative(), "temp": positive(), "ce_weight": non_negative()}

    def loss_terms(self):
        from fedrcl_flwr.losses.baselines import fedntd_loss

        terms = [cross_entropy_term(float(self.p["ce_weight"]))]
        beta, temp = float(self.p["beta"]), float(self.p["temp"])
        if beta == 0.0:
            return terms
        glob = self.frozen_model()

        def ntd(b):
            with torch.no_grad():
                g = glob(b.x)
            return fedntd_loss(b.logits, g, b.y, temp)

        terms.append(LossTerm("ntd", ntd, weight=beta))
        return terms
