"""UniVarFL (2025, "Uniformity and Variance regularised Federated Learning").

Local objective (paper Eq. for the total loss): L = CE + μ·L_HE + λ·L_V

* L_V  — classifier variance regulariser: hinge on the batch variance of each class's
  softmax probability, pushing it up to that of an ideal (one-hot) classifier;
* L_HE — hyperspherical energy of the L2-normalised *projector output*, pushing features
  towards uniformity.

``client.params`` and their defaults: ``mu: 0.5`` (μ), ``lam: -1.0`` (λ; -1 means D/4,
D = number of classes — the paper's Sec. 4 values), ``variant: univarfl`` (``feduv``
switches to the FedUV formulation it builds on: std hinge + Gaussian-potential
uniformity; Son et al., CVPR 2024), ``feature: penultimate`` (the tap L_HE acts on: the
projector output when the model has one), ``eps: -1.0`` (ε of Eq. 3; -1 means
``losses.univarfl.DEFAULT_HE_EPS``). Loss functions: ``fedrcl_flwr.losses.univarfl``.

The model: UniVarFL Sec. 4 ("consistent with [MOON], we adopt a two-layer projector
(batch normalization + ReLU)": 256 wide on its CNN, 512 on ResNet-18), as FedUV's code
(sonhamin/FedUV ``nets/models.py``: fc1-BN-ReLU, fc2-BN-ReLU, then the classifier, in
every network; ``--out_dim`` 256). Without it the method is not the paper's and can sit
at chance for many rounds (digits, MNIST), so a config without
``model.params.projector`` is refused before the run (:meth:`check_config`); set it to
256 / 512, or to 0 to run without a projector on purpose (an ablation).
"""

from __future__ import annotations

from clients.base import FederatedClient
from fedrcl_flwr.components import between, feature_tap, non_negative, one_of
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class UniVarFLClient(FederatedClient):
    method = "univarfl"
    defaults = {
        "mu": 0.5,
        "lam": -1.0,
        "variant": "univarfl",
        "feature": "penultimate",
        "eps": -1.0,
    }
    rules = {
        "mu": non_negative(),
        "lam": between(0.0, also=(-1.0,)),
        "variant": one_of("univarfl", "feduv"),
        "feature": feature_tap(),
        "eps": between(0.0, lo_open=True, also=(-1.0,)),
    }

    @classmethod
    def check_config(cls, cfg, p) -> None:
        """The paper's model has a projector: refuse a model without an explicit
        ``model.params.projector`` (0 = none, on purpose)."""
        if "projector" not in (cfg.model.params or {}):
            raise ConfigError(
                "client.method 'univarfl' needs model.params.projector (the paper's "
                "two-layer projector: 256 on its CNN, 512 on ResNet-18; e.g. --set "
                "model.params.projector=256), or model.params.projector: 0 to run "
                "without one on purpose"
            )

    def loss_terms(self):
        from fedrcl_flwr.losses import univarfl as U

        p = self.p
        num_classes = self.data.num_classes
        lam = float(p["lam"]) if p["lam"] >= 0 else num_classes / 4.0
        feat = p["feature"]
        if p["variant"] == "univarfl":
            he_kw = {} if p["eps"] < 0 else {"eps": float(p["eps"])}
            var = lambda b: U.classifier_variance_loss(b.logits)  # noqa: E731 - one-liners
            uni = lambda b: U.hyperspherical_energy(b.feats[feat], **he_kw)  # noqa: E731 - one-liners
        else:  # feduv
            var = lambda b: U.feduv_std_loss(b.logits)  # noqa: E731 - one-liners
            uni = lambda b: U.feduv_uniformity_loss(b.feats[feat])  # noqa: E731 - one-liners
        return [
            cross_entropy_term(),
            LossTerm("variance", var, weight=lam),
            LossTerm("uniformity", uni, weight=float(p["mu"]), needs_features=True),
        ]
