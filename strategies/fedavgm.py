"""FedAvgM (Hsu et al., 2019, "Measuring the effects of non-identical data distribution"):
server momentum on the pseudo-gradient.

    Δ_t = avg_i(w_i) − w_{t−1};   M_t = m·M_{t−1} + Δ_t;   w_t = w_{t−1} + η·M_t

Defaults: m = 0.4 (FedRCL's Table 5 setting), server lr η = 1. Momentum acts on trainable
parameters only; buffers take the plain average and integer counters the max (see
``fedrcl_flwr.server.aggregation``).
"""

from __future__ import annotations

import numpy as np

from fedrcl_flwr.components import between, positive
from strategies.server_optimizer import ServerOptimizer


class FedAvgM(ServerOptimizer):
    name = "fedavgm"
    defaults = {"momentum": 0.4, "server_lr": 1.0}
    rules = {"momentum": between(0, 1, hi_open=True), "server_lr": positive()}
    buffers = ("m_buf",)

    def step(self, j, w, a, delta):
        """M_t = m·M_{t−1} + Δ_t;  w_t = w_{t−1} + η·M_t."""
        m, lr = float(self.p["momentum"]), float(self.p["server_lr"])
        self.m_buf[j] = m * self.m_buf[j] + delta
        return (w.astype(np.float64) + lr * self.m_buf[j]).astype(w.dtype)
