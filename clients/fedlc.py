"""FedLC (Zhang et al., ICML 2022, "Federated Learning with Label Distribution Skew via
Logits Calibration").

Local objective: the calibrated cross-entropy, replacing CE,

    L_cal = −log( e^{f_y(x) − τ·n_y^{−1/4}} / Σ_c e^{f_c(x) − τ·n_c^{−1/4}} )

with n_c the client's local count of class c (loss term ``lc``;
:func:`fedrcl_flwr.losses.baselines.fedlc_loss`). Classes the client does not hold have an
infinite offset (n_c = 0): by default (``absent: drop``) they leave the softmax, which is
what the code behind FedRCL's tables does via exp(−inf) = 0; ``absent: clamp`` counts
them as 1 instead (finite offset τ).

Parameters: ``tau`` (τ) = 1, FedRCL supplementary Sec. E ("τ in FedLC ... set to 1");
``absent`` = ``drop``.
"""

from __future__ import annotations

import torch

from clients.base import FederatedClient
from fedrcl_flwr.components import non_negative, one_of
from fedrcl_flwr.training import LossTerm


class FedLCClient(FederatedClient):
    method = "fedlc"
    defaults = {"tau": 1.0, "absent": "drop"}
    rules = {"tau": non_negative(), "absent": one_of("drop", "clamp")}

    def loss_terms(self):
        from fedrcl_flwr.losses.baselines import fedlc_loss

        counts = torch.as_tensor(self.data.class_counts(), dtype=torch.float32, device=self.device)
        tau, absent = float(self.p["tau"]), self.p["absent"]
        return [LossTerm("lc", lambda b: fedlc_loss(b.logits, b.y, counts, tau, absent))]
