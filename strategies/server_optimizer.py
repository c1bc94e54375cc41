"""The base of the server optimizers, as Flower's ``FedOpt`` is of FedAdagrad / FedAdam /
FedYogi (``flwr/server/strategy/fedopt.py``): every optimizer in this folder turns the
clients' average into the new global model by the same loop,

    for each trainable parameter j:   Δ_j = avg_j − r_j   (float64)
                                      w_j ← step(j, w_j, avg_j, Δ_j)

where r is the point the pseudo-gradient is measured from (:meth:`ServerOptimizer.reference`:
the global model; FedACG: the look-ahead model it sent) and :meth:`ServerOptimizer.step`
updates the optimizer's declared buffers (``buffers``, indexed by j) and returns the new
entry in the model's dtype. BatchNorm buffers take the plain average and integer counters
the max (:func:`fedrcl_flwr.server.aggregation.entry_kinds`), untouched by the step.
"""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedStrategy
from strategies.screening import ClientResult


class ServerOptimizer(FederatedStrategy):
    """A server optimizer: the pseudo-gradient loop of the module doc; subclasses give
    :meth:`step` (and, where it differs, :meth:`reference` and :meth:`round_metrics`)."""

    def reference(self) -> list[np.ndarray]:
        """What the pseudo-gradient Δ = avg − r is measured from: the global model."""
        return self.weights

    def step(self, j: int, w: np.ndarray, a: np.ndarray, delta: np.ndarray) -> np.ndarray:
        """The new value of trainable entry ``j`` from its current value ``w``, its
        average ``a`` and the pseudo-gradient ``delta`` (float64); updates the buffers."""
        raise NotImplementedError

    def round_metrics(self, results: list[ClientResult]) -> dict | None:
        """Entries for the round's record (default none)."""
        return None

    def server_update(
        self, run_round: int, average: list[np.ndarray], results: list[ClientResult]
    ) -> dict | None:
        reference = self.reference()
        new = []
        for j, (w, a, kind) in enumerate(zip(self.weights, average, self.kinds)):
            if kind != "param":
                new.append(a)
                continue
            delta = a.astype(np.float64) - reference[j].astype(np.float64)
            new.append(self.step(j, w, a, delta))
        self.weights = new
        return self.round_metrics(results)
