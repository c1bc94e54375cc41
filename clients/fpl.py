"""FPL (Huang et al., CVPR 2023, "Rethinking Federated Learning with Domain Shift: A
Prototype View"; compared by FedCCL).

The server clusters the uploaded class prototypes of each class with FINCH and relays the
cluster means (``global_mode: finch_clusters`` of the SignalExchange: several prototypes
per class, FINCH's last partition as FPL's code). The local objective is

    L = CE + λ·(L_CPCL + L_UPCL)
    L_CPCL = −log( Σ_{c∈P_y} e^{cos(z, c)/τ} / Σ_{c∈P∪N} e^{cos(z, c)/τ} )   (clusters)
    L_UPCL = mean_dims (z − U_y)²,   U_y = mean of class y's cluster prototypes (unbiased)

averaged over the samples whose class has prototypes (loss term ``fpl``;
:func:`fedrcl_flwr.losses.baselines.fpl_loss`). Round one has no prototypes: CE only.

Clients upload class-mean prototypes of the penultimate feature after training
(:mod:`clients.fedproto`); ``max_age: 1`` keeps only the previous round's uploads, as
FPL's server uses the current participants.

Parameters: ``tau`` (τ) = 0.07 — FedCCL Sec. 5.1 sets the temperature to 0.07 "for all
experiments" (FPL's code uses 0.02); ``lam`` (λ) = 1 (FPL adds the two terms to CE with
weight 1); ``feature`` = ``penultimate``; ``embed_batch`` = 500;
``mean_over`` = ``valid`` (the mean over the samples whose class has prototypes) or
``batch`` (FPL's code: their sum over the batch size, see
:func:`~fedrcl_flwr.losses.baselines.fpl_loss`); ``proto_source`` = ``after_training``
(class means of the un-augmented data under the trained model, eval mode) or
``last_epoch`` (FPL's code, WenkeHuang/RethinkFL ``models/fpl.py: _train_net``: the class
means of the training-mode features of every augmented sample of the LAST local epoch,
each taken in the forward pass before that batch's optimiser step); ``variant`` =
``batched`` (:func:`~fedrcl_flwr.losses.baselines.fpl_loss`, the batch at once) or
``official`` (:func:`~fedrcl_flwr.losses.baselines.fpl_loss_official`: the same formula in
their code's float32 operation order, their per-sample loop, with the prototypes in their
order: each client uploads its classes in order of first appearance, and the server lists
the global clusters class by class in that order, ``server.signals.class_order:
first_seen``). The two differ only in rounding; ``official`` is slower and reproduces a
run of their code to the bit (``benchmarks/fidelity/lockstep.py --code rethinkfl --method
fpl``).
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from clients.fedproto import PrototypeClient
from fedrcl_flwr.components import at_least, feature_tap, non_negative, one_of, positive
from fedrcl_flwr.signals import class_cluster_signals
from fedrcl_flwr.training import LossTerm, cross_entropy_term


class FPLClient(PrototypeClient):
    method = "fpl"
    global_mode = "finch_clusters"
    defaults = {
        "tau": 0.07,
        "lam": 1.0,
        "feature": "penultimate",
        "embed_batch": 500,
        "mean_over": "valid",
        "proto_source": "after_training",
        "variant": "batched",
    }
    rules = {
        "tau": positive(),
        "lam": non_negative(),
        "feature": feature_tap(),
        "embed_batch": at_least(1),
        "mean_over": one_of("valid", "batch"),
        "proto_source": one_of("after_training", "last_epoch"),
        "variant": one_of("batched", "official"),
    }

    @classmethod
    def exchange_settings(cls, p: dict) -> dict:
        # RethinkFL's proto_aggregation: FINCH(cosine, ensure_early_exit=False), last level
        order = _class_order(p)
        return {**super().exchange_settings(p), "finch_early_exit": False, "class_order": order}

    def loss_terms(self):
        terms = [self._ce_term()]
        if self.global_protos is None:
            return terms
        from fedrcl_flwr.losses.baselines import fpl_loss, fpl_loss_official

        pv, pl = self.global_protos
        feat, tau, c = self.p["feature"], float(self.p["tau"]), self.data.num_classes
        over = str(self.p["mean_over"])
        if self.p["variant"] == "official":

            def fpl(b):
                return fpl_loss_official(b.feats[feat], b.y, pv, pl, tau, mean_over=over)
        else:

            def fpl(b):
                return fpl_loss(b.feats[feat], b.y, pv, pl, c, tau, mean_over=over)

        terms.append(LossTerm("fpl", fpl, weight=float(self.p["lam"]), needs_features=True))
        return terms

    def _ce_term(self) -> LossTerm:
        """Cross-entropy; with ``proto_source: last_epoch`` it also keeps the (detached,
        on the device) features and labels of the last local epoch's batches."""
        if self.p["proto_source"] != "last_epoch":
            return cross_entropy_term()
        c = self.cfg.client
        # the last epoch begins after the steps of the others (the last batch folded or
        # dropped as the epochs run it: FederatedClient.epoch_steps)
        first_kept = (c.local_epochs - 1) * self.epoch_steps()
        feat = self.p["feature"]
        kept: list = []
        self._last_epoch = kept
        calls = [0]

        def ce(b):
            if calls[0] >= first_kept:
                kept.append((b.feats[feat].detach(), b.y.detach()))
            calls[0] += 1
            return F.cross_entropy(b.logits, b.y)

        return LossTerm("ce", ce, needs_features=True)

    def prototype_class_order(self) -> str:
        return _class_order(self.p)

    def on_round_end(self, report):
        kept = getattr(self, "_last_epoch", None)
        if self.p["proto_source"] != "last_epoch" or not kept:
            return super().on_round_end(report)
        feats = np.concatenate([f.float().cpu().numpy() for f, _ in kept])
        labels = np.concatenate([y.cpu().numpy() for _, y in kept])
        self._last_epoch = []
        order = self.prototype_class_order()
        protos = class_cluster_signals(feats, labels, mode="mean", class_order=order)
        self.upload_signals(report, protos)
        report.method_metrics["used_global_signals"] = (
            0 if self.global_protos is None else int(self.global_protos[0].shape[0])
        )


def _class_order(p: dict) -> str:
    """The order of the classes in uploads and in the relayed clusters: ``official``
    follows their code, whose dicts of classes fill sample by sample and client by client
    (``_train_net``, ``proto_aggregation``)."""
    return "first_seen" if p.get("variant") == "official" else "sorted"
