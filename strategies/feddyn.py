"""FedDyn, server side (Acar et al., ICLR 2021, "Federated Learning Based on Dynamic
Regularization", Algorithm 1):

    h^t = h^{t−1} − α·(1/m)·Σ_{k∈P_t} (θ_k^t − θ^{t−1})
    θ^t = (1/|P_t|)·Σ_{k∈P_t} θ_k^t − (1/α)·h^t

with m = ``federation.num_clients`` (all clients, not the sampled ones), P_t the clients
whose results were kept this round and h^0 = 0, on trainable parameters; buffers are
averaged and counters take the max (``fedrcl_flwr/server/aggregation.py``). The mean over P_t is
the configured ``server.weighting`` average (uniform, as the paper, by default); the
h-update uses |P_t|·(mean − θ^{t−1}) for the sum, exact under uniform weighting.

Pair with ``client.method: feddyn`` (its client regulariser and gradient state): α is sent
to the clients in the fit instructions (:class:`FedDynParams`, entry ``feddyn_alpha``), as
FedACG sends its β, so it is set in one place. Any other client method also runs: the
server correction then acts on plain local updates. ``server.params.alpha`` (α) = 0.1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrcl_flwr.components import positive
from fedrcl_flwr.protocol import StrategyParams
from strategies.server_optimizer import ServerOptimizer


@dataclass(frozen=True)
class FedDynParams(StrategyParams):
    """FedDyn's value for the clients: α (``server.params.alpha``), read by
    ``clients/feddyn.py``."""

    feddyn_alpha: float


class FedDyn(ServerOptimizer):
    name = "feddyn"
    defaults = {"alpha": 0.1}
    rules = {"alpha": positive()}
    buffers = ("h",)

    def client_params(self, run_round):
        return FedDynParams(feddyn_alpha=float(self.p["alpha"]))  # the one α

    def server_update(self, run_round, average, results):
        """h and θ^t from the average of the |P_t| = ``len(results)`` kept clients."""
        self.kept_fraction = len(results) / float(self.num_clients)  # |P_t| / m
        return super().server_update(run_round, average, results)

    def step(self, j, w, a, delta):
        """h^t = h^{t−1} − α·(|P_t|/m)·Δ_t;  θ^t = avg − h^t/α (Δ_t = avg − θ^{t−1})."""
        alpha = float(self.p["alpha"])
        self.h[j] = self.h[j] - alpha * self.kept_fraction * delta
        return (a.astype(np.float64) - self.h[j] / alpha).astype(a.dtype)

    def round_metrics(self, results):
        """``feddyn_h_norm``: ‖h^t‖ over the trainable parameters."""
        h_norm = float(np.sqrt(sum(float((h**2).sum()) for h in self.h if h is not None)))
        return {"feddyn_h_norm": h_norm}
