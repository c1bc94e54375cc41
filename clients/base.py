"""The Flower client every local objective builds on.

A method is a subclass that declares its hyper-parameters (``defaults``) and its loss
terms (:meth:`loss_terms`); optional hooks let it read what the server sent
(:meth:`on_round_start`), transform batches (:meth:`batch_transform`), restrict the trained
parameters (:meth:`trainable_parameters`) and report or upload after training
(:meth:`on_round_end`). The training loop itself lives in ``fedrcl_flwr.training`` and is
shared by all methods.

Which data a client trains on: in simulation the server assigns a partition id per
round (``partition_id`` in the fit config; sampling depends only on the seed and round);
on a real device the node's own data (node-config ``data-path``) is used instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from flwr.client import NumPyClient

from fedrcl_flwr import runtime
from fedrcl_flwr.config import ConfigError, ExperimentConfig
from fedrcl_flwr.training import (
    LocalTrainSettings,
    LossTerm,
    batch_size_for,
    cross_entropy_term,
    round_lr,
    train_local,
)


@dataclass
class LocalData:
    """A client's view of its training data: the shared dataset plus its indices."""

    dataset: Any
    indices: np.ndarray
    labels: np.ndarray
    num_classes: int

    @property
    def size(self) -> int:
        return int(len(self.indices))

    def class_counts(self) -> np.ndarray:
        return np.bincount(self.labels[self.indices], minlength=self.num_classes)


def resolve_params(method: str, defaults: dict, given: dict) -> dict:
    """Merge ``client.params`` over a method's defaults; unknown keys are an error."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(defaults)) or "(none)"
        raise ConfigError(f"client.params: unknown key(s) {', '.join(unknown)} for method "
                          f"'{method}' (allowed: {allowed})")
    out = dict(defaults)
    for k, v in given.items():
        d = defaults[k]
        if isinstance(d, bool) != isinstance(v, bool) or (
            isinstance(d, (int, float)) and not isinstance(v, (int, float))
        ) or (isinstance(d, str) and not isinstance(v, str)) or (
            isinstance(d, list) and not isinstance(v, list)
        ):
            raise ConfigError(f"client.params.{k} for method '{method}' must be "
                              f"{type(d).__name__}, got {v!r}")
        out[k] = float(v) if isinstance(d, float) and not isinstance(v, bool) else v
    return out


class FederatedClient(NumPyClient):
    """Base client: cross-entropy on the local data with the shared training loop."""

    method = "base"
    defaults: dict = {}

    def __init__(self, cfg: ExperimentConfig, *, local_data: Optional[LocalData] = None,
                 partition_id: Optional[int] = None, state_dir: Optional[str] = None):
        self.cfg = cfg
        self.p = resolve_params(self.method, self.defaults, cfg.client.params)
        self._fixed_data = local_data
        self.default_partition_id = partition_id
        self.state_dir = state_dir
        self._state_store = None
        self.device = runtime.pick_device(cfg.client.device)
        self.model: Optional[torch.nn.Module] = None
        self.global_weights: Optional[list] = None
        self.server_round = 0
        self.partition_id = -1
        self.data: Optional[LocalData] = None

    # ------------------------------------------------------------------ hooks
    def loss_terms(self) -> list[LossTerm]:
        """Named, weighted loss terms of this method (default: cross-entropy)."""
        return [cross_entropy_term()]

    def on_round_start(self, config: dict) -> None:
        """Read extras the server sent (after the global weights are loaded)."""

    def batch_transform(self):
        """Optional ``f(x, y, model) -> (x, y, extra)`` applied before each forward."""
        return None

    def trainable_parameters(self) -> Optional[list]:
        """Parameters to optimise (default: all that require grad)."""
        return None

    def on_round_end(self, metrics: dict) -> None:
        """Add method metrics / uploads (``bytes`` values allowed) after training."""

    # -------------------------------------------------------------- helpers
    @property
    def state_store(self):
        """Per-client persistent state on disk (see ``fedrcl_flwr.client_state``)."""
        if self._state_store is None:
            from fedrcl_flwr.client_state import ClientStateStore
            import tempfile

            root = self.state_dir or tempfile.mkdtemp(prefix="fedrcl-client-state-")
            self.state_dir = root
            self._state_store = ClientStateStore(root)
        return self._state_store

    def received_trainable(self) -> list[torch.Tensor]:
        """The received (global) values of the model's trainable parameters, aligned with
        ``model.parameters()``, as constant tensors on the device (computed once/round)."""
        if getattr(self, "_received", None) is None or self._received[0] != id(
                self.global_weights):
            keys = list(self.model.state_dict().keys())
            by_key = dict(zip(keys, self.global_weights))
            tensors = [torch.as_tensor(by_key[n], device=self.device)
                       for n, p in self.model.named_parameters() if p.requires_grad]
            self._received = (id(self.global_weights), tensors)
        return self._received[1]

    def distance_to_received_term(self, name: str, weight: float) -> LossTerm:
        """``weight * Σ‖w − w_received‖²`` over trainable parameters (FedACG; FedProx
        uses it with weight μ/2)."""
        received = self.received_trainable()

        def fn(batch):
            params = [p for p in batch.model.parameters() if p.requires_grad]
            return sum(((p - g) ** 2).sum() for p, g in zip(params, received))

        return LossTerm(name, fn, weight)

    # --------------------------------------------------------------- plumbing
    def local_data(self, partition_id: int) -> LocalData:
        if self._fixed_data is not None:
            return self._fixed_data
        bundle = runtime.load_bundle(self.cfg)
        parts = runtime.client_partitions(self.cfg)
        if not 0 <= partition_id < len(parts):
            raise ValueError(f"partition id {partition_id} out of range "
                             f"(num_clients={len(parts)})")
        return LocalData(bundle.train, parts[partition_id], bundle.train_labels,
                         bundle.num_classes)

    def _model(self) -> torch.nn.Module:
        bundle = runtime.load_bundle(self.cfg) if self._fixed_data is None else None
        if bundle is None:
            from types import SimpleNamespace

            d = self._fixed_data
            x0, _ = d.dataset[int(d.indices[0])]
            bundle = SimpleNamespace(num_classes=d.num_classes, in_channels=x0.shape[0],
                                     image_size=x0.shape[-1])
        return runtime.worker_model(self.cfg, bundle, self.device)

    def get_parameters(self, config):
        return runtime.get_weights(self._model())

    def fit(self, parameters, config):
        t0 = time.time()
        c = self.cfg.client
        self.server_round = int(config.get("server_round", 1))
        if self._fixed_data is not None:  # a real device: its own data, its own id
            pid = self.default_partition_id if self.default_partition_id is not None else 0
        else:  # simulation: the partition the server assigned this round
            pid = config.get("partition_id", self.default_partition_id)
        self.partition_id = int(pid) if pid is not None else -1
        self.data = self.local_data(self.partition_id)
        seed = runtime.client_seed(self.cfg.seed, self.server_round, self.partition_id)
        torch.manual_seed(seed)
        np.random.seed(seed % (2**32))

        self.model = self._model()
        runtime.set_weights(self.model, parameters)
        self.global_weights = parameters
        self.on_round_start(config)

        bs = batch_size_for(self.data.size, c.batch_size, c.iterations_per_epoch)
        batches = runtime.make_batches(self.data.dataset, self.data.indices, bs, seed)
        settings = LocalTrainSettings(
            lr=float(config.get("lr", round_lr(c.lr, c.lr_decay, self.server_round))),
            epochs=c.local_epochs, momentum=c.momentum, weight_decay=c.weight_decay,
            grad_clip=c.grad_clip, iterations_per_epoch=c.iterations_per_epoch,
            epoch_lr_decay=c.epoch_lr_decay,
        )
        terms = self.loss_terms()
        if "acg_beta" in config:  # FedACG's client regulariser, for any method
            terms.append(self.distance_to_received_term("acg", float(config["acg_beta"])))
        stats = train_local(self.model, batches, terms, settings, self.device,
                            transform=self.batch_transform(),
                            params=self.trainable_parameters())
        metrics: dict = {
            "partition_id": self.partition_id,
            "train_loss": stats.loss,
            "steps": stats.steps,
            "fit_time_s": time.time() - t0,
        }
        for name, value in stats.terms.items():
            metrics[f"loss_{name}"] = value
        every = self.cfg.evaluation.local_representation_every
        if every and self.server_round % every == 0:
            metrics.update(self.local_representation())
        self.on_round_end(metrics)
        return runtime.get_weights(self.model), self.data.size, metrics

    def local_representation(self) -> dict:
        """Representation metrics of the local model after local training (FedRCL
        Figs. 2-3 measure local models), as ``local_repr_*`` fit metrics: on the test set
        in simulation, on the client's own (un-augmented) data for a client with fixed
        local data."""
        from torch.utils.data import Subset

        from fedrcl_flwr.representation import representation_record

        if self._fixed_data is None:
            data = runtime.load_bundle(self.cfg).test
        else:
            plain = self.data.dataset.plain() if hasattr(self.data.dataset, "plain") \
                else self.data.dataset
            data = Subset(plain, self.data.indices.tolist())
        rec = representation_record(self.model, data, self.device)
        return {f"local_{k}": v for k, v in rec.items()}

    def evaluate(self, parameters, config):
        """Local evaluation on the client's training data (federated evaluation)."""
        from torch.utils.data import Subset

        from fedrcl_flwr.evaluation import evaluate_model

        pid = config.get("partition_id", self.default_partition_id)
        data = self.local_data(int(pid) if pid is not None else -1)
        model = self._model()
        runtime.set_weights(model, parameters)
        plain = data.dataset.plain() if hasattr(data.dataset, "plain") else data.dataset
        res = evaluate_model(model, Subset(plain, data.indices.tolist()), self.device)
        return res.loss, res.num_samples, {"accuracy": res.accuracy}

    # ------------------------------------------------- helpers for baselines (appended)
    def frozen_model(self, weights=None, slot: str = "global") -> torch.nn.Module:
        """A second model instance (one per ``slot`` and process, cached like
        ``runtime.worker_model``) loaded with ``weights`` (default: the received global
        weights; a list of arrays or a state dict), in eval mode with
        ``requires_grad=False``. Call once per round; run it under ``torch.no_grad()``
        unless gradients must flow into its *input* (FedMLB's hybrid branches)."""
        import copy

        base = self._model()
        cached = _FROZEN_MODELS.get(slot)
        if cached is None or cached[0] is not base:
            model = copy.deepcopy(base)
            for p in model.parameters():
                p.requires_grad_(False)
                p.grad = None
            vars(model).pop("forward", None)  # a per-round override is not the model
            _FROZEN_MODELS[slot] = (base, model)
        model = _FROZEN_MODELS[slot][1]
        weights = self.global_weights if weights is None else weights
        if isinstance(weights, dict):
            model.load_state_dict(weights, strict=True)
        else:
            runtime.set_weights(model, weights)
        return model.eval()

    def persistent_state_store(self):
        """:attr:`state_store`, rooted at the run's ``output_dir/client_state`` when the app
        gave no ``state_dir`` (in-process runs create a client per message, so a temporary
        directory would lose the state between rounds)."""
        if self.state_dir is None and self._state_store is None:
            self.state_dir = str(self.cfg.output_dir() / "client_state")
        return self.state_store


# frozen second model instances (slot -> (worker model they mirror, frozen copy))
_FROZEN_MODELS: dict = {}
