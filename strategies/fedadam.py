"""FedAdam (Reddi et al., ICLR 2021, "Adaptive Federated Optimization", Alg. 2):

    Δ_t = avg_i(w_i) − w_{t−1}
    m_t = β1·m_{t−1} + (1−β1)·Δ_t
    v_t = β2·v_{t−1} + (1−β2)·Δ_t²
    w_t = w_{t−1} + η·m_t / (sqrt(v_t) + τ)

Defaults β1 = 0.9, β2 = 0.99, τ = 1e-3 and server lr η = 0.01. The second moment starts
at v_{−1} = τ² (``v_init_tau_sq: true``, default): Reddi et al. Alg. 2 initialise
v_{−1} ≥ τ², and so do the FedRCL authors (skynbe/FedRCL ``servers/base.py``,
``ServerAdam.set_momentum``: ``global_v = 0 + tau * tau``); ``v_init_tau_sq: false``
starts it at 0. The momentum m starts at 0. Why not η = 1: in round 1 m/sqrt(v) ≈
0.1Δ/(0.1|Δ| + τ) ≈ sign(Δ) wherever |Δ| ≫ τ (either start of v), so η is the per-coordinate
step; η = 1 moves every weight by ~1 and diverges, while 0.01 (within the range Reddi et
al. tuned for CNNs) is stable. Acts on trainable parameters only.
"""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedStrategy, copy_arrays


class FedAdam(FederatedStrategy):
    name = "fedadam"
    defaults = {"server_lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3,
                "v_init_tau_sq": True}

    def __init__(self, **kw):
        super().__init__(**kw)
        v0 = float(self.p["tau"]) ** 2 if self.p["v_init_tau_sq"] else 0.0
        self.m = [np.zeros_like(w, dtype=np.float64) if k == "param" else None
                  for w, k in zip(self.weights, self.kinds)]
        self.v = [np.full_like(w, v0, dtype=np.float64) if k == "param" else None
                  for w, k in zip(self.weights, self.kinds)]

    def server_update(self, server_round, average):
        p = self.p
        b1, b2, tau, lr = float(p["beta1"]), float(p["beta2"]), float(p["tau"]), \
            float(p["server_lr"])
        new = []
        for j, (w, a, kind) in enumerate(zip(self.weights, average, self.kinds)):
            if kind != "param":
                new.append(a)
                continue
            w64 = w.astype(np.float64)
            delta = a.astype(np.float64) - w64
            self.m[j] = b1 * self.m[j] + (1 - b1) * delta
            self.v[j] = b2 * self.v[j] + (1 - b2) * delta * delta
            new.append((w64 + lr * self.m[j] / (np.sqrt(self.v[j]) + tau)).astype(w.dtype))
        self.weights = new

    def state_dict(self):
        return {**super().state_dict(), "m": copy_arrays(self.m), "v": copy_arrays(self.v)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.m, self.v = copy_arrays(state["m"]), copy_arrays(state["v"])
