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

The client composes small collaborators, one module each: :mod:`clients.client_data`
(which data: :class:`~clients.client_data.LocalData`, the round's partition),
:mod:`clients.received` (received weights copied into the model, the received trainable
values as tensors), :mod:`clients.local_round` (the round's start, the training loop on
its batches, the fit report), :mod:`clients.client_evaluation` (per-client evaluation,
the local representation) and :mod:`clients.wire_client` (the Flower ``Client`` it runs
as).

Which data a client trains on: in simulation the server assigns a partition id per
round (``partition_id`` in the fit instructions, ``fedrcl_flwr/protocol.py``; sampling
depends only on the seed and round); on a real device the node's own data (node-config
``data-path``) is used instead. What the server sends and the client reports are the
protocol's ``FitInstructions`` / ``FitReport`` (and ``EvaluateInstructions`` /
``EvaluateReport`` for per-client evaluation); a server strategy adds its own loss terms
through its ``client_loss_terms`` hook (:meth:`FederatedClient.strategy_terms`).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.client import NumPyClient

from clients.client_data import (
    LocalData,
    model_shapes,
    partition_of,
    without_local_test,
)
from clients.client_evaluation import evaluate_client, local_representation
from clients.local_round import fit_report, start_round, train_on_round_data
from clients.received import copy_into_model, trainable_tensors
from clients.wire_client import WireClient
from fedrcl_flwr.app.wire import transport
from fedrcl_flwr.components import resolve_params
from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.protocol import (
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
    steps_per_epoch,
)
from strategies import strategy_class


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
        self.fixed_data = local_data
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
            tensors = trainable_tensors(model, received, self.device)
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
        if self.fixed_data is not None:
            return self.fixed_data
        return partition_of(self.cfg, partition_id)

    def local_data(self, partition_id: int) -> LocalData:
        """What the client trains on: :meth:`partition_data`, minus the local test share
        while per-client evaluation holds one out (``fedrcl_flwr/client_eval.py``)."""
        data = self.partition_data(partition_id)
        return without_local_test(self.cfg, data, self.data_id(partition_id))

    def data_id(self, partition_id: int) -> int:
        """The id that seeds the client's hold-out: its partition id (a real device: its
        node-config ``partition-id``, else 0)."""
        if self.fixed_data is not None:
            return self.default_partition_id if self.default_partition_id is not None else 0
        return int(partition_id)

    def _model(self, slot: str = "local") -> torch.nn.Module:
        shapes = model_shapes(self.cfg, self.fixed_data)
        return runtime.worker_model(self.cfg, shapes, self.device, slot=slot)

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
        seed = start_round(self, ins, parameters)
        stats = train_on_round_data(self, ins, seed)
        report = fit_report(self, stats, t0)
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

    def last_batch(self) -> str:
        """What the round's local epochs do with their last, incomplete batch: keep, drop
        (``client.drop_last``) or fold it (a model with BatchNorm;
        :func:`fedrcl_flwr.training.last_batch_rule`)."""
        return last_batch_rule(self.cfg.client.drop_last, self.round_model())

    def epoch_steps(self) -> int:
        """Optimisation steps of one local epoch of the round in progress, as
        :func:`~clients.local_round.train_on_round_data` runs them
        (:func:`fedrcl_flwr.training.steps_per_epoch`)."""
        c, size = self.cfg.client, self.round_data().size
        bs = batch_size_for(size, c.batch_size, c.iterations_per_epoch)
        return steps_per_epoch(size, bs, c.iterations_per_epoch, self.last_batch())

    def _load_received(self, model: torch.nn.Module, parameters) -> None:
        """Load the received weights into ``model`` and keep them as
        :attr:`global_weights`; weights by reference are copied from the weight store
        straight into the model (:func:`~clients.received.copy_into_model`) and
        :attr:`global_weights` reads the store again only if a method uses it."""
        received = parameters if isinstance(parameters, transport.Received) else None
        if received is None or not received.by_reference:
            arrays = received.arrays() if received is not None else parameters
            runtime.set_weights(model, arrays)
            self.global_weights = arrays
            return
        copy_into_model(model, received)
        self.global_weights = None
        self._global_source = received

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
        return local_representation(self)

    def evaluate(self, parameters, config):
        """Per-client evaluation (``evaluation.per_client``, ``fedrcl_flwr/client_eval.py``):
        the global model, optionally fine-tuned for ``finetune_steps`` steps on the
        client's training data, on its local test data. In simulation one message may name
        several partitions (``partition_ids``); a real device evaluates its own data.
        Returns the mean loss, the number of test samples and ``client_eval`` (JSON:
        partition id -> [correct, samples, loss sum])."""
        return evaluate_client(self, parameters, config)

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
