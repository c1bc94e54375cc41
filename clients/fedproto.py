"""FedProto with parameter averaging (Tan et al., AAAI 2022, "FedProto: Federated Prototype
Learning across Heterogeneous Clients"; compared this way by FedCCL, Sec. 5.1).

Local objective: L = CE + λ·L_R with

    L_R = Σ_j ‖f(x_j) − C̄^{(y_j)}‖²    (as the official code: MSE, mean over batch × dim)

where C̄^{(c)} is the global prototype of class c (loss term ``proto``;
:func:`fedrcl_flwr.losses.baselines.fedproto_loss`). Samples of a class without a global
prototype add zero; round one (no prototypes yet) is plain CE.

Prototypes travel through the signal exchange (``fedrcl_flwr/server/signal_exchange.py``,
``global_mode: mean``, ``send_local: false``): after training the client embeds its data
with the updated model (eval mode, no augmentation) and uploads one class-mean prototype
per class it holds (the fit report's ``signals``); the server's global prototype of a class is
the sample-count-weighted mean of the uploads (the exchange's ``mean`` mode; FedProto's
released code averages the clients' prototypes uniformly). ``max_age: 1``: only
the previous round's uploads count, as in the original (override with
``server.signals.max_age``). The model update itself is averaged by the configured
server optimizer.

Parameters: ``lam`` (λ, FedProto's ``ld``) = 1, the FedProto default; ``feature`` =
``penultimate``; ``embed_batch`` = 500.

This module also holds :class:`PrototypeClient`, what FedProc, FPL and FedPCL share on top
of :class:`clients.base.SignalClient` (the relayed prototypes, uploading class means).
"""

from __future__ import annotations

import numpy as np

from clients.base import SignalClient
from fedrcl_flwr.components import at_least, feature_tap, non_negative
from fedrcl_flwr.signals import class_cluster_signals
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class PrototypeClient(SignalClient):
    """Clients that exchange class prototypes with the server's SignalExchange."""

    global_mode = "mean"  # how the server builds the global prototypes
    send_local = False  # whether it also relays the banked client prototypes
    normalize_protos = False  # FedPCL: prototypes are means of L2-normalised features

    @classmethod
    def exchange_settings(cls, p: dict) -> dict:
        return {"global_mode": cls.global_mode, "send_local": cls.send_local, "max_age": 1}

    def prototype_class_order(self) -> str:
        """The order of the classes in an upload (``class_cluster_signals``)."""
        return "sorted"

    def on_round_start(self, ins):
        self.global_protos = self.load_signals(ins.signals_global)
        self.local_protos = self.load_signals(ins.signals_local) if self.send_local else None

    def on_round_end(self, report):
        feats, labels = self.embed_local_data()
        if self.normalize_protos:
            feats = feats / np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)
        order = self.prototype_class_order()
        self.upload_signals(
            report, class_cluster_signals(feats, labels, mode="mean", class_order=order)
        )
        report.method_metrics["used_global_signals"] = (
            0 if self.global_protos is None else int(self.global_protos[0].shape[0])
        )


class FedProtoClient(PrototypeClient):
    method = "fedproto"
    defaults = {"lam": 1.0, "feature": "penultimate", "embed_batch": 500}
    rules = {"lam": non_negative(), "feature": feature_tap(), "embed_batch": at_least(1)}

    def loss_terms(self):
        terms = [cross_entropy_term()]
        if self.global_protos is None:
            return terms
        from fedrcl_flwr.losses.baselines import fedproto_loss

        pv, pl = self.global_protos
        feat, c = self.p["feature"], self.data.num_classes
        terms.append(
            LossTerm(
                "proto",
                lambda b: fedproto_loss(b.feats[feat], b.y, pv, pl, c),
                weight=float(self.p["lam"]),
                needs_features=True,
            )
        )
        return terms
