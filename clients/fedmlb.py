"""FedMLB (Kim, Kim & Han, ICML 2022, "Multi-Level Branched Regularization for Federated
Learning").

The model is split into blocks 1..M (the last ending in the classifier). Besides the main
pathway (all local blocks), branch i runs the *local* blocks 1..i and then the *frozen
global* blocks i+1..M; the local objective is

    L = CE(q_main, y) + λ1·mean_i CE(q_i^hyb, y) + λ2·mean_i KL(q_i^hyb ‖ q_main)

(KL with temperature ``temp``; :func:`fedrcl_flwr.losses.baselines.fedmlb_branch_losses`),
loss terms ``ce``, ``mlb_ce`` and ``mlb_kl``. Gradients reach the local blocks through the
hybrid branches (the global parameters are frozen, not the activations).

Model interface: ``model.block_forward(x)`` → the list of block outputs up to the
penultimate feature, and ``model.forward_from(k, h)`` → logits from block k's output
(CNN4, CNN5, ResNet18GN and the Table C backbones of ``models/staged.py``
implement them); other models raise a ``ConfigError``. During
local training the worker model's ``forward`` is routed through ``block_forward`` (same
function, same outputs) so that the main pathway's intermediate maps come from the one
forward the training loop already does; it is restored after the round.

Branches: ``branches: [all]`` = one per block output (for ResNet-18: after conv1,
conv2_x .. conv5_x, as the paper's M = 6 blocks with the classifier last; for CNN5 after
conv1, conv2, fc1, fc2), or a list of block indices.

Parameters: ``lam1`` (λ1) = 1, ``lam2`` (λ2) = 1, FedRCL supplementary Sec. E ("λ1 and λ2
are both set to 1 in FedMLB"); ``temp`` = 1; ``branches`` = ``[all]``.
"""

from __future__ import annotations

import torch

from clients.base import FederatedClient
from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.training import LossTerm, cross_entropy_term

MAPS_KEY = "mlb_maps"


def has_blocks(model) -> bool:
    return callable(getattr(model, "block_forward", None)) and callable(
        getattr(model, "forward_from", None))


def _block_routed_forward(model):
    """``forward`` computing the model's own function through its blocks, exposing them."""

    def forward(x, return_features: bool = False):
        maps = model.block_forward(x)
        if not return_features:
            return model.forward_from(len(maps) - 1, maps[-1])
        logits, feats = model.forward_from(len(maps) - 1, maps[-1], return_features=True)
        return logits, {**feats, MAPS_KEY: maps}

    return forward


class FedMLBClient(FederatedClient):
    method = "fedmlb"
    defaults = {"lam1": 1.0, "lam2": 1.0, "temp": 1.0, "branches": ["all"]}

    @classmethod
    def check_config(cls, cfg) -> None:
        """Fail before the run when the configured model has no block interface."""
        from fedrcl_flwr.models import build_model

        try:
            model = build_model(cfg.model.name, num_classes=cfg.model.num_classes or 10,
                                in_channels=3, image_size=cfg.dataset.image_size or 32,
                                params=cfg.model.params)
        except Exception:  # noqa: BLE001 - other problems are reported elsewhere
            return
        if not has_blocks(model):
            raise ConfigError(cls.no_blocks_message(cfg.model.name))

    @staticmethod
    def no_blocks_message(name: str) -> str:
        return (f"client.method 'fedmlb' needs a model split into blocks "
                f"(model.block_forward / model.forward_from); model '{name}' has none "
                f"(cnn4, cnn5, resnet18_gn and the Table C backbones do)")

    def fit(self, parameters, config):
        try:
            return super().fit(parameters, config)
        finally:  # never leave the shared worker model routed through its blocks
            if self.model is not None and "forward" in vars(self.model):
                del self.model.forward

    def on_round_start(self, config):
        if not has_blocks(self.model):
            raise ConfigError(self.no_blocks_message(self.cfg.model.name))
        self.global_net = self.frozen_model()
        self.model.forward = _block_routed_forward(self.model)

    def branches(self, n_blocks: int) -> list[int]:
        """Block indices that get a hybrid branch (``branches`` resolved for this model)."""
        req = self.p["branches"]
        if req in (["all"], []):
            return list(range(n_blocks))
        bad = [k for k in req if isinstance(k, bool) or not isinstance(k, int)
               or not 0 <= k < n_blocks]
        if bad:
            raise ConfigError(f"client.params.branches: {bad} not in [0, {n_blocks}) for "
                              f"model '{self.cfg.model.name}' (or use [all])")
        return sorted(set(req))

    def loss_terms(self):
        from fedrcl_flwr.losses.baselines import fedmlb_branch_losses

        glob, temp = self.global_net, float(self.p["temp"])

        def branch_losses(b):  # computed once per step, shared by both terms
            if "mlb" not in b.extra:
                maps = b.feats[MAPS_KEY]
                hybrid = [glob.forward_from(k, maps[k]) for k in self.branches(len(maps))]
                b.extra["mlb"] = fedmlb_branch_losses(b.logits, hybrid, b.y, temp)
            return b.extra["mlb"]

        return [cross_entropy_term(),
                LossTerm("mlb_ce", lambda b: branch_losses(b)[0],
                         weight=float(self.p["lam1"]), needs_features=True),
                LossTerm("mlb_kl", lambda b: branch_losses(b)[1],
                         weight=float(self.p["lam2"]), needs_features=True)]
