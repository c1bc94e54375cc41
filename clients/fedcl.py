"""FedCL — the self-supervised contrastive ablation of FedRCL (paper Table 3):
CE + InfoNCE between two augmented views of each image (SimCLR-style, no labels in the
contrastive term), on the same feature levels as FedRCL (mean over levels).

The second view is made on the fly from the (already augmented) batch by a random crop
and flip (``fedrcl_flwr.augment.random_crop_flip``), so no second data pass is needed.
"""

from __future__ import annotations

from clients.base import FederatedClient
from fedrcl_flwr.augment import random_crop_flip
from fedrcl_flwr.components import non_negative, positive, resolve_levels, tap_levels
from fedrcl_flwr.losses.contrastive import info_nce
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FedCLClient(FederatedClient):
    method = "fedcl"
    defaults = {"tau": 0.5, "cl_weight": 1.0, "levels": ["all"], "pad": 4}
    rules = {
        "tau": positive(),
        "cl_weight": non_negative(),
        "levels": tap_levels(),
        "pad": non_negative(),
    }

    def loss_terms(self):
        levels = resolve_levels(self.p["levels"], tuple(self.model.levels))
        tau, pad = float(self.p["tau"]), int(self.p["pad"])

        def fn(b):
            _, f2 = b.model(random_crop_flip(b.x, pad=pad), return_features=True)
            return sum(info_nce(b.feats[lv], f2[lv], tau) for lv in levels) / len(levels)

        return [
            cross_entropy_term(),
            LossTerm("cl", fn, weight=float(self.p["cl_weight"]), needs_features=True),
        ]
