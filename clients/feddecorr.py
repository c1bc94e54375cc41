"""FedDecorr (Shi et al., ICLR 2023, "Towards Understanding and Mitigating Dimensional
Collapse in Heterogeneous Federated Learning").

Local objective: L = CE + β·L_FedDecorr on the penultimate representation z of the batch,

    ẑ = (z − mean) / sqrt(ε + var),   L_FedDecorr = mean_{i≠j}((ẑᵀẑ)_ij²) / N

which is the official code's normalisation of the paper's (1/d²)·‖K‖_F² (K the
correlation matrix); see :func:`fedrcl_flwr.losses.baselines.feddecorr_loss` for the
exact relation. Loss term ``decorr``.

Parameters: ``beta`` (β) = 0.01, FedRCL supplementary Sec. E ("0.01 in FedDecorr");
``feature`` = ``penultimate``.
"""

from __future__ import annotations

from clients.base import FederatedClient
from fedrcl_flwr.components import feature_tap, non_negative
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FedDecorrClient(FederatedClient):
    method = "feddecorr"
    defaults = {"beta": 0.01, "feature": "penultimate"}
    rules = {"beta": non_negative(), "feature": feature_tap()}

    def loss_terms(self):
        from fedrcl_flwr.losses.baselines import feddecorr_loss

        feat = self.p["feature"]
        return [
            cross_entropy_term(),
            LossTerm(
                "decorr",
                lambda b: feddecorr_loss(b.feats[feat]),
                weight=float(self.p["beta"]),
                needs_features=True,
            ),
        ]
