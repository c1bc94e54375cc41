"""FitNet as a federated baseline (Romero et al., ICLR 2015, "FitNets: Hints for Thin Deep
Nets"; used as a baseline by FedMLB and FedRCL): the received global model is the
teacher and the local model is hinted towards its representation,

    L = CE + λ·L_hint,   L_hint = mean((z − z_glob)²)

on the penultimate feature (teacher and student have the same width, so FitNets'
regressor is the identity). The teacher is a frozen, worker-cached second model instance
run under ``no_grad``. Loss term ``hint``;
:func:`fedrcl_flwr.losses.baselines.fitnet_hint_loss`.

Parameters: ``lam`` (λ) = 0.001, FedRCL supplementary Sec. E ("λ to 0.001 in FitNet");
``feature`` = ``penultimate``.
"""

from __future__ import annotations

import torch

from clients.base import FederatedClient
from fedrcl_flwr.components import feature_tap, non_negative
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FitNetClient(FederatedClient):
    method = "fitnet"
    defaults = {"lam": 0.001, "feature": "penultimate"}
    rules = {"lam": non_negative(), "feature": feature_tap()}

    def loss_terms(self):
        from fedrcl_flwr.losses.baselines import fitnet_hint_loss

        terms = [cross_entropy_term()]
        lam, feat = float(self.p["lam"]), self.p["feature"]
        if lam == 0.0:
            return terms
        glob = self.frozen_model()

        def hint(b):
            with torch.no_grad():
                z_glob = glob(b.x, return_features=True)[1][feat]
            return fitnet_hint_loss(b.feats[feat], z_glob)

        terms.append(LossTerm("hint", hint, weight=lam, needs_features=True))
        return terms
