"""FedRCL (Seo et al., CVPR 2024, "Relaxed Contrastive Learning for Federated Learning").

Local objective (paper Algorithm 1, line 10): L = CE + L_RCL, where L_RCL (Eq. 5) is the supervised
contrastive loss plus a divergence penalty that relaxes it for same-class pairs whose
similarity exceeds λ, applied to the pooled features of several levels (stem + the four
ResNet stages) and averaged over levels. The loss itself is
:func:`fedrcl_flwr.losses.rcl.rcl_loss`; ``variant: official`` is what produced the paper's
tables (hard mining as released), ``variant: paper`` is Eq. 5 as written.

Parameters (``client.params``): ``beta`` (penalty weight β, 1.0), ``tau`` (temperature,
0.05), ``lam`` (threshold λ, 0.7), ``rcl_weight`` (weight of L_RCL, 1.0), ``levels``
(``[all]`` = every tap in ``model.levels``; ``[last]`` = last stage only, Table 4; or
explicit names), ``variant``, ``topk_pos`` (1), ``topk_neg`` (2).

The authors' schedule: SGD lr 0.1, decay 0.998/round, wd 1e-3, no momentum, 5 local
epochs, 10 iterations per epoch, grad clip 10 (``experiments/fedrcl/``).
"""

from __future__ import annotations

from clients.base import FederatedClient
from fedrcl_flwr.components import (
    at_least,
    between,
    non_negative,
    one_of,
    positive,
    resolve_levels,
    tap_levels,
)
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FedRCLClient(FederatedClient):
    method = "fedrcl"
    defaults = {
        "beta": 1.0,
        "tau": 0.05,
        "lam": 0.7,
        "rcl_weight": 1.0,
        "levels": ["all"],
        "variant": "official",
        "topk_pos": 1,
        "topk_neg": 2,
    }
    rules = {
        "beta": non_negative(),
        "tau": positive(),
        "lam": between(-1, 1),
        "rcl_weight": non_negative(),
        "levels": tap_levels(),
        "variant": one_of("official", "paper"),
        "topk_pos": at_least(1),
        "topk_neg": at_least(1),
    }

    def contrast_fn(self):
        from fedrcl_flwr.losses.rcl import rcl_loss

        p = self.p
        return lambda feats, y: rcl_loss(
            feats,
            y,
            tau=p["tau"],
            lam=p["lam"],
            beta=p["beta"],
            variant=p["variant"],
            topk_pos=int(p["topk_pos"]),
            topk_neg=int(p["topk_neg"]),
        )

    def loss_terms(self):
        levels = resolve_levels(self.p["levels"], tuple(self.model.levels))
        contrast = self.contrast_fn()
        term = LossTerm(
            "rcl",
            lambda b: contrast([b.feats[lv] for lv in levels], b.y),
            weight=float(self.p["rcl_weight"]),
            needs_features=True,
        )
        return [cross_entropy_term(), term]
