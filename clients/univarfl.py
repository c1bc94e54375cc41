"""UniVarFL (2025, "Uniformity and Variance regularised Federated Learning").

Local objective (paper Eq. for the total loss): L = CE + μ·L_HE + λ·L_V

* L_V  — classifier variance regulariser: hinge on the batch variance of each class's
  softmax probability, pushing it up to that of an ideal (one-hot) classifier;
* L_HE — hyperspherical energy of the L2-normalised *projector output* (the model is
  built with ``model.params.projector: 256``), pushing features towards uniformity.

Defaults μ = 0.5, λ = D/4 (D = number of classes; ``lam: null``). ``variant: feduv``
switches to the FedUV formulation it builds on (std hinge + Gaussian-potential
uniformity; Son et al., CVPR 2024). Loss functions: ``fedrcl_flwr.losses.univarfl``.
"""

from __future__ import annotations

from clients.base import FederatedClient
from fedrcl_flwr.components import between, feature_tap, non_negative, one_of
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class UniVarFLClient(FederatedClient):
    method = "univarfl"
    defaults = {"mu": 0.5, "lam": -1.0, "variant": "univarfl", "feature": "penultimate",
                "eps": -1.0}
    rules = {"mu": non_negative(), "lam": between(0.0, also=(-1.0,)),
             "variant": one_of("univarfl", "feduv"), "feature": feature_tap(),
             "eps": between(0.0, lo_open=True, also=(-1.0,))}

    def loss_terms(self):
        from fedrcl_flwr.losses import univarfl as U

        p = self.p
        num_classes = self.data.num_classes
        lam = float(p["lam"]) if p["lam"] >= 0 else num_classes / 4.0
        feat = p["feature"]
        if p["variant"] == "univarfl":
            he_kw = {} if p["eps"] < 0 else {"eps": float(p["eps"])}
            var = lambda b: U.classifier_variance_loss(b.logits)  # noqa: E731
            uni = lambda b: U.hyperspherical_energy(b.feats[feat], **he_kw)  # noqa: E731
        else:  # feduv
            var = lambda b: U.feduv_std_loss(b.logits)  # noqa: E731
            uni = lambda b: U.feduv_uniformity_loss(b.feats[feat])  # noqa: E731
        return [cross_entropy_term(),
                LossTerm("variance", var, weight=lam),
                LossTerm("uniformity", uni, weight=float(p["mu"]), needs_features=True)]
