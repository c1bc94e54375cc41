"""FedDyn, server side (Acar et al., ICLR 2021, "Federated Learning Based on Dynamic
Regularization", Algorithm 1):

    h^t = h^{t−1} − α·(1/m)·Σ_{k∈P_t} (θ_k^t − θ^{t−1})
    θ^t = (1/|P_t|)·Σ_{k∈P_t} θ_k^t − (1/α)·h^t

with m = ``federation.num_clients`` (all clients, not the sampled ones), P_t the clients
whose results were kept this round and h^0 = 0, on trainable parameters; buffers are
averaged and counters take the max (``strategies/aggregation.py``). The mean over P_t is
the configured ``server.weighting`` average (uniform, as the paper, by default); the
h-update uses |P_t|·(mean − θ^{t−1}) for the sum, exact under uniform weighting.

Pair with ``client.method: feddyn`` (its client regulariser and gradient state, with the
same α). Any other client method also runs: the server correction then acts on plain
local updates. ``server.params.alpha`` (α) = 0.1.
"""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedStrategy, copy_arrays


class FedDyn(FederatedStrategy):
    name = "feddyn"
    defaults = {"alpha": 0.1}

    def __init__(self, **kw):
        super().__init__(**kw)
        if float(self.p["alpha"]) <= 0:
            from fedrcl_flwr.config import ConfigError

            raise ConfigError("server.params.alpha must be > 0 for feddyn")
        self.h = [np.zeros_like(w, dtype=np.float64) if k == "param" else None
                  for w, k in zip(self.weights, self.kinds)]
        self._pending = None

    def server_update(self, server_round, average):
        # h needs |P_t|, known in after_aggregate (called right after, same round)
        self._pending = (self.weights, average)
        self.weights = average

    def after_aggregate(self, server_round, results):
        prev, average = self._pending
        self._pending = None
        alpha, frac = float(self.p["alpha"]), len(results) / float(self.num_clients)
        new = []
        for j, kind in enumerate(self.kinds):
            if kind != "param":
                new.append(average[j])
                continue
            avg = average[j].astype(np.float64)
            self.h[j] = self.h[j] - alpha * frac * (avg - prev[j].astype(np.float64))
            new.append((avg - self.h[j] / alpha).astype(average[j].dtype))
        self.weights = new
        h_norm = float(np.sqrt(sum(float((h ** 2).sum()) for h in self.h if h is not None)))
        return {"feddyn_h_norm": h_norm}

    def state_dict(self):
        return {**super().state_dict(), "h": copy_arrays(self.h)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.h = copy_arrays(state["h"])
