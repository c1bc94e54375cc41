"""FedSCL — the naive supervised-contrastive ablation of FedRCL (paper Table 3):
CE + SCL (Eq. 2 for ``variant: paper``; the authors' hard-mined SCL for ``official``) on
the same levels, without the divergence penalty. Shows the representation collapse that
FedRCL's relaxation fixes."""

from __future__ import annotations

from clients.fedrcl import FedRCLClient


class FedSCLClient(FedRCLClient):
    method = "fedscl"
    # FedRCL's parameters less the divergence penalty's (beta, lam)
    defaults = {k: v for k, v in FedRCLClient.defaults.items() if k not in ("beta", "lam")}
    rules = {k: v for k, v in FedRCLClient.rules.items() if k not in ("beta", "lam")}

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
