"""MOON (Li, He & Song, CVPR 2021, "Model-Contrastive Federated Learning").

Local objective: L = CE + μ·ℓ_con with the model-contrastive loss

    ℓ_con = −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) )

(cosine ``sim``), where z is the local model's representation, z_glob that of the received
global model (positive) and z_prev that of this client's own model at the end of its
previous participation (negative); loss term ``moon``,
:func:`fedrcl_flwr.losses.baselines.moon_contrastive_loss`. The representation is the
penultimate feature (the input of ``model.fc``); the original attaches a 2-layer projection
head (output 256) for ℓ_con only — our models have none (``feature`` selects another tap).

Previous local model: per-client state that survives rounds in simulation and on devices.
After training, the client writes its model's state dict to its
``persistent_state_store()`` under its partition id in float16 (``compact=True``: CNN5 at
32×32 ≈ 4.4 MB per client on disk, nothing in RAM); at its next participation it is loaded
(as float32) into a second instance from the process's model pool
(``frozen_model(slot="moon_prev")``), so a process holds at
most three models (local, global, previous) however many clients it serves.

First participation: no previous model exists. The official code then has an empty model
pool and its contrastive logits are just ``[sim(z, z_glob)/τ]``, whose cross-entropy is
identically 0; the same holds for using the global model as the "previous" one
(``log 2``, zero gradient). So the term is left out (no wasted forwards) and the client
reports ``moon_prev: 0``. (With partial participation the official code lets a client that
never trained contrast against its own random initialisation; virtual clients have no
private initialisation, so that quirk is not reproduced.)

Parameters: ``mu`` (μ) = 1, FedRCL supplementary Sec. E (and UniVarFL Sec. 4);
``tau`` (τ) = 0.5, MOON's default; ``feature`` = ``penultimate``.
"""

from __future__ import annotations

import torch

from clients.base import FederatedClient
from fedrcl_flwr.components import feature_tap, non_negative, positive
from fedrcl_flwr.training import LossTerm, cross_entropy_term

STATE_NAME = "moon_prev"


class MOONClient(FederatedClient):
    method = "moon"
    defaults = {"mu": 1.0, "tau": 0.5, "feature": "penultimate"}
    rules = {"mu": non_negative(), "tau": positive(), "feature": feature_tap()}

    def on_round_start(self, ins):
        self.global_net = self.prev_net = None
        if float(self.p["mu"]) == 0.0:
            return
        state = self.persistent_state_store().load(
            self.partition_id, STATE_NAME, dtype=torch.float32
        )
        if state is None:
            return
        self.global_net = self.frozen_model(slot="global")
        self.prev_net = self.frozen_model(state, slot=STATE_NAME)

    def loss_terms(self):
        terms = [cross_entropy_term()]
        if self.prev_net is None:
            return terms
        from fedrcl_flwr.losses.baselines import moon_contrastive_loss

        feat, tau = self.p["feature"], float(self.p["tau"])
        glob, prev = self.global_net, self.prev_net

        def contrast(b):
            with torch.no_grad():
                z_glob = glob(b.x, return_features=True)[1][feat]
                z_prev = prev(b.x, return_features=True)[1][feat]
            return moon_contrastive_loss(b.feats[feat], z_glob, z_prev, tau)

        terms.append(LossTerm("moon", contrast, weight=float(self.p["mu"]), needs_features=True))
        return terms

    def on_round_end(self, report):
        report.method_metrics["moon_prev"] = int(self.prev_net is not None)
        if float(self.p["mu"]) == 0.0:
            return
        self.persistent_state_store().save(
            self.partition_id, STATE_NAME, dict(self.model.state_dict()), compact=True
        )
