"""FPL (Huang et al., CVPR 2023, "Rethinking Federated Learning with Domain Shift: A
Prototype View"; compared by FedCCL).

The server clusters the uploaded class prototypes of each class with FINCH and relays the
cluster means (``global_mode: finch_clusters`` of the SignalExchange: several prototypes
per class, FINCH's last partition as FPL's code). The local objective is

    L = CE + λ·(L_CPCL + L_UPCL)
    L_CPCL = −log( Σ_{c∈P_y} e^{cos(z, c)/τ} / Σ_{c∈P∪N} e^{cos(z, c)/τ} )   (clusters)
    L_UPCL = mean_dims (z − U_y)²,   U_y = mean of class y's cluster prototypes (unbiased)

averaged over the samples whose class has prototypes (loss term ``fpl``;
:func:`fedrcl_flwr.losses.baselines.fpl_loss`). Round one has no prototypes: CE only.

Clients upload class-mean prototypes of the penultimate feature after training
(:mod:`clients.fedproto`); ``max_age: 1`` keeps only the previous round's uploads, as
FPL's server uses the current participants.

Parameters: ``tau`` (τ) = 0.07 — FedCCL Sec. 5.1 sets the temperature to 0.07 "for all
experiments" (FPL's code uses 0.02); ``lam`` (λ) = 1 (FPL adds the two terms to CE with
weight 1); ``feature`` = ``penultimate``; ``embed_batch`` = 500.
"""

from __future__ import annotations

from clients import CLIENTS
from clients.fedproto import PrototypeClient
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FPLClient(PrototypeClient):
    method = "fpl"
    global_mode = "finch_clusters"
    defaults, rules = CLIENTS.params(method)  # declared in clients/__init__.py

    @classmethod
    def exchange_settings(cls, p: dict) -> dict:
        # RethinkFL's proto_aggregation: FINCH(cosine, ensure_early_exit=False), last level
        return {**super().exchange_settings(p), "finch_early_exit": False}

    def loss_terms(self):
        terms = [cross_entropy_term()]
        if self.global_protos is None:
            return terms
        from fedrcl_flwr.losses.baselines import fpl_loss

        pv, pl = self.global_protos
        feat, tau, c = self.p["feature"], float(self.p["tau"]), self.data.num_classes
        terms.append(
            LossTerm(
                "fpl",
                lambda b: fpl_loss(b.feats[feat], b.y, pv, pl, c, tau),
                weight=float(self.p["lam"]),
                needs_features=True,
            )
        )
        return terms
