"""FedPCL with parameter averaging (Tan et al., NeurIPS 2022, "Federated Learning from
Pre-Trained Models: A Contrastive Learning Approach"; compared this way by FedCCL).

Prototype-wise contrastive learning against the global prototypes and the other clients'
local prototypes, with s(z, c) = ⟨z/‖z‖, c⟩ and prototypes = class means of L2-normalised
features:

    L_g = −log( e^{s(z, C̄_y)/τ} / Σ_c e^{s(z, C̄_c)/τ} )
    L_p = (1/m) Σ_i −log( e^{s(z, C_i^y)/τ} / Σ_c e^{s(z, C_i^c)/τ} )
    L   = CE + w_g·L_g + w_p·L_p

(loss terms ``ce``, ``pcl_global``, ``pcl_local``;
:func:`fedrcl_flwr.losses.baselines.fedpcl_loss`). Deviations, all documented there:

* the SignalExchange relays the banked client prototypes without client identity, so L_p
  contrasts each positive prototype (one per client holding class y) with all the other
  classes' prototypes pooled over clients;
* CE is kept (``ce_weight``): FedPCL classifies by nearest prototype and trains only a
  projection on frozen pre-trained backbones; here the whole model is trained from scratch
  (no pre-trained backbone unless the model provides one) and the global model is
  evaluated through its classifier, which needs CE to be trained.

Server: ``global_mode: mean`` (count-weighted mean of the uploaded prototypes per class),
``send_local: true`` (the banked uploads are relayed), ``max_age: 1``. Round one has no
prototypes: CE only.

Parameters: ``tau`` (τ) = 0.07 (FedPCL's and FedCCL's temperature); ``w_global`` = 1,
``w_local`` = 1 (FedPCL adds the two); ``ce_weight`` = 1; ``feature`` = ``penultimate``;
``embed_batch`` = 500.
"""

from __future__ import annotations

from clients.fedproto import PrototypeClient
from fedrcl_flwr.components import at_least, feature_tap, non_negative, positive
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FedPCLClient(PrototypeClient):
    method = "fedpcl"
    send_local = True
    normalize_protos = True
    defaults = {
        "tau": 0.07,
        "w_global": 1.0,
        "w_local": 1.0,
        "ce_weight": 1.0,
        "feature": "penultimate",
        "embed_batch": 500,
    }
    rules = {
        "tau": positive(),
        "w_global": non_negative(),
        "w_local": non_negative(),
        "ce_weight": non_negative(),
        "feature": feature_tap(),
        "embed_batch": at_least(1),
    }

    def loss_terms(self):
        if self.global_protos is None:
            return [cross_entropy_term()]  # nothing to contrast with yet
        terms = [cross_entropy_term(float(self.p["ce_weight"]))]
        from fedrcl_flwr.losses.baselines import fedpcl_loss

        gv, gl = self.global_protos
        lv, ll = self.local_protos if self.local_protos is not None else (None, None)
        feat, tau = self.p["feature"], float(self.p["tau"])

        def both(b):  # one similarity pass per step, shared by both terms
            if "pcl" not in b.extra:
                b.extra["pcl"] = fedpcl_loss(b.feats[feat], b.y, gv, gl, lv, ll, tau)
            return b.extra["pcl"]

        terms.append(
            LossTerm(
                "pcl_global",
                lambda b: both(b)[0],
                weight=float(self.p["w_global"]),
                needs_features=True,
            )
        )
        if lv is not None:
            terms.append(
                LossTerm(
                    "pcl_local",
                    lambda b: both(b)[1],
                    weight=float(self.p["w_local"]),
                    needs_features=True,
                )
            )
        return terms
