"""The Flower client every local objective builds on.

A method is a subclass that declares its hyper-parameters (``defaults``, with their allowed
values in ``rules``; see :mod:`fedrcl_flwr.components`) and its loss terms
(:meth:`loss_terms`). Class-level declarations the app reads before a run:
:meth:`exchange_settings` (the server-side signal exchange it needs) and
:meth:`check_config` (checks across config sections); both are checked with the resolved
parameters in ``fedrcl_flwr/app/validate.py`` when the config is loaded. Optional hooks let
it read what the server sent (:meth:`on_round_start`), transform batches
(:meth:`batch_transform`), change the forward pass (:meth:`forward`), restrict the trained
parameters (:meth:`trainable_parameters`) and report or upload after training
(:meth:`on_round_end`). The training loop itself lives in ``fedrcl_flwr.training`` and is
shared by all methods.

Which data a client trains on: in simulation the server assigns a partition id per
round (``partition_id`` in the fit instructions, ``fedrcl_flwr/protocol.py``; sampling
depends only on the seed and round); on a real device the node's own data (node-config
``data-path``) is used instead. What the server sends and the client reports are the
protocol's ``FitInstructions`` / ``FitReport`` (and ``EvaluateInstructions`` /
``EvaluateReport`` for per-client evaluation); a server strategy adds its own loss terms
through its ``client_loss_terms`` hook (:meth:`FederatedClient.strategy_terms`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.client import Client, NumPyClient
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    Parameters,
    Status,
)

from fedrcl_flwr import client_eval
from fedrcl_flwr.accel import use_channels_last
from fedrcl_flwr.app.wire import transport
from fedrcl_flwr.codec import TENSOR_TYPE, encode_arrays
from fedrcl_flwr.components import resolve_params
from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.protocol import (
    EvaluateInstructions,
    EvaluateReport,
    FitInstructions,
    FitReport,
    upload_weight,
)
from fedrcl_flwr.run import runtime, timers
from fedrcl_flwr.run.run_files import CLIENT_STATE_DIR
from fedrcl_flwr.signals import SignalSet, decode_signals, encode_signals
from fedrcl_flwr.training import (
    LossTerm,
    batch_size_for,
    cross_entropy_term,
    last_batch_rule,
    local_train_settings,
    steps_per_epoch,
    train_local,
)
from strategies import strategy_class


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


class WireClient(Client):
    """A :class:`FederatedClient` as the Flower ``Client`` its :meth:`~FederatedClient.
    to_client` returns: what Flower's ``NumPyClient`` wrapper does, with the weights in
    and out through :mod:`fedrcl_flwr.codec` (the same ``.npy`` bytes, three copies of
    the model fewer per message; the received weights are read-only views of the
    message), or by reference to the run's weight store (``simulation.transport:
    shared``: :mod:`fedrcl_flwr.app.wire.transport`; the upload goes back the way the
    instructions came). Both runners hand every fit to it, the ClientApp and the
    in-process one."""

    def __init__(self, numpy_client: FederatedClient):
        self.numpy_client = numpy_client

    @staticmethod
    def _ok() -> Status:
        return Status(code=Code.OK, message="Success")

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        arrays = self.numpy_client.get_parameters(config=ins.config)
        return GetParametersRes(
            status=self._ok(),
            parameters=Parameters(tensors=encode_arrays(arrays), tensor_type=TENSOR_TYPE),
        )

    def fit(self, ins: FitIns) -> FitRes:
        """The round's training (:meth:`FederatedClient.train_round`, handed the message's
        weights as :class:`~fedrcl_flwr.app.wire.transport.Received`: read from the weight
        store into the model, and checked, when they are used), then its upload
        (:meth:`FederatedClient.upload`: views of the model) written out at once, into
        the message or the weight store, so no copy of the model is made for it."""
        client = self.numpy_client
        client.partition_id = -1  # set by the round's start (FederatedClient._start_round)
        try:
            return self._fit(client, ins)
        except Exception as exc:
            # the server counts each client's failures (strategies/screening.py: client_failure)
            if client.partition_id >= 0 and not hasattr(exc, "partition_id"):
                try:
                    exc.partition_id = client.partition_id  # type: ignore[attr-defined]
                except AttributeError:  # an exception type without attributes
                    pass
            raise

    def _fit(self, client: FederatedClient, ins: FitIns) -> FitRes:
        out = client.train_round(transport.Received(ins.parameters), ins.config)
        if not (len(out) == 2 and isinstance(out[0], int) and isinstance(out[1], dict)):
            raise TypeError(f"{type(client).__name__}.train_round must return (int, dict)")
        num_examples, metrics = out
        weights = client.upload()
        if not isinstance(weights, list):
            raise TypeError(f"{type(client).__name__}.upload must return a list of arrays")
        with timers.stage("encode"):  # after t_fit_end: inside its "encode" share
            parameters = transport.reply(weights, ins.parameters)
        return FitRes(
            status=self._ok(),
            parameters=parameters,
            num_examples=num_examples,
            metrics=metrics,
        )

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        out = self.numpy_client.evaluate(transport.arrays_of(ins.parameters), ins.config)
        if not (
            len(out) == 3
            and isinstance(out[0], float)
            and isinstance(out[1], int)
            and isinstance(out[2], dict)
        ):
            raise TypeError(
                f"{type(self.numpy_client).__name__}.evaluate must return (float, int, dict)"
            )
        loss, num_examples, metrics = out
        return EvaluateRes(status=self._ok(), loss=loss, num_examples=num_examples, metrics=metrics)


def _writable_view(tensor: torch.Tensor) -> np.ndarray | None:
    """A NumPy view of ``tensor``'s memory that received weights can be copied into
    directly (a contiguous CPU tensor of a NumPy dtype), else ``None``."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return None
    try:
        return tensor.detach().numpy()
    except (TypeError, RuntimeError):  # bfloat16 and the like
        return None


def _check_shapes(state: dict, shapes: list[tuple]) -> None:
    """The received arrays' shapes against the model's (``runtime.set_weights``'s
    errors), before anything is copied into it."""
    if len(shapes) != len(state):
        raise ValueError(f"expected {len(state)} arrays for the model, got {len(shapes)}")
    for (k, v), shape in zip(state.items(), shapes):
        if tuple(v.shape) != tuple(shape):
            raise ValueError(
                f"shape mismatch for '{k}': model {tuple(v.shape)} vs received {tuple(shape)}"
            )


def _shares_memory(tensor: torch.Tensor, array: np.ndarray) -> bool:
    return (
        tensor.device.type == "cpu"
        and array.ctypes.data == tensor.data_ptr()
        and array.nbytes == tensor.numel() * tensor.element_size()
    )


class FederatedClient(NumPyClient):
    """Base client: cross-entropy on the local data with the shared training loop."""

    method = "base"
    defaults: dict = {}
    rules: dict = {}  # parameter name -> fedrcl_flwr.components.Rule (allowed values)
    strategies: tuple | None = None  # the server strategies it needs (None: any)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "fit" in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} overrides fit(): override train_round() or upload() "
                "instead (the runners call those two, not fit)"
            )

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        local_data: LocalData | None = None,
        partition_id: int | None = None,
        state_dir: str | None = None,
    ):
        self.cfg = cfg
        self.p = self.resolve(cfg)
        self._fixed_data = local_data
        self.default_partition_id = partition_id
        self.state_dir = state_dir
        self._state_store = None
        self.device = runtime.pick_device(cfg.client.device)
        self.model: torch.nn.Module | None = None
        self._received: tuple | None = None
        self._global_source: transport.Received | None = None
        self._global_weights: list | None = None
        self.run_round = 0
        self.partition_id = -1
        self.data: LocalData | None = None

    # ------------------------------------------------------- the contract (class level)
    @classmethod
    def resolve(cls, cfg: ExperimentConfig) -> dict:
        """``client.params`` merged over :attr:`defaults`, every value checked."""
        return resolve_params(
            "client.params", f"method '{cls.method}'", cls.defaults, cls.rules, cfg.client.params
        )

    @classmethod
    def exchange_settings(cls, p: dict) -> dict | None:
        """Settings of the server's signal exchange this method needs, given its resolved
        parameters ``p`` (``None``: it exchanges no signals)."""
        return None

    @classmethod
    def check_config(cls, cfg: ExperimentConfig, p: dict) -> None:
        """Checks across config sections (raise ``ConfigError``); ``p`` = resolved params.
        Called before the run; per-parameter values are checked by :attr:`rules`."""

    # ------------------------------------------------------------------ hooks
    def loss_terms(self) -> list[LossTerm]:
        """Named, weighted loss terms of this method (default: cross-entropy)."""
        return [cross_entropy_term()]

    def on_round_start(self, ins: FitInstructions) -> None:
        """Read what the server sent besides the weights (signals, the strategy's
        :class:`~fedrcl_flwr.protocol.StrategyParams`), after the weights are loaded."""

    def batch_transform(self):
        """Optional ``f(x, y, model) -> (x, y, extra)`` applied before each forward."""
        return None

    def forward(self):
        """Optional ``f(model, x, need_features) -> (logits, feats or None)`` replacing
        the training loop's forward pass (FedMLB: through the model's blocks)."""
        return None

    def trainable_parameters(self) -> list | None:
        """Parameters to optimise (default: all that require grad)."""
        return None

    def on_round_end(self, report: FitReport) -> None:
        """After training: add the method's metrics (``report.method_metrics``, ``bytes``
        values allowed) or uploads (:meth:`SignalClient.upload_signals`)."""

    def to_client(self) -> WireClient:
        """This client as a Flower ``Client`` (:class:`WireClient`)."""
        return WireClient(self)

    # -------------------------------------------------------------- helpers
    @property
    def state_store(self):
        """Per-client persistent state on disk (see ``fedrcl_flwr.client_state``)."""
        if self._state_store is None:
            import tempfile

            from fedrcl_flwr.client_state import ClientStateStore

            root = self.state_dir or tempfile.mkdtemp(prefix="fedrcl-client-state-")
            self.state_dir = root
            self._state_store = ClientStateStore(root)
        return self._state_store

    def round_model(self) -> torch.nn.Module:
        """The model of the round in progress (loaded by :meth:`train_round` with the received
        weights before any hook runs)."""
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}: no model yet (train_round() loads it)")
        return self.model

    def round_data(self) -> LocalData:
        """The round's local data (picked by :meth:`train_round` before any hook runs)."""
        if self.data is None:
            raise RuntimeError(f"{type(self).__name__}: no local data yet (train_round() picks it)")
        return self.data

    @property
    def global_weights(self) -> list | None:
        """The round's received (global) weights as arrays. Weights received by
        reference are read from the weight store (and checked) on the first use in the
        round, into arrays of the client's own, never before: a method that does not
        use them pays nothing for them."""
        if self._global_source is not None:
            self._global_weights = list(self._global_source.arrays())
            self._global_source = None
        return self._global_weights

    @global_weights.setter
    def global_weights(self, value: list | None) -> None:
        self._global_weights, self._global_source = value, None
        self._received = None  # received_trainable's tensors were of the old weights

    def received_trainable(self) -> list[torch.Tensor]:
        """The received (global) values of the model's trainable parameters, aligned with
        ``model.parameters()``, as constant tensors on the device (computed once/round)."""
        if self._received is None or self._received[0] != id(self.global_weights):
            model, received = self.round_model(), self.global_weights
            if received is None:
                raise RuntimeError(
                    f"{type(self).__name__}: no received weights (train_round() stores them)"
                )
            keys = list(model.state_dict().keys())
            by_key = dict(zip(keys, received))
            tensors = [
                runtime.constant_tensor(by_key[n], device=self.device)
                for n, p in model.named_parameters()
                if p.requires_grad
            ]
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
    def partition_data(self, partition_id: int) -> LocalData:
        """The client's whole data: the node's own (real device) or its partition."""
        if self._fixed_data is not None:
            return self._fixed_data
        bundle = runtime.load_bundle(self.cfg)
        parts = runtime.client_partitions(self.cfg)
        if not 0 <= partition_id < len(parts):
            raise ValueError(f"partition id {partition_id} out of range (num_clients={len(parts)})")
        return LocalData(bundle.train, parts[partition_id], bundle.train_labels, bundle.num_classes)

    def local_data(self, partition_id: int) -> LocalData:
        """What the client trains on: :meth:`partition_data`, minus the local test share
        while per-client evaluation holds one out (``fedrcl_flwr/client_eval.py``)."""
        data = self.partition_data(partition_id)
        if client_eval.holds_out(self.cfg):
            data = dataclasses.replace(
                data,
                indices=client_eval.training_indices(
                    self.cfg, self._data_id(partition_id), data.indices
                ),
            )
        return data

    def _data_id(self, partition_id: int) -> int:
        """The id that seeds the client's hold-out: its partition id (a real device: its
        node-config ``partition-id``, else 0)."""
        if self._fixed_data is not None:
            return self.default_partition_id if self.default_partition_id is not None else 0
        return int(partition_id)

    def _model(self, slot: str = "local") -> torch.nn.Module:
        bundle = runtime.load_bundle(self.cfg) if self._fixed_data is None else None
        if bundle is None:
            from types import SimpleNamespace

            d = self._fixed_data
            assert d is not None  # the bundle is None only for a client with fixed data
            x0, _ = d.dataset[int(d.indices[0])]
            bundle = SimpleNamespace(
                num_classes=d.num_classes, in_channels=x0.shape[0], image_size=x0.shape[-1]
            )
        return runtime.worker_model(self.cfg, bundle, self.device, slot=slot)

    def get_parameters(self, config):
        return runtime.get_weights(self._model())

    def fit(self, parameters, config):
        """Flower's ``NumPyClient.fit``: :meth:`train_round`, then a copy of
        :meth:`upload` (arrays of its own, which a later round cannot change). The
        runners do not call it: :class:`WireClient` writes :meth:`upload`'s views out at
        once instead. A method changes what it trains or sends through the hooks,
        :meth:`train_round` or :meth:`upload`, never here (checked when the class is
        defined), so that both ways run the same code."""
        num_examples, metrics = self.train_round(parameters, config)
        return [np.array(w, copy=True) for w in self.upload()], num_examples, metrics

    def train_round(self, parameters, config) -> tuple[int, dict]:
        """One round of local training: read the :class:`FitInstructions`, train from the
        received weights with the method's loss terms (plus the server strategy's own,
        :meth:`strategy_terms`); return the upload's weight and the :class:`FitReport`
        as metrics."""
        timers.mark("t_fit")
        t0 = time.time()
        ins = FitInstructions.from_config(config)
        seed = self._start_round(ins, parameters)
        stats = self._train(ins, seed)
        report = FitReport(
            partition_id=self.partition_id,
            # a client that took no step (client.drop_last, fewer samples than a batch)
            # has no training loss
            train_loss=stats.loss if stats.steps else None,
            steps=stats.steps,
            fit_time_s=time.time() - t0,
            node=runtime.node_name(),
            term_losses=dict(stats.terms) if stats.steps else {},
        )
        every = self.cfg.evaluation.local_representation_every
        if every and self.run_round % every == 0:
            report.local_repr = self.local_representation()
        self.on_round_end(report)
        weight = upload_weight(
            self.round_data().size,
            secagg=self.cfg.privacy.secagg,
            weighting=self.cfg.server.weighting,
        )
        timers.mark("t_fit_end")
        return weight, report.to_metrics()

    def upload(self) -> list[np.ndarray]:
        """What the client sends back after :meth:`train_round`: its model's state
        (parameters and buffers, ``state_dict`` order) as read-only NumPy views, valid
        until the model is used again (the next round or evaluation in this process,
        whose pooled model it is); :meth:`fit` copies them."""
        return runtime.weight_views(self.round_model())

    def _start_round(self, ins: FitInstructions, parameters: list) -> int:
        """The round's partition, data, RNG seeds and model (loaded with ``parameters``),
        then :meth:`on_round_start`; returns the client's seed for the round."""
        self.run_round = ins.run_round
        pid: int | None
        if self._fixed_data is not None:  # a real device: its own data, its own id
            pid = self.default_partition_id if self.default_partition_id is not None else 0
        else:  # simulation: the partition the server assigned this round
            pid = ins.partition_id if ins.partition_id is not None else self.default_partition_id
        self.partition_id = int(pid) if pid is not None else -1
        timers.note(round=self.run_round, partition=self.partition_id)
        with timers.stage("data"):
            self.data = self.local_data(self.partition_id)
        seed = runtime.client_seed(self.cfg.seed, self.run_round, self.partition_id)
        torch.manual_seed(seed)
        np.random.seed(seed % (2**32))
        with timers.stage("load"):
            self.model = self._model()
            self._load_received(self.model, parameters)
        self.on_round_start(ins)
        return seed

    def last_batch(self) -> str:
        """What the round's local epochs do with their last, incomplete batch: keep, drop
        (``client.drop_last``) or fold it (a model with BatchNorm;
        :func:`fedrcl_flwr.training.last_batch_rule`)."""
        return last_batch_rule(self.cfg.client.drop_last, self.round_model())

    def epoch_steps(self) -> int:
        """Optimisation steps of one local epoch of the round in progress, as
        :meth:`_train` runs them (:func:`fedrcl_flwr.training.steps_per_epoch`)."""
        c, size = self.cfg.client, self.round_data().size
        bs = batch_size_for(size, c.batch_size, c.iterations_per_epoch)
        return steps_per_epoch(size, bs, c.iterations_per_epoch, self.last_batch())

    def _load_received(self, model: torch.nn.Module, parameters) -> None:
        """Load the received weights into ``model`` and keep them as
        :attr:`global_weights`. Weights by reference
        (:class:`~fedrcl_flwr.app.wire.transport.Received`) are copied from the weight store
        straight into the model's tensors while they are hashed (one pass; a tensor that
        cannot take them as they are, on a GPU or in another dtype or layout, through
        arrays of the client's own), and :attr:`global_weights` reads the store again
        only if a method uses it."""
        received = parameters if isinstance(parameters, transport.Received) else None
        if received is None or not received.by_reference:
            arrays = received.arrays() if received is not None else parameters
            runtime.set_weights(model, arrays)
            self.global_weights = arrays
            return
        state = model.state_dict()
        _check_shapes(state, received.shapes())
        tensors = list(state.values())
        got = received.read_into([_writable_view(t) for t in tensors])
        with torch.no_grad():
            for tensor, array in zip(tensors, got):
                if not _shares_memory(tensor, array):
                    tensor.copy_(runtime.constant_tensor(array))
        self.global_weights = None
        self._global_source = received

    def _train(self, ins: FitInstructions, seed: int):
        """The shared training loop on the round's batches (``fedrcl_flwr.training``)."""
        c = self.cfg.client
        model, data = self.round_model(), self.round_data()
        bs = batch_size_for(data.size, c.batch_size, c.iterations_per_epoch)
        batches = runtime.make_batches(
            data.dataset,
            data.indices,
            bs,
            seed,
            device=self.device,
            last_batch=self.last_batch(),
        )
        channels_last = use_channels_last(c.channels_last, self.device, model)
        if channels_last:  # the pooled model keeps it; set_weights preserves the layout
            model.to(memory_format=torch.channels_last)
        settings = local_train_settings(
            c, self.run_round, rounds=self.cfg.federation.rounds, channels_last=channels_last
        )
        terms = self.loss_terms() + self.strategy_terms(ins)
        with timers.stage("train"):
            return train_local(
                model,
                batches,
                terms,
                settings,
                self.device,
                transform=self.batch_transform(),
                forward=self.forward(),
                params=self.trainable_parameters(),
            )

    def strategy_terms(self, ins: FitInstructions) -> list[LossTerm]:
        """Loss terms the configured server strategy adds to every method's objective,
        through its declared hook ``client_loss_terms`` (FedACG: β·Σ‖w − w̃‖²,
        ``strategies/fedacg.py``); none for most strategies."""
        return strategy_class(self.cfg.server.strategy).client_loss_terms(self, ins)

    def local_representation(self) -> dict:
        """Representation metrics of the local model after local training (FedRCL
        Figs. 2-3 measure local models), the report's ``local_repr`` (``local_repr_*``
        fit metrics): on the test set in simulation, on the client's own (un-augmented)
        data for a client with fixed local data."""
        from torch.utils.data import Subset

        from fedrcl_flwr.representation import representation_record

        if self._fixed_data is None:
            data = runtime.load_bundle(self.cfg).test
        else:
            local = self.round_data()
            plain = local.dataset.plain() if hasattr(local.dataset, "plain") else local.dataset
            data = Subset(plain, local.indices.tolist())
        rec = representation_record(self.round_model(), data, self.device)
        return {k[len("repr_") :]: v for k, v in rec.items()}

    def evaluate(self, parameters, config):
        """Per-client evaluation (``evaluation.per_client``, ``fedrcl_flwr/client_eval.py``):
        the global model, optionally fine-tuned for ``finetune_steps`` steps on the
        client's training data, on its local test data. In simulation one message may name
        several partitions (``partition_ids``); a real device evaluates its own data.
        Returns the mean loss, the number of test samples and ``client_eval`` (JSON:
        partition id -> [correct, samples, loss sum])."""
        ins = EvaluateInstructions.from_config(config)
        bundle = runtime.load_bundle(self.cfg) if self._fixed_data is None else None
        model = self._model()
        report = EvaluateReport(
            {
                self._data_id(pid): self._evaluate_partition(
                    model, bundle, parameters, pid, ins.run_round
                )
                for pid in self._evaluated_partitions(ins)
            }
        )
        return float(report.mean_loss), int(report.num_samples), report.to_metrics()

    def _evaluated_partitions(self, ins: EvaluateInstructions) -> list[int]:
        """A real device: its own data; simulation: the partitions the server named."""
        if self._fixed_data is not None:
            return [self._data_id(0)]
        if ins.partition_ids is not None:
            return list(ins.partition_ids)
        pid = ins.partition_id if ins.partition_id is not None else self.default_partition_id
        return [int(pid) if pid is not None else -1]

    def _evaluate_partition(
        self, model: torch.nn.Module, bundle, parameters, pid: int, run_round: int
    ) -> tuple[int, int, float]:
        """``(correct, samples, loss sum)`` of the global model ``parameters`` (fine-tuned
        first when ``finetune_steps``) on partition ``pid``'s local test data."""
        from fedrcl_flwr.evaluation import evaluate_model

        steps = self.cfg.evaluation.per_client.finetune_steps
        whole = self.partition_data(pid)
        dataset, test_idx = client_eval.local_test(
            self.cfg, self._data_id(pid), whole.indices, whole.dataset, bundle
        )
        runtime.set_weights(model, parameters)
        if steps:
            train = self.local_data(pid)
            client_eval.finetune(
                model,
                train.dataset,
                train.indices,
                self.cfg,
                run_round,
                self._data_id(pid),
                steps,
                self.device,
            )
        res = evaluate_model(
            model, dataset, self.device, indices=test_idx, batch_size=self.cfg.evaluation.batch_size
        )
        return (
            int(round(res.accuracy * res.num_samples)),
            res.num_samples,
            res.loss * res.num_samples,
        )

    def frozen_model(self, weights=None, slot: str = "global") -> torch.nn.Module:
        """A second model instance from the process's model pool (one per ``slot``, see
        ``runtime.worker_model``) loaded with ``weights`` (default: the received global
        weights; a list of arrays or a state dict), in eval mode with
        ``requires_grad=False``. Call once per round; run it under ``torch.no_grad()``
        unless gradients must flow into its *input* (FedMLB's hybrid branches)."""
        model = self._model(slot)
        for p in model.parameters():
            p.requires_grad_(False)
            p.grad = None
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
            self.state_dir = str(self.cfg.output_dir() / CLIENT_STATE_DIR)
        return self.state_store


class SignalClient(FederatedClient):
    """A method that exchanges feature signals with the server's SignalExchange
    (``fedrcl_flwr/server/signal_exchange.py``): FedCCL (cluster signals), FedProto, FedProc, FPL
    and FedPCL (class prototypes). It reads what the server relayed
    (:meth:`load_signals`), embeds its data with the trained model
    (:meth:`embed_local_data`) and uploads signals built from it (:meth:`upload_signals`).
    Its ``client.params`` include ``feature`` (the tap) and ``embed_batch``."""

    def load_signals(self, encoded: bytes | None) -> tuple | None:
        """``(vectors, labels)`` tensors on the device of signals the server sent
        (``ins.signals_local`` / ``ins.signals_global``), or ``None`` when absent or
        empty (round one)."""
        if encoded is None:
            return None
        s = decode_signals(encoded)
        if not len(s):
            return None
        return (
            torch.as_tensor(s.vectors, device=self.device),
            torch.as_tensor(s.labels, device=self.device),
        )

    def embed_local_data(self) -> tuple[np.ndarray, np.ndarray]:
        """Features (``feature``) and labels of the client's training data under the
        current model, un-augmented, in eval mode (the model's mode is restored)."""
        from fedrcl_flwr.representation import embed

        data = self.round_data()
        feats, labels = embed(
            self.round_model(),
            data.dataset,
            self.device,
            indices=data.indices,
            feature=self.p["feature"],
            batch_size=int(self.p["embed_batch"]),
        )
        return feats.numpy(), labels.numpy()

    @staticmethod
    def upload_signals(report: FitReport, signals: SignalSet) -> None:
        """Send ``signals`` to the server's SignalExchange with the fit report."""
        report.signals = encode_signals(signals)
        report.num_signals = len(signals)
