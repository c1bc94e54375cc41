"""Fault injection for robustness tests: a FedAvg client that misbehaves on purpose.

``client.params``: ``mode`` — ``raise`` (exception), ``nan`` (NaN weights), ``inf``,
``shape`` (wrongly shaped arrays), ``missing`` (too few arrays), ``sleep`` (hangs for
``sleep_s`` seconds, to exercise round timeouts); ``partitions`` — the partition ids that
misbehave (``[-1]`` = all). Other partitions behave like FedAvg.
"""

from __future__ import annotations

import time

import numpy as np

from clients import CLIENTS
from clients.base import FederatedClient


class FaultyClient(FederatedClient):
    method = "faulty"
    defaults, rules = CLIENTS.params(method)  # declared in clients/__init__.py

    def fit(self, parameters, config):
        weights, n, metrics = super().fit(parameters, config)
        targets = list(self.p["partitions"])
        if -1 not in targets and self.partition_id not in targets:
            return weights, n, metrics
        mode = self.p["mode"]
        if mode == "raise":
            raise RuntimeError(f"injected failure on partition {self.partition_id}")
        if mode in ("nan", "inf"):
            bad = np.nan if mode == "nan" else np.inf
            weights = [w.astype(np.float32) * bad if np.issubdtype(w.dtype, np.floating)
                       else w for w in weights]
        elif mode == "shape":
            weights = [np.zeros((3, 3), np.float32)] + weights[1:]
        elif mode == "missing":
            weights = weights[:-1]
        elif mode == "sleep":
            time.sleep(float(self.p["sleep_s"]))
        return weights, n, metrics
