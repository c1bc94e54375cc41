"""FedACG (Kim et al., CVPR 2024, "Communication-Efficient Federated Learning with
Accelerated Client Gradient").

The server broadcasts the look-ahead model  w̃_t = w_{t−1} + λ·M_{t−1}  (λ = 0.85);
clients add  β·Σ‖w − w̃_t‖²  (β = 0.001) to whatever local objective they use (β travels
in the fit instructions as :class:`FedACGParams`; the term is this strategy's
:meth:`FedACG.client_loss_terms`, which every client adds through the declared hook);
then

    Δ_t = avg_i(w_i) − w̃_t;   M_t = λ·M_{t−1} + Δ_t;   w_t = w_{t−1} + M_t = avg_i(w_i).

Momentum acts on trainable parameters; buffers are averaged, counters take the max.

The arithmetic (``server.params.arithmetic``): ``float64`` (ours, the default) keeps M in
float64, forms w + λ·M in float64 and rounds it once, and measures Δ_t as the float32
average minus the look-ahead in float64. ``float32`` is the authors' order
(geehokim/FedACG @ 62b6e95 ``servers/base.py`` ``ServerM.FedACG_lookahead`` and
``aggregate``; ``trainers/base_trainer.py``): everything in float32, the look-ahead
``w + float32(λ)·M``, each client's delta ``w_i − w̃_t`` rounded, their sum client by client
divided by the number of clients, ``M = float32(λ)·M + Δ``, and (``server.weighting:
uniform``) the new model their ``sum(local_weights) / C`` client by client (with two
clients the same number as the default average). The same formulas, different
rounding; in float32 the runs then equal theirs bit for bit
(``benchmarks/fidelity/lockstep.py --code fedacg``). With ``privacy.dp`` or
``privacy.secagg`` the per-client uploads are not what the model may learn from (clipped
and noised, or masked), so Δ_t is then the float32 average minus the look-ahead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrcl_flwr.app.wire.transport import arrays_of
from fedrcl_flwr.components import between, non_negative, one_of
from fedrcl_flwr.protocol import StrategyParams
from fedrcl_flwr.weights.entries import StoreError
from strategies.screening import ClientResult
from strategies.server_optimizer import ServerOptimizer


@dataclass(frozen=True)
class FedACGParams(StrategyParams):
    """FedACG's value for the clients: β of their regulariser (``server.params.beta``)."""

    acg_beta: float


class FedACG(ServerOptimizer):
    name = "fedacg"
    defaults = {"lam": 0.85, "beta": 0.001, "arithmetic": "float64"}
    rules = {
        "lam": between(0, 1, hi_open=True),
        "beta": non_negative(),
        "arithmetic": one_of("float64", "float32"),
    }
    buffers = ("m_buf",)
    m_buf: list  # the server momentum, one entry per model entry (set from ``buffers``)

    def lookahead(self) -> list[np.ndarray]:
        """w̃_t = w_{t−1} + λ·M_{t−1} in the configured arithmetic (module doc)."""
        if self.p["arithmetic"] == "float32":
            lam32 = np.float32(self.p["lam"])
            return [
                w + lam32 * m.astype(np.float32) if m is not None and w.dtype == np.float32 else w
                for w, m in zip(self.weights, self.m_buf)
            ]
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

    def server_update(self, run_round, average, results):
        if self.p["arithmetic"] != "float32":
            return super().server_update(run_round, average, results)
        sent = self.lookahead()
        clients, fallback = self._client_uploads(results)
        lam32, count = np.float32(self.p["lam"]), np.float32(len(clients))
        new = list(average)
        for j, (a, kind) in enumerate(zip(average, self.kinds)):
            if kind != "param" or a.dtype != np.float32:
                continue
            if clients:
                total = clients[0][j] - sent[j]
                for arrays in clients[1:]:
                    total = total + (arrays[j] - sent[j])
                delta = total / count
                if self.weighting == "uniform":  # their aggregate: sum(local_weights) / C
                    summed = clients[0][j].astype(np.float32)
                    for arrays in clients[1:]:
                        summed = summed + arrays[j]
                    new[j] = summed / count
            else:
                delta = a - sent[j]
            momentum = lam32 * self.m_buf[j].astype(np.float32) + delta
            self.m_buf[j] = momentum.astype(np.float64)  # float32 values, kept exactly
        self.weights = new
        return {"fedacg_average_delta": 1} if fallback else None

    def _client_uploads(self, results: list[ClientResult]) -> tuple[list, bool]:
        """Each kept client's model as a checked copy of its own (read again: a value of
        the store is used only as read and hashed), in the round's order; none with
        privacy (the model learns from the clipped, noised or masked sum only). A copy
        that no longer reads (the store damaged since the average) leaves the round to
        the average's Δ, said in the round's record (``fedacg_average_delta``)."""
        if self.dp is not None or self.secagg:
            return [], False
        try:
            return [arrays_of(r.fit_res.parameters) for r in results], False
        except StoreError:
            return [], True
