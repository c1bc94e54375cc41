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

from fedrcl_flwr.components import between, positive
from strategies.server_optimizer import ServerOptimizer


class FedAdam(ServerOptimizer):
    name = "fedadam"
    defaults = {
        "server_lr": 0.01,
        "beta1": 0.9,
        "beta2": 0.99,
        "tau": 1e-3,
        "v_init_tau_sq": True,
    }
    rules = {
        "server_lr": positive(),
        "beta1": between(0, 1, hi_open=True),
        "beta2": between(0, 1, hi_open=True),
        "tau": positive(),
    }
    buffers = ("m", "v")

    def buffer_fill(self, name: str) -> float:
        """v starts at τ² (Reddi et al.; FedRCL ``ServerAdam.set_momentum``) unless
        ``v_init_tau_sq: false`` (then 0); m starts at 0."""
        if name == "v" and self.p["v_init_tau_sq"]:
            return float(self.p["tau"]) ** 2
        return 0.0

    def step(self, j, w, a, delta):
        """m_t, v_t (the module doc) and w_t = w_{t−1} + η·m_t / (sqrt(v_t) + τ)."""
        p = self.p
        b1, b2, tau, lr = (
            float(p["beta1"]),
            float(p["beta2"]),
            float(p["tau"]),
            float(p["server_lr"]),
        )
        self.m[j] = b1 * self.m[j] + (1 - b1) * delta
        self.v[j] = b2 * self.v[j] + (1 - b2) * delta * delta
        w64 = w.astype(np.float64)
        return (w64 + lr * self.m[j] / (np.sqrt(self.v[j]) + tau)).astype(w.dtype)
