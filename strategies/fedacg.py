"""FedACG (Kim et al., CVPR 2024, "Communication-Efficient Federated Learning with
Accelerated Client Gradient").

The server broadcasts the look-ahead model  w̃_t = w_{t−1} + λ·M_{t−1}  (λ = 0.85);
clients add  β·Σ‖w − w̃_t‖²  (β = 0.001) to whatever local objective they use (the base
client adds this term whenever the fit config carries ``acg_beta``); then

    Δ_t = avg_i(w_i) − w̃_t;   M_t = λ·M_{t−1} + Δ_t;   w_t = w_{t−1} + M_t = avg_i(w_i).

Momentum acts on trainable parameters; buffers are averaged, counters take the max.
"""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedStrategy, copy_arrays


class FedACG(FederatedStrategy):
    name = "fedacg"
    defaults = {"lam": 0.85, "beta": 0.001}

    def __init__(self, **kw):
        super().__init__(**kw)
        self.m_buf = [np.zeros_like(w, dtype=np.float64) if k == "param" else None
                      for w, k in zip(self.weights, self.kinds)]

    def lookahead(self) -> list[np.ndarray]:
        lam = float(self.p["lam"])
        return [(w.astype(np.float64) + lam * m).astype(w.dtype) if m is not None else w
                for w, m in zip(self.weights, self.m_buf)]

    def weights_to_send(self, server_round):
        self._sent = self.lookahead()
        return self._sent

    def fit_extras(self, server_round, partition_id):
        return {"acg_beta": float(self.p["beta"])}

    def server_update(self, server_round, average):
        lam = float(self.p["lam"])
        sent = self.lookahead()
        for j, kind in enumerate(self.kinds):
            if kind == "param":
                delta = average[j].astype(np.float64) - sent[j].astype(np.float64)
                self.m_buf[j] = lam * self.m_buf[j] + delta
        self.weights = average

    def state_dict(self):
        return {**super().state_dict(), "momentum": copy_arrays(self.m_buf)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.m_buf = copy_arrays(state["momentum"])
