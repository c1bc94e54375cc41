"""Fault injection for robustness tests: a FedAvg client that misbehaves on purpose.

A test double, not a method: it is not in ``clients.CLIENTS``; the test suite registers
it as ``client.method: faulty`` (``tests/conftest.py``).

``client.params``: ``mode`` — ``raise`` (exception), ``nan`` (NaN weights), ``inf``,
``shape`` (wrongly shaped arrays), ``missing`` (too few arrays), ``sleep`` (hangs for
``sleep_s`` seconds, to exercise round timeouts); ``partitions`` — the partition ids that
misbehave (``[-1]`` = all). Other partitions behave like FedAvg.
"""

from __future__ import annotations

import time

import numpy as np

from clients.base import FederatedClient
from fedrcl_flwr.components import Rule, non_negative, one_of


class FaultyClient(FederatedClient):
    method = "faulty"
    defaults = {"mode": "raise", "partitions": [-1], "sleep_s": 30.0}
    rules = {
        "mode": one_of("raise", "nan", "inf", "shape", "missing", "sleep"),
        "partitions": Rule(
            lambda v: all(isinstance(k, int) and not isinstance(k, bool) and k >= -1 for k in v),
            "must be a list of partition ids (or [-1] = all)",
            ([-2], ["a"]),
        ),
        "sleep_s": non_negative(),
    }

    def _misbehaves(self) -> bool:
        targets = list(self.p["partitions"])
        return -1 in targets or self.partition_id in targets

    def train_round(self, parameters, config):
        out = super().train_round(parameters, config)
        if self._misbehaves():
            if self.p["mode"] == "raise":
                raise RuntimeError(f"injected failure on partition {self.partition_id}")
            if self.p["mode"] == "sleep":
                time.sleep(float(self.p["sleep_s"]))
        return out

    def upload(self):
        weights = super().upload()
        if not self._misbehaves():
            return weights
        mode = self.p["mode"]
        if mode in ("nan", "inf"):
            bad = np.nan if mode == "nan" else np.inf
            return [
                w.astype(np.float32) * bad if np.issubdtype(w.dtype, np.floating) else w
                for w in weights
            ]
        if mode == "shape":
            return [np.zeros((3, 3), np.float32)] + weights[1:]
        if mode == "missing":
            return weights[:-1]
        return weights
