"""FedMLB (Kim, Kim & Han, ICML 2022, "Multi-Level Branched Regularization for Federated
Learning").

The model is split into blocks 1..M (the last ending in the classifier). Besides the main
pathway (all local blocks), branch i runs the *local* blocks 1..i and then the *frozen
global* blocks i+1..M; the local objective is

    L = CE(q_main, y) + λ1·mean_i CE(q_i^hyb, y) + λ2·mean_i KL(q_i^hyb ‖ q_main)

(KL with temperature ``temp``; :func:`fedrcl_flwr.losses.baselines.fedmlb_branch_losses`),
loss terms ``ce``, ``mlb_ce`` and ``mlb_kl``. Gradients reach the local blocks through the
hybrid branches (the global parameters are frozen, not the activations).

Model interface (``BlockModel``, ``fedrcl_flwr/models/interface.py``):
``model.block_forward(x)`` → the list of block outputs up to the penultimate feature, and
``model.forward_from(k, h)`` → logits from block k's output (CNN4, CNN5, ResNet18GN and the
Table C backbones of ``models/staged.py`` implement them); other models are rejected
before the run. The
client's :meth:`forward` hook makes the training loop compute the main pathway through
``block_forward`` (same function, same outputs), so its intermediate maps come from the
one forward the loop already does; the shared model itself is not touched.

Branches: ``branches: [all]`` = one per block output (for ResNet-18: after conv1,
conv2_x .. conv5_x, as the paper's M = 6 blocks with the classifier last; for CNN5 after
conv1, conv2, fc1, fc2), or a list of block indices.

Parameters: ``lam1`` (λ1) = 1, ``lam2`` (λ2) = 1, FedRCL supplementary Sec. E ("λ1 and λ2
are both set to 1 in FedMLB"); ``temp`` = 1; ``branches`` = ``[all]``.
"""

from __future__ import annotations

from clients.base import FederatedClient
from fedrcl_flwr.components import block_indices, non_negative, positive, resolve_branches
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.models.interface import has_blocks
from fedrcl_flwr.training import LossTerm, cross_entropy_term

MAPS_KEY = "mlb_maps"


def block_forward(model, x, need_features: bool):
    """The model's own function computed through its blocks (the training loop's forward
    for FedMLB): ``(logits, feats)`` with the block outputs under ``feats["mlb_maps"]``."""
    maps = model.block_forward(x)
    logits, feats = model.forward_from(len(maps) - 1, maps[-1], return_features=True)
    return logits, {**feats, MAPS_KEY: maps}


class FedMLBClient(FederatedClient):
    method = "fedmlb"
    defaults = {"lam1": 1.0, "lam2": 1.0, "temp": 1.0, "branches": ["all"]}
    rules = {
        "lam1": non_negative(),
        "lam2": non_negative(),
        "temp": positive(),
        "branches": block_indices(),
    }

    @classmethod
    def check_config(cls, cfg, p) -> None:
        """Fail before the run when the configured model has no block interface."""
        from fedrcl_flwr.run.runtime import probe_model

        model = probe_model(cfg)
        if model is not None and not has_blocks(model):
            raise ConfigError(
                f"client.method 'fedmlb' needs a model split into blocks "
                f"(model.block_forward / model.forward_from); model '{cfg.model.name}' "
                f"has none (cnn4, cnn5, resnet18_gn and the Table C backbones do)"
            )

    def on_round_start(self, ins):
        self.global_net = self.frozen_model()

    def forward(self):
        return block_forward

    def loss_terms(self):
        from fedrcl_flwr.losses.baselines import fedmlb_branch_losses

        glob, temp = self.global_net, float(self.p["temp"])

        def branch_losses(b):  # computed once per step, shared by both terms
            if "mlb" not in b.extra:
                maps = b.feats[MAPS_KEY]
                branches = resolve_branches(self.p["branches"], len(maps))
                hybrid = [glob.forward_from(k, maps[k]) for k in branches]
                b.extra["mlb"] = fedmlb_branch_losses(b.logits, hybrid, b.y, temp)
            return b.extra["mlb"]

        return [
            cross_entropy_term(),
            LossTerm(
                "mlb_ce",
                lambda b: branch_losses(b)[0],
                weight=float(self.p["lam1"]),
                needs_features=True,
            ),
            LossTerm(
                "mlb_kl",
                lambda b: branch_losses(b)[1],
                weight=float(self.p["lam2"]),
                needs_features=True,
            ),
        ]
