"""The Flower ``Strategy`` every server rule in this project builds on.

It owns the global model (NumPy arrays) and, per round:

1. ``configure_fit`` samples *partition ids* with
   :func:`fedrcl_flwr.runtime.sample_partitions` (seed and round only — the same for every
   method and strategy; Flower node ids are random and are used only as execution slots)
   and sends each sampled client :meth:`weights_to_send` plus its fit config and
   :meth:`fit_extras`;
2. ``aggregate_fit`` drops unusable results (exceptions, NaN/Inf, wrong shapes), averages
   the rest (uniform or sample-weighted) and hands the average to :meth:`server_update`,
   the hook where server optimizers (FedAvgM, FedAdam, FedACG) differ;
3. ``evaluate`` runs the centralised evaluation every ``eval_every`` rounds and passes one
   record per evaluated round to ``on_record`` (the run's recorder).

Hooks for subclasses: :meth:`weights_to_send`, :meth:`fit_extras`, :meth:`server_update`,
:meth:`after_aggregate`, :meth:`state_dict` / :meth:`load_state_dict` (checkpoints).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import numpy as np
from flwr.common import (
    EvaluateIns,
    FitIns,
    FitRes,
    Parameters,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.runtime import sample_partitions
from strategies.aggregation import (
    check_update,
    client_coefficients,
    entry_kinds,
    weighted_average,
)

log = logging.getLogger("fedrcl_flwr")


class AllClientsFailed(RuntimeError):
    pass


def copy_arrays(arrays):
    """Independent copies of a list of arrays (``None`` entries kept)."""
    return [None if a is None else np.array(a, copy=True) for a in arrays]


def resolve_server_params(name: str, defaults: dict, given: dict) -> dict:
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(defaults)) or "(none)"
        raise ConfigError(f"server.params: unknown key(s) {', '.join(unknown)} for strategy "
                          f"'{name}' (allowed: {allowed})")
    out = dict(defaults)
    for k, v in given.items():
        if isinstance(defaults[k], bool):
            if not isinstance(v, bool):
                raise ConfigError(f"server.params.{k} for strategy '{name}' must be true or "
                                  f"false, got {v!r}")
        elif isinstance(defaults[k], (int, float)) and (
            isinstance(v, bool) or not isinstance(v, (int, float))
        ):
            raise ConfigError(f"server.params.{k} for strategy '{name}' must be a number, "
                              f"got {v!r}")
        out[k] = v
    return out


class FederatedStrategy(Strategy):
    """FedAvg with deterministic partition sampling, fault filtering and hooks."""

    name = "fedavg"
    defaults: dict = {}

    def __init__(
        self,
        *,
        initial_weights: list[np.ndarray],
        trainable: list[bool],
        num_clients: int,
        clients_per_round: int,
        rounds: int,
        seed: int = 0,
        weighting: str = "uniform",
        eval_every: int = 1,
        params: Optional[dict] = None,
        evaluate_fn: Optional[Callable[[int, list], tuple[float, dict]]] = None,
        on_record: Optional[Callable[[dict], None]] = None,
        on_checkpoint: Optional[Callable[[int], None]] = None,
        max_consecutive_failed_rounds: int = 3,
        expected_nodes: Optional[int] = None,
        node_wait_s: float = 120.0,
        round_offset: int = 0,
        exchange=None,
    ):
        super().__init__()
        self.p = resolve_server_params(self.name, self.defaults, params or {})
        self.weights = [np.asarray(w).copy() for w in initial_weights]
        self.kinds = entry_kinds(self.weights, trainable)
        self.num_clients = num_clients
        self.clients_per_round = clients_per_round
        self.rounds = rounds
        self.seed = seed
        self.weighting = weighting
        self.eval_every = eval_every
        self.evaluate_fn = evaluate_fn
        self.on_record = on_record
        self.on_checkpoint = on_checkpoint
        self.max_failed = max_consecutive_failed_rounds
        self.expected_nodes = expected_nodes
        self.node_wait_s = node_wait_s
        self.round_offset = round_offset
        self.exchange = exchange  # optional SignalExchange (FedCCL, FedProto, FPL)
        self.model_bytes = int(sum(np.asarray(w).nbytes for w in self.weights))
        self.consecutive_empty = 0
        self._fit_info: dict = {}
        self._round_start = time.time()

    # ------------------------------------------------------------------ hooks
    def weights_to_send(self, server_round: int) -> list[np.ndarray]:
        """What clients start from (FedACG overrides: the look-ahead model)."""
        return self.weights

    def fit_extras(self, server_round: int, partition_id: int) -> dict:
        """Extra per-client fit config entries (scalars or bytes)."""
        return {}

    def server_update(self, server_round: int, average: list[np.ndarray]) -> None:
        """Turn the clients' average into the new global model (FedAvg: take it)."""
        self.weights = average

    def after_aggregate(self, server_round: int, results: list[tuple[int, FitRes]]) -> dict:
        """Called with ``(partition_id, FitRes)`` of the kept results; returns metrics."""
        return {}

    def state_dict(self) -> dict:
        state = {"weights": copy_arrays(self.weights),
                 "consecutive_empty": self.consecutive_empty}
        if self.exchange is not None:
            state["exchange"] = self.exchange.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.weights = copy_arrays(state["weights"])
        self.consecutive_empty = int(state.get("consecutive_empty", 0))
        if self.exchange is not None and "exchange" in state:
            self.exchange.load_state_dict(state["exchange"])

    # --------------------------------------------------------------- Strategy
    def initialize_parameters(self, client_manager: ClientManager) -> Optional[Parameters]:
        return ndarrays_to_parameters(self.weights)

    def _round(self, server_round: int) -> int:
        return server_round + self.round_offset

    def _slots(self, client_manager: ClientManager, k: int) -> list[ClientProxy]:
        want = min(k, self.expected_nodes) if self.expected_nodes else k
        client_manager.wait_for(want, timeout=int(self.node_wait_s))
        nodes = sorted(client_manager.all().items(), key=lambda kv: str(kv[0]))
        if not nodes:
            raise RuntimeError("no client nodes connected")
        return [proxy for _, proxy in nodes]

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        rnd = self._round(server_round)
        self._round_start = time.time()
        pids = sample_partitions(self.seed, rnd, self.num_clients, self.clients_per_round)
        slots = self._slots(client_manager, len(pids))
        if len(slots) < len(pids):
            log.warning("round %d: only %d client nodes for %d sampled partitions; "
                        "training the first %d", rnd, len(slots), len(pids), len(slots))
            pids = pids[: len(slots)]
        send = ndarrays_to_parameters(self.weights_to_send(rnd))
        out = []
        for slot, pid in zip(slots, pids):
            config = {"server_round": rnd, "partition_id": pid}
            config.update(self.fit_extras(rnd, pid))
            if self.exchange is not None:
                config.update(self.exchange.fit_extras(rnd, pid))
            out.append((slot, FitIns(send, config)))
        self._sampled = pids
        return out

    def aggregate_fit(self, server_round: int, results, failures):
        rnd = self._round(server_round)
        kept: list[tuple[int, FitRes, list]] = []
        reasons: list[str] = []
        for f in failures:
            reasons.append(f"client error: {f if isinstance(f, BaseException) else 'status'}")
        for proxy, res in results:
            pid = int(res.metrics.get("partition_id", -1))
            try:
                arrays = parameters_to_ndarrays(res.parameters)
            except Exception as exc:  # noqa: BLE001 - any undecodable upload is dropped
                reasons.append(f"partition {pid}: undecodable parameters ({exc})")
                continue
            why = check_update(arrays, self.weights)
            if why is None and not np.isfinite(float(res.metrics.get("train_loss", 0.0))):
                why = "non-finite training loss"
            if why is not None:
                reasons.append(f"partition {pid}: {why}")
                continue
            kept.append((pid, res, arrays))
        for r in reasons:
            log.warning("round %d: dropped a client result (%s)", rnd, r)

        info = {"num_clients": len(kept), "failures": len(reasons),
                "model_bytes_down": self.model_bytes * len(getattr(self, "_sampled", [])),
                "model_bytes_up": self.model_bytes * len(kept)}
        if self.exchange is not None:
            info["signal_bytes_down"] = (self.exchange.bytes_down_per_client(rnd)
                                         * len(getattr(self, "_sampled", [])))
            info.update(self.exchange.ingest(rnd, [(pid, r.metrics) for pid, r, _ in kept]))
        if not kept:
            self.consecutive_empty += 1
            log.warning("round %d: every client failed; global model unchanged "
                        "(%d consecutive empty rounds)", rnd, self.consecutive_empty)
            self._fit_info = info
            if self.consecutive_empty >= self.max_failed:
                raise AllClientsFailed(
                    f"aborting: {self.consecutive_empty} consecutive rounds in which every "
                    f"client failed (federation.max_consecutive_failed_rounds="
                    f"{self.max_failed})")
            return ndarrays_to_parameters(self.weights), {}
        self.consecutive_empty = 0
        kept.sort(key=lambda t: t[0])  # order-independent arithmetic
        coefs = client_coefficients([r.num_examples for _, r, _ in kept], self.weighting)
        average = weighted_average([a for _, _, a in kept], coefs, self.kinds)
        self.server_update(rnd, average)
        info["train_loss"] = float(np.mean([float(r.metrics.get("train_loss", np.nan))
                                            for _, r, _ in kept]))
        for key in sorted({k for _, r, _ in kept for k in r.metrics}):
            if key.startswith("loss_"):
                vals = [r.metrics[key] for _, r, _ in kept if isinstance(
                    r.metrics.get(key), (int, float))]
                if vals:
                    info[f"train_{key}"] = float(np.mean(vals))
            elif key.startswith("local_repr_"):  # local-model metrics (clients/base.py)
                vals = [float(r.metrics[key]) for _, r, _ in kept if key in r.metrics]
                info[key] = float(np.nanmean(vals)) if np.isfinite(vals).any() else \
                    float("nan")
        if "local_repr_effective_rank" in info:
            info["local_repr_effective_rank_per_client"] = {
                str(pid): float(r.metrics["local_repr_effective_rank"])
                for pid, r, _ in kept if "local_repr_effective_rank" in r.metrics}
        info.update(self.after_aggregate(rnd, [(pid, r) for pid, r, _ in kept]))
        self._fit_info = info
        return ndarrays_to_parameters(self.weights), {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []  # centralised evaluation only

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters):
        rnd = self._round(server_round)
        if server_round == 0:
            return None
        record = None
        if self.evaluate_fn is not None and (rnd % self.eval_every == 0 or rnd == self.rounds):
            loss, metrics = self.evaluate_fn(rnd, self.weights)
            record = {"round": rnd, "test_loss": loss, **metrics, **self._fit_info,
                      "round_time_s": time.time() - self._round_start}
            if self.on_record is not None:
                self.on_record(record)
        if self.on_checkpoint is not None:
            self.on_checkpoint(rnd)
        if record is None:
            return None
        return record["test_loss"], {"accuracy": float(record.get("test_accuracy", 0.0))}
