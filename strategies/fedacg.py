"""FedACG (Kim et al., CVPR 2024, "Communication-Efficient Federated Learning with
Accelerated Client Gradient").

The server broadcasts the look-ahead model  w̃_t = w_{t−1} + λ·M_{t−1}  (λ = 0.85);
clients add  β·Σ‖w − w̃_t‖²  (β = 0.001) to whatever local objective they use (β travels
in the fit instructions as :class:`FedACGParams`; the term is this strategy's
:meth:`FedACG.client_loss_terms`, which every client adds through the declared hook);
then

    Δ_t = avg_i(w_i) − w̃_t;   M_t = λ·M_{t−1} + Δ_t;   w_t = w_{t−1} + M_t = avg_i(w_i).

Momentum acts on trainable parameters; buffers are averaged, counters take the max.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrcl_flwr.components import between, non_negative
from fedrcl_flwr.protocol import StrategyParams
from strategies.server_optimizer import ServerOptimizer


@dataclass(frozen=True)
class FedACGParams(StrategyParams):
    """FedACG's value for the clients: β of their regulariser (``server.params.beta``)."""

    acg_beta: float


class FedACG(ServerOptimizer):
    name = "fedacg"
    defaults = {"lam": 0.85, "beta": 0.001}
    rules = {"lam": between(0, 1, hi_open=True), "beta": non_negative()}
    buffers = ("m_buf",)
    m_buf: list  # the server momentum, one entry per model entry (set from ``buffers``)

    def lookahead(self) -> list[np.ndarray]:
        lam = float(self.p["lam"])
        return [
            (w.astype(np.float64) + lam * m).astype(w.dtype) if m is not None else w
            for w, m in zip(self.weights, self.m_buf)
        ]

    def weights_to_send(self, run_round):
        return self.lookahead()

    def client_params(self, run_round):
        return FedACGParams(acg_beta=float(self.p["beta"]))

    @classmethod
    def client_loss_terms(cls, client, ins):
        """β·Σ‖w − w̃_t‖² over the client's trainable parameters (FedACG Alg. 1, the
        client's objective), w̃_t being the look-ahead model it received."""
        beta = ins.strategy_params(FedACGParams).acg_beta
        return [client.distance_to_received_term("acg", beta)]

    def reference(self):
        """Δ_t is measured from the look-ahead model w̃_t the clients started from."""
        return self.lookahead()

    def step(self, j, w, a, delta):
        """M_t = λ·M_{t−1} + Δ_t;  w_t = w_{t−1} + M_t, which is the average itself."""
        self.m_buf[j] = float(self.p["lam"]) * self.m_buf[j] + delta
        return a
