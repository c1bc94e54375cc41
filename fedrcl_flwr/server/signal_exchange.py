"""Server side of signal-exchanging methods (FedCCL; FedProto, FPL reuse it).

Attached to *any* server-optimizer strategy (it does not touch the model update), it

1. receives each client's uploaded signals (the ``signals`` of its fit report,
   ``fedrcl_flwr/protocol.py``), validates them and rejects malformed uploads without
   stopping the round;
2. keeps a bounded bank with the most recent upload of each client, dropping uploads older
   than ``max_age`` rounds — with 2–5 % participation each round then sees signals from
   many more clients than the handful it samples. Memory: at most
   ``num_clients × max_signals_per_client × dim × 4`` bytes, in practice
   (clients seen in the last ``max_age`` rounds) × (signals per client) × dim × 4, e.g.
   25 clients × 30 signals × 128-d ≈ 0.4 MB;
3. computes the global signals (``global_mode``):
   * ``finch_mean`` — FedCCL Eqs. 14-15: FINCH (cosine) over all banked signals of a
     class, the mean of each global cluster, then the average of a class's global
     clusters: one global signal per class;
   * ``mean`` — class mean of the banked signals: count-weighted with ``mean_weighting:
     samples`` (FedProto here), a plain average with ``uniform`` (FedCCL Eq. 12,
     H_j = (1/|N_j|) Σ ξ̄: the default of FedCCL's Table 7 "global averaged" ablation);
   * ``finch_clusters`` — the global cluster means themselves, several per class (FPL);
   FINCH runs with its early exit on by default; ``finch_early_exit: false`` keeps every
   level down to the last merge, as FPL's code (RethinkFL ``proto_aggregation``:
   ``FINCH(..., distance='cosine', ensure_early_exit=False)``, last partition) does;
   the global signals come class by class, classes ``sorted`` (``class_order``, the
   default) or in order of ``first_seen`` in the bank (clients by partition id, each
   client's signals in the order it sent them: FPL's code, whose dict of classes grows
   in that order when its clients come in id order);
4. sends every sampled client the banked local signals (``signals_local``) and the
   global signals (``signals_global``) in its fit instructions;
5. logs the bytes of signals uploaded / downloaded per round next to the model bytes
   (the paper's communication claim).
"""

from __future__ import annotations

import logging

import numpy as np

from fedrcl_flwr.clustering import DISTANCES
from fedrcl_flwr.components import at_least, one_of, resolve_params
from fedrcl_flwr.protocol import FitReport
from fedrcl_flwr.signals import (
    CLASS_ORDERS,
    SignalError,
    SignalSet,
    classes_in_order,
    decode_signals,
    encode_signals,
)

log = logging.getLogger("fedrcl_flwr")

GLOBAL_MODES = ("finch_mean", "mean", "finch_clusters")


class SignalExchange:
    defaults = {
        "max_age": 5,
        "global_mode": "finch_mean",
        "distance": "cosine",
        "max_signals_per_client": 1000,
        "send_local": True,
        "mean_weighting": "samples",
        "finch_early_exit": True,
        "class_order": "sorted",
    }
    rules = {
        "max_age": at_least(1),
        "global_mode": one_of(*GLOBAL_MODES),
        "distance": one_of(*DISTANCES),
        "max_signals_per_client": at_least(1),
        "mean_weighting": one_of("samples", "uniform"),
        "class_order": one_of(*CLASS_ORDERS),
    }

    def __init__(self, params: dict | None = None, num_classes: int | None = None):
        self.p = resolve_params(
            "server.signals", "the signal exchange", self.defaults, self.rules, params
        )
        self.num_classes = num_classes
        self.dim: int | None = None
        self.bank: dict[int, tuple[int, SignalSet]] = {}
        self._round_cache: tuple[int, tuple[bytes | None, bytes | None]] | None = None
        self.global_signals = SignalSet.empty()
        self.rejected = 0

    # ----------------------------------------------------------------- global
    def compute_global(self, local: SignalSet) -> SignalSet:
        if not len(local):
            return SignalSet.empty(local.vectors.shape[1] if local.vectors.ndim == 2 else 0)
        mode = self.p["global_mode"]
        vecs, labs, cnts = [], [], []
        for c in classes_in_order(local.labels, self.p["class_order"]):
            m = local.labels == c
            v, n = local.vectors[m], local.counts[m]
            if mode == "mean":
                if self.p["mean_weighting"] == "uniform":  # FedCCL Eq. 12
                    vecs.append(v.mean(0))
                else:
                    vecs.append((v * n[:, None]).sum(0) / n.sum())
                labs.append(c)
                cnts.append(int(n.sum()))
                continue
            if len(v) >= 2:
                from fedrcl_flwr.clustering import finch

                parts, _ = finch(
                    v,
                    distance=self.p["distance"],
                    ensure_early_exit=bool(self.p["finch_early_exit"]),
                )
                assign = parts[:, -1]
            else:
                assign = np.zeros(len(v), np.int64)
            centers = [v[assign == k].mean(0) for k in np.unique(assign)]
            sizes = [int(n[assign == k].sum()) for k in np.unique(assign)]
            if mode == "finch_mean":
                vecs.append(np.mean(centers, axis=0))
                labs.append(c)
                cnts.append(int(n.sum()))
            else:
                vecs.extend(centers)
                labs.extend([c] * len(centers))
                cnts.extend(sizes)
        return SignalSet(
            np.asarray(vecs, np.float32), np.asarray(labs, np.int64), np.asarray(cnts, np.int64)
        )

    def _prepare(self, rnd: int) -> tuple[bytes | None, bytes | None]:
        if self._round_cache and self._round_cache[0] == rnd:
            return self._round_cache[1]
        max_age = int(self.p["max_age"])
        self.bank = {pid: (r, s) for pid, (r, s) in self.bank.items() if rnd - r <= max_age}
        local = SignalSet.concat([s for _, (_, s) in sorted(self.bank.items())])
        self.global_signals = self.compute_global(local)
        sent: tuple[bytes | None, bytes | None] = (None, None)
        if len(local):
            sent = (
                encode_signals(local) if self.p["send_local"] else None,
                encode_signals(self.global_signals),
            )
        self._round_cache = (rnd, sent)
        return sent

    # ------------------------------------------------------------------ hooks
    def signals_for_round(self, rnd: int) -> tuple[bytes | None, bytes | None]:
        """``(local, global)`` encoded signals every client of round ``rnd`` receives
        (``FitInstructions.signals_local`` / ``signals_global``; ``None``: not sent)."""
        return self._prepare(rnd)

    def bytes_down_per_client(self, rnd: int) -> int:
        return sum(len(b) for b in self._prepare(rnd) if b is not None)

    def ingest(self, rnd: int, results: list[tuple[int, FitReport]]) -> dict:
        """Validate and bank the uploads of a round (``(partition id, report)`` of each
        kept client); returns metrics for the record."""
        up, accepted, rejected = 0, 0, 0
        for pid, report in results:
            blob = report.signals
            if blob is None:
                continue
            up += len(blob) if isinstance(blob, (bytes, bytearray)) else 0
            try:
                s = decode_signals(
                    blob,
                    dim=self.dim,
                    num_classes=self.num_classes,
                    max_signals=int(self.p["max_signals_per_client"]),
                )
            except SignalError as exc:
                rejected += 1
                log.warning("round %d: rejected signals from partition %d: %s", rnd, pid, exc)
                continue
            if len(s):
                self.dim = self.dim or int(s.vectors.shape[1])
                self.bank[pid] = (rnd, s)
                accepted += 1
        self.rejected += rejected
        return {
            "signal_bytes_up": up,
            "signals_accepted": accepted,
            "signals_rejected": rejected,
            "signal_bank_clients": len(self.bank),
        }

    def state_dict(self) -> dict:
        return {
            "bank": {pid: (r, s.vectors, s.labels, s.counts) for pid, (r, s) in self.bank.items()},
            "dim": self.dim,
        }

    def load_state_dict(self, state: dict) -> None:
        self.bank = {
            int(pid): (int(r), SignalSet(np.array(v), np.array(lab), np.array(c)))
            for pid, (r, v, lab, c) in state["bank"].items()
        }
        self.dim = state.get("dim")
        self._round_cache = None
