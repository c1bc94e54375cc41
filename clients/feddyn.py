"""FedDyn, client side (Acar et al., ICLR 2021, "Federated Learning Based on Dynamic
Regularization", Algorithm 1).

Client k, given the server model θ^{t−1}, minimises

    L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)·‖θ − θ^{t−1}‖²

(loss terms ``ce`` and ``dyn``; :func:`fedrcl_flwr.losses.baselines.feddyn_penalty`) and
then updates its gradient-correction state

    ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α·(θ_k^t − θ^{t−1}),   ∇L_k(θ_k^0) = 0.

The state is per client and must outlive the round: it is stored in the run's
``persistent_state_store()`` under the partition id, one float32 tensor per trainable parameter (CNN5 at 32×32 ≈ 8.9 MB per
client on disk; kept in float32 because it accumulates small corrections over rounds),
loaded at the client's next participation. At a first participation it is zero and the
linear term is skipped.

Server side: ``server.strategy: feddyn`` (``strategies/feddyn.py``), required (checked
before the run: this client with another server rule would not be FedDyn), keeps h and
sends θ^t = mean(θ_k^t) − h^t/α. α is one key, ``server.params.alpha`` (0.1, FedDyn's
CIFAR setting; not listed in FedRCL Sec. E), sent to the clients in the fit instructions
as the strategy's :class:`strategies.feddyn.FedDynParams` (``feddyn_alpha``), as FedACG
sends its β; this client has no parameters of its own.
"""

from __future__ import annotations

import torch

from clients.base import FederatedClient
from fedrcl_flwr.training import LossTerm, cross_entropy_term
from strategies.feddyn import FedDynParams

STATE_NAME = "feddyn_grad"


class FedDynClient(FederatedClient):
    method = "feddyn"
    strategies = ("feddyn",)

    def _named_trainable(self):
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def on_round_start(self, ins):
        self.alpha = ins.strategy_params(FedDynParams).feddyn_alpha
        state = self.persistent_state_store().load(self.partition_id, STATE_NAME)
        self.dyn_grads = None
        if state is not None:
            self.dyn_grads = [
                state[n].to(self.device, torch.float32) for n, _ in self._named_trainable()
            ]

    def loss_terms(self):
        from fedrcl_flwr.losses.baselines import feddyn_penalty

        alpha, anchors, grads = self.alpha, self.received_trainable(), self.dyn_grads

        def dyn(b):
            params = [p for p in b.model.parameters() if p.requires_grad]
            return feddyn_penalty(params, anchors, grads, alpha)

        return [cross_entropy_term(), LossTerm("dyn", dyn)]

    @torch.no_grad()
    def on_round_end(self, report):
        alpha = self.alpha
        named = self._named_trainable()
        anchors = self.received_trainable()
        grads = self.dyn_grads or [torch.zeros_like(p) for _, p in named]
        new = {
            n: (g - alpha * (p.detach() - a)).float().cpu()
            for (n, p), a, g in zip(named, anchors, grads)
        }
        self.persistent_state_store().save(self.partition_id, STATE_NAME, new)
        report.method_metrics["feddyn_state"] = int(self.dyn_grads is not None)
