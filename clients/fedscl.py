"""FedSCL — the naive supervised-contrastive ablation of FedRCL (paper Table 3):
CE + SCL (Eq. 2 for ``variant: paper``; the authors' hard-mined SCL for ``official``) on
the same levels, without the divergence penalty. Shows the representation collapse that
FedRCL's relaxation fixes."""

from __future__ import annotations

from clients import CLIENTS
from clients.fedrcl import FedRCLClient


class FedSCLClient(FedRCLClient):
    method = "fedscl"
    defaults, rules = CLIENTS.params(method)  # declared in clients/__init__.py

    def contrast_fn(self):
        from fedrcl_flwr.losses.rcl import scl_loss

        p = self.p
        return lambda feats, y: scl_loss(
            feats,
            y,
            tau=p["tau"],
            variant=p["variant"],
            topk_pos=int(p["topk_pos"]),
            topk_neg=int(p["topk_neg"]),
        )
