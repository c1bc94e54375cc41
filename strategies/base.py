"""The Flower ``Strategy`` every server rule in this project builds on.

It owns the global model (NumPy arrays) and, per round:

1. ``configure_fit`` samples *partition ids* with
   :func:`fedrcl_flwr.run.runtime.sample_partitions` (seed and round only — the same for every
   method and strategy; Flower node ids are random and are used only as execution slots)
   and sends each sampled client :meth:`weights_to_send` with its
   :class:`~fedrcl_flwr.protocol.FitInstructions` (:meth:`fit_instructions`: round,
   partition, the signal exchange's signals, the strategy's :meth:`client_params`);
2. ``aggregate_fit`` reads each client's :class:`~fedrcl_flwr.protocol.FitReport`, drops
   unusable results (exceptions, malformed reports, NaN/Inf, wrong shapes), averages the
   rest (uniform or sample-weighted) and hands the average with the kept
   :class:`ClientResult` s to :meth:`server_update`, the hook where server optimizers
   (FedAvgM, FedAdam, FedACG, FedDyn) differ;
3. ``evaluate`` runs the centralised evaluation every ``eval_every`` rounds and passes one
   record per evaluated round to ``on_record`` (the run's recorder), then
   ``on_checkpoint(run_round, state)`` with the strategy's state as it was at the end of
   that round. With ``overlap_evaluation`` (the simulation's ServerApp) this round-end
   work runs in one background thread while the next round trains, on a snapshot of the
   round's weights, fit info and state; the next ``evaluate`` first waits for it (one in
   flight at most, in round order), so records, checkpoints and results are exactly those
   of the sequential order. The final round's is done before ``evaluate`` returns; an
   error in the thread is raised by the next ``evaluate`` (or :meth:`drain`).

Unreliable clients (``availability``, :mod:`fedrcl_flwr.availability`): after sampling,
``configure_fit`` sends nothing to the sampled clients that drop out or would miss the
round's deadline; the round's record counts them (``dropped`` ...), and the privacy
accountant counts only the clients that were sent the model. A round in which no sampled
client reports leaves the global model unchanged (Flower then skips ``aggregate_fit``, as
SecAgg+ does below 2 reporting clients). Per-client evaluation (``per_client``,
:mod:`fedrcl_flwr.client_eval`): in a round where it is due, ``configure_evaluate`` asks the
round's sampled clients (or all) to evaluate the global model on their local test data and
the round's record waits for ``aggregate_evaluate`` (Flower calls it right after
``evaluate``), which adds the ``client_acc_*`` statistics and then hands the record on
as above.

Hooks for subclasses: :meth:`weights_to_send` (what clients start from),
:meth:`client_params` (the strategy's values sent to every client),
:meth:`client_loss_terms` (runs on the client: loss terms the strategy adds to every
method's objective, FedACG) and :meth:`server_update` (the new global model from the
average and the round's kept results; returns metrics for the record). Parameters:
``defaults`` with their allowed values in ``rules`` (:mod:`fedrcl_flwr.components`,
checked before the run). Server-optimizer state is
*declared* in ``buffers``: the base creates each buffer (one float64 array per trainable
parameter, ``None`` for BatchNorm buffers / counters, filled with :meth:`buffer_fill`) and
saves / restores it in :meth:`state_dict` / :meth:`load_state_dict`, so a new optimizer
cannot forget to checkpoint one.

Privacy (``privacy`` section, off by default): with ``privacy.dp`` the round's averaging
step runs inside Flower's fixed-clipping DP wrapper (:mod:`strategies.privacy`: clipping,
fixed-denominator average, Gaussian noise, the privacy accountant whose state is
checkpointed); with ``privacy.secagg`` every result holds the same SecAgg+ average (the
ServerApp's SecAgg+ workflow unmasked it), which replaces the weighted average, and a
round with an unusable result is discarded (it cannot be taken out of the masked sum).

Failed rounds, one rule for every cause: a round in which no client's update reached the
model (every sampled client dropped out or was late, SecAgg+ had fewer than 2 clients or
an unreachable threshold, SecAgg+ halted or discarded the round, every client failed) is
*failed*: its record (written even when the round is not evaluated) carries
``round_failed: true`` and ``failure_reason`` (one line, :meth:`_failure_reason`), its
progress line says ``ROUND FAILED (model unchanged): <why>``, and a run in which no round
trained ends with :class:`AllClientsFailed` after its last round's record (the CLI: exit 1,
one line). ``federation.max_consecutive_failed_rounds`` rounds in a row in which every
client *failed* (errors, not dropouts) abort the run earlier.

Rounds: Flower numbers the rounds of *this process* 1, 2, ... (``server_round``); a resumed
run continues at ``run_round = server_round + round_offset`` (rounds done before). Every
hook, record, sample and checkpoint uses ``run_round``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from flwr.common import EvaluateIns, FitIns, FitRes, Parameters
from flwr.server import ClientManager
from flwr.server.strategy import Strategy

from fedrcl_flwr.app.wire.flower_private import ClientProxy
from fedrcl_flwr.app.wire.transport import ServerTransport, arrays_of, open_upload, to_bytes
from fedrcl_flwr.components import resolve_params
from fedrcl_flwr.protocol import (
    LOCAL_REPR_PREFIX,
    TERM_LOSS_PREFIX,
    EvaluateInstructions,
    EvaluateReport,
    FitInstructions,
    FitReport,
    ProtocolError,
    StrategyParams,
    untag_partition,
)
from fedrcl_flwr.run import timers
from fedrcl_flwr.run.runtime import sample_partitions
from fedrcl_flwr.server.aggregation import (
    average_and_screen,
    average_workers,
    check_shapes,
    check_update,
    client_coefficients,
    entry_kinds,
    weighted_average,
)
from fedrcl_flwr.weights.entries import StoreError

if TYPE_CHECKING:  # the client-side hook's types (torch)
    from concurrent.futures import Future, ThreadPoolExecutor

    from fedrcl_flwr.training import LossTerm


class StrategyClient(Protocol):
    """What a strategy's client-side hook (:meth:`FedRCLStrategy.client_loss_terms`) may
    use of the client: ``clients/base.py``'s ``FederatedClient`` provides it. Named here so
    that the strategies, a layer below the clients, never import them."""

    def received_trainable(self) -> list[Any]: ...

    def distance_to_received_term(self, name: str, weight: float) -> LossTerm: ...


log = logging.getLogger("fedrcl_flwr")


class AllClientsFailed(RuntimeError):
    """The run trained nothing (no round's update reached the model), or too many rounds
    in a row in which every client failed."""


# Flower's legacy client proxy when no reply came back (flwr
# server/compat/grid_client_proxy.py): a client that outlived the round's time-out
NO_REPLY = "Expected one Message but got: 0"
# how that proxy ends the error of a ClientApp that raised: ``ValueError("Message contains
# an Error (reason: <reason>). It originated during client-side execution of a message.")``
PROXY_ERROR_END = "). It originated during client-side execution of a message."


def no_reply_line(timeout_s: float | None) -> str:
    """What a client that sent no reply is said to have done, in the run's words."""
    if timeout_s is not None:
        return f"timed out: no reply within {timeout_s:g} s (federation.round_timeout_s)"
    return "no reply from the client"


def client_failure(failure, timeout_s: float | None = None) -> tuple[int | None, str]:
    """``(partition id or None, one line Type: message)`` of a failed client result.

    For a ClientApp that raised, Flower builds ``reason`` as ``"<class
    '...ClientAppException'>:<'\\nException ClientAppException occurred. Message:
    RuntimeError: boom'>"`` (``vce_api.py``; the ClientApp's ``name_errors`` mod puts the
    original type in front of the message, and the partition in front of that:
    :func:`fedrcl_flwr.protocol.tag_partition`) and hands the strategy either
    ``Exception(Error(code, reason))`` or, through its legacy client proxy (a simulation
    with ``flwr run``), ``ValueError("Message contains an Error (reason: <reason>)`` +
    :data:`PROXY_ERROR_END`; only ``RuntimeError: boom`` is kept. An exception raised in
    this process carries the partition as its ``partition_id`` attribute
    (``clients/base.py``). Flower's "no reply" (:data:`NO_REPLY`) is said in the run's
    words, with the configured ``timeout_s``."""
    if isinstance(failure, tuple):  # (proxy, FitRes) with a non-OK status
        res = failure[-1]
        status = getattr(res, "status", None)
        line = f"client status {getattr(status, 'code', '?')}: {getattr(status, 'message', '')}"
        return None, line
    pid = getattr(failure, "partition_id", None)
    err = failure.args[0] if isinstance(failure, BaseException) and failure.args else failure
    reason = getattr(err, "reason", None)
    text = str(reason if reason is not None else err)
    if "Message: " in text:
        text = text.split("Message: ", 1)[1].removesuffix(PROXY_ERROR_END)
        if text.endswith("'>"):
            text = text[:-2]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    tagged, line = untag_partition(lines[0] if lines else type(failure).__name__)
    if tagged is not None:
        pid = tagged
    if line == NO_REPLY:
        line = no_reply_line(timeout_s)
    return (pid if isinstance(pid, int) and pid >= 0 else None), line[:500]


def client_error_line(failure, timeout_s: float | None = None) -> str:
    """The one line ``Type: message`` of a failed client result (:func:`client_failure`)."""
    return client_failure(failure, timeout_s)[1]


def failure_counts(state: dict) -> dict[str, dict]:
    """``summary.json``'s ``client_failures`` from a strategy's :meth:`state_dict`: per
    partition id (text, in id order) that failed in at least one round, ``{"failed":
    rounds it failed, "rounds": rounds it was asked to train, "first_error": its first
    error}``."""
    rounds = state.get("client_rounds") or {}
    failures = state.get("client_failures") or {}
    return {
        str(pid): {
            "failed": int(entry["failed"]),
            "rounds": int(rounds.get(str(pid), entry["failed"])),
            "first_error": str(entry["first_error"]),
        }
        for pid, entry in sorted(failures.items(), key=lambda kv: int(kv[0]))
    }


def to_parameters(arrays) -> Parameters:
    """Flower ``Parameters`` of ``arrays`` (``.npy`` bytes, :mod:`fedrcl_flwr.codec`)."""
    return to_bytes(arrays)


def copy_arrays(arrays):
    """Independent copies of a list of arrays (``None`` entries kept)."""
    return [None if a is None else np.array(a, copy=True) for a in arrays]


@dataclass(frozen=True)
class ClientResult:
    """One kept client result of a round, what :meth:`FederatedStrategy.server_update`
    receives (sorted by partition id)."""

    partition_id: int
    # the client's model, NumPy arrays in the model's state order; for an upload in the
    # weight store whose hash_check is set, views of the store for the shapes only (its
    # values are read through hash_check, or as a checked copy: _verify)
    weights: list
    report: FitReport  # what it reported (fedrcl_flwr/protocol.py)
    fit_res: FitRes  # Flower's result (Flower's DP wrapper reads it)
    hash_check: Any = None  # the upload's store hash check (screening only)

    @property
    def num_examples(self) -> int:
        """The weight it gave its upload (``fedrcl_flwr.protocol.upload_weight``)."""
        return int(self.fit_res.num_examples)


def client_statistics(kept: list[ClientResult]) -> dict:
    """The round's record entries from the kept clients' reports: the mean training loss,
    where the clients ran (``client_nodes``), the mean of each local-model representation
    metric (``local_repr_*``, NaN-aware) and of each loss term (``train_loss_<term>``),
    and the local effective rank per client."""
    # the mean over the clients that report one (one that took no step has none)
    losses = [r.report.train_loss for r in kept if r.report.train_loss is not None]
    info: dict = {"train_loss": float(np.mean(losses)) if losses else float("nan")}
    nodes: dict = {}
    for r in kept:
        if r.report.node is not None:
            nodes[r.report.node] = nodes.get(r.report.node, 0) + 1
    if nodes:
        info["client_nodes"] = dict(sorted(nodes.items()))
    for name in sorted({k for r in kept for k in r.report.local_repr}):
        vals = [float(r.report.local_repr[name]) for r in kept if name in r.report.local_repr]
        info[LOCAL_REPR_PREFIX + name] = (
            float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
        )
    for name in sorted({k for r in kept for k in r.report.term_losses}):
        vals = [r.report.term_losses[name] for r in kept if name in r.report.term_losses]
        info[f"train_{TERM_LOSS_PREFIX}{name}"] = float(np.mean(vals))
    if "effective_rank" in {k for r in kept for k in r.report.local_repr}:
        info[f"{LOCAL_REPR_PREFIX}effective_rank_per_client"] = {
            str(r.partition_id): float(r.report.local_repr["effective_rank"])
            for r in kept
            if "effective_rank" in r.report.local_repr
        }
    return info


class FederatedStrategy(Strategy):
    """FedAvg with deterministic partition sampling, fault filtering and hooks."""

    name = "fedavg"
    defaults: dict = {}
    rules: dict = {}  # parameter name -> fedrcl_flwr.components.Rule (allowed values)
    buffers: tuple = ()  # names of the declared server-optimizer state (see module doc)

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
        average_dtype: str = "float64",
        eval_every: int = 1,
        params: dict | None = None,
        evaluate_fn: Callable[[int, list], tuple[float, dict]] | None = None,
        on_record: Callable[[dict], None] | None = None,
        on_checkpoint: Callable[[int, dict], None] | None = None,
        max_consecutive_failed_rounds: int = 3,
        expected_nodes: int | None = None,
        node_wait_s: float = 120.0,
        round_offset: int = 0,
        exchange=None,
        overlap_evaluation: bool = False,
        availability=None,
        per_client: tuple[int, str] | None = None,
        privacy=None,
        round_timeout_s: float | None = None,
    ):
        super().__init__()
        self.round_timeout_s = round_timeout_s  # federation.round_timeout_s (its messages)
        self.availability = availability  # fedrcl_flwr.availability.Availability or None
        self.per_client = per_client  # (every, "sampled" | "unsampled" | "all") or None
        self.overlap_evaluation = overlap_evaluation
        self.p = self.resolve(params)
        self.weights = [np.asarray(w).copy() for w in initial_weights]
        self.kinds = entry_kinds(self.weights, trainable)
        self.num_clients = num_clients
        self.clients_per_round = clients_per_round
        self.rounds = rounds
        self.seed = seed
        self.weighting = weighting
        # server.average_dtype: the average's arithmetic (fedrcl_flwr/server/aggregation.py)
        self.average_dtype = average_dtype
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
        # privacy.secagg: what one client uploads instead, Flower's SecAgg+ masked vector:
        # every entry of every array quantised, masked and sent as an int64, plus the
        # int64 weight factor (flwr secaggplus_mod._collect_masked_vectors: quantize ->
        # factor_combine -> masks -> parameters_mod); the key and share exchange of the
        # protocol's other stages is not counted
        self.secagg_upload_bytes = 8 * (1 + int(sum(np.asarray(w).size for w in self.weights)))
        # how weights travel (fedrcl_flwr/app/wire/transport.py): Flower's messages unless the
        # app hands the strategy the run's weight store (simulation.transport: shared)
        self.transport = ServerTransport()
        self._init_round_state()
        self._init_buffers()
        self._init_privacy(privacy)

    def _init_round_state(self) -> None:
        """What the server keeps between and within rounds (besides the model)."""
        self.consecutive_empty = 0
        self.rounds_trained = 0  # rounds in which at least one client result was kept
        self.first_client_error: str | None = None
        # per partition: the rounds it was asked to train in, and (a client that failed at
        # least once) the rounds it failed and its first error (failure_counts)
        self.client_rounds: dict[int, int] = {}
        self.client_failures: dict[int, dict] = {}  # {"failed": n, "first_error": line}
        self._fit_info: dict = {}
        self._avail_info: dict = {}
        self._outcome = None  # the round's availability outcome (None: all were sent)
        self._round_errors: list[str] = []  # why the round's results were unusable
        self._sampled: list[int] = []  # the round's sampled partitions (all, with availability)
        self._sent: list[int] = []  # those sent the model to train
        self._round_start = time.time()
        self._deferred: tuple | None = None  # a round end awaiting per-client evaluation
        self._round_end_executor: ThreadPoolExecutor | None = None  # created on first use
        self._round_end_pending: Future | None = None
        # threads of the server's average (the same bytes for any number: aggregation.py)
        self.average_workers = average_workers()

    def _init_buffers(self) -> None:
        """Create each declared buffer (module doc): float64 per trainable parameter."""
        for b in self.buffers:
            fill = self.buffer_fill(b)
            setattr(
                self,
                b,
                [
                    np.full(w.shape, fill, np.float64) if k == "param" else None
                    for w, k in zip(self.weights, self.kinds)
                ],
            )

    def _init_privacy(self, privacy) -> None:
        """``privacy`` (a ``fedrcl_flwr.config.PrivacyConfig``; off by default): central
        DP through Flower's wrappers (``strategies/privacy.py``), SecAgg+ results
        (``fedrcl_flwr/app``)."""
        self.secagg = bool(privacy is not None and privacy.secagg)
        self.secagg_params = (
            (privacy.secagg_num_shares, privacy.secagg_threshold) if self.secagg else None
        )
        self.dp = None
        if privacy is not None and privacy.dp is not None:
            from strategies.privacy import CentralDP

            self.dp = CentralDP(
                self, privacy.dp, num_sampled=self.clients_per_round, num_clients=self.num_clients
            )

    @classmethod
    def resolve(cls, params: dict | None) -> dict:
        """``server.params`` merged over :attr:`defaults`, every value checked."""
        return resolve_params(
            "server.params", f"strategy '{cls.name}'", cls.defaults, cls.rules, params
        )

    def buffer_fill(self, name: str) -> float:
        """Initial value of every entry of the declared buffer ``name`` (default 0)."""
        return 0.0

    # ------------------------------------------------------------------ hooks
    def weights_to_send(self, run_round: int) -> list[np.ndarray]:
        """What clients start from (FedACG overrides: the look-ahead model)."""
        return self.weights

    def client_params(self, run_round: int) -> StrategyParams | None:
        """The strategy's values every client receives in its fit instructions (a
        :class:`~fedrcl_flwr.protocol.StrategyParams` dataclass: FedACG's β, FedDyn's α);
        ``None``: nothing."""
        return None

    @classmethod
    def client_loss_terms(cls, client: StrategyClient, ins: FitInstructions) -> list[LossTerm]:
        """Runs on the client: the ``LossTerm``s this strategy adds to every method's
        objective, built from the client (``clients/base.py``: ``received_trainable``,
        ``distance_to_received_term``) and its fit instructions (FedACG's
        β·Σ‖w − w̃‖²); default none."""
        return []

    def server_update(
        self, run_round: int, average: list[np.ndarray], results: list[ClientResult]
    ) -> dict | None:
        """Turn the clients' ``average`` into the new global model ``self.weights``
        (FedAvg: take it). ``results`` are the round's kept client results (sorted by
        partition id); return metrics for the round's record (or ``None``)."""
        self.weights = average
        return None

    def state_dict(self) -> dict:
        state = {
            "weights": copy_arrays(self.weights),
            "consecutive_empty": self.consecutive_empty,
            "rounds_trained": self.rounds_trained,
            "first_client_error": self.first_client_error,
            "buffers": {b: copy_arrays(getattr(self, b)) for b in self.buffers},
            # partition ids as text (a checkpoint's dict keys)
            "client_rounds": {str(k): v for k, v in self.client_rounds.items()},
            "client_failures": {str(k): dict(v) for k, v in self.client_failures.items()},
        }
        if self.exchange is not None:
            state["exchange"] = self.exchange.state_dict()
        if self.dp is not None:
            state["privacy_accountant"] = self.dp.accountant.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.weights = copy_arrays(state["weights"])
        self.consecutive_empty = int(state.get("consecutive_empty", 0))
        for b in self.buffers:
            setattr(self, b, copy_arrays(state["buffers"][b]))
        self.rounds_trained = int(state.get("rounds_trained", 1))  # old checkpoints: trained
        self.first_client_error = state.get("first_client_error")
        # checkpoints written before the per-client counts: counted from the resumed round
        self.client_rounds = {int(k): int(v) for k, v in state.get("client_rounds", {}).items()}
        self.client_failures = {
            int(k): dict(v) for k, v in state.get("client_failures", {}).items()
        }
        if self.exchange is not None and "exchange" in state:
            self.exchange.load_state_dict(state["exchange"])
        if self.dp is not None:
            if "privacy_accountant" not in state:
                raise ValueError(
                    "privacy.dp is set but the checkpoint has no privacy "
                    "accountant (the run started without privacy.dp)"
                )
            self.dp.accountant.load_state_dict(state["privacy_accountant"])

    # --------------------------------------------------------------- Strategy
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.transport.send(self.weights)

    def run_round(self, server_round: int) -> int:
        """The run's round number of Flower's ``server_round`` (shifted on resume)."""
        return server_round + self.round_offset

    def _slots(self, client_manager: ClientManager, k: int) -> list[ClientProxy]:
        want = min(k, self.expected_nodes) if self.expected_nodes else k
        client_manager.wait_for(want, timeout=int(self.node_wait_s))
        nodes = sorted(client_manager.all().items(), key=lambda kv: str(kv[0]))
        if not nodes:
            raise RuntimeError("no client nodes connected")
        return [proxy for _, proxy in nodes]

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self._round_start = time.time()
        timers.server_event("configure", round=self.run_round(server_round))
        arrays = self.weights_to_send(self.run_round(server_round))
        send = self.transport.send(arrays)
        if self.dp is not None:  # Flower's DP wrapper sees what the clients start from
            return self.dp.configure_fit(server_round, send, client_manager, arrays)
        return self.sample_clients(server_round, send, client_manager)

    def sample_clients(
        self, server_round: int, send: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The round's partitions on the connected nodes, each with ``send`` and its fit
        config."""
        rnd = self.run_round(server_round)
        pids = sample_partitions(self.seed, rnd, self.num_clients, self.clients_per_round)
        sampled = pids
        self._outcome, self._round_errors = None, []
        if self.availability is not None:  # who drops out or would be late: sent nothing
            outcome = self.availability.round(rnd, pids)
            self._outcome = outcome
            self._avail_info = self.availability.record(rnd, outcome)
            pids = outcome.reporting
            if not pids:
                log.warning(
                    "round %d: every sampled client dropped out or was late; "
                    "global model unchanged",
                    rnd,
                )
        out = []
        if pids:
            slots = self._slots(client_manager, len(pids))
            if len(slots) < len(pids):
                log.warning(
                    "round %d: only %d client nodes for %d sampled partitions; "
                    "training the first %d",
                    rnd,
                    len(slots),
                    len(pids),
                    len(slots),
                )
                pids = pids[: len(slots)]
            out = [
                (
                    node,
                    FitIns(
                        self.transport.for_client(send, rnd, i),
                        self.fit_instructions(rnd, pid).to_config(),
                    ),
                )
                for i, (node, pid) in enumerate(zip(slots, pids))
            ]
        self._sent = pids  # the clients whose data may enter this round's release
        self._sampled = pids if self.availability is None else sampled
        timers.server_event("sent", round=rnd, clients=len(out))
        # the round's record when aggregate_fit is not called (Flower skips it when there
        # are no instructions; SecAgg+ halts below 2 reporting clients): nothing trained
        self._fit_info = {
            "num_clients": 0,
            "failures": 0,
            "model_bytes_down": self.model_bytes * len(self._sampled),
            "model_bytes_up": 0,
            **self._avail_info,
        }
        if self.dp is not None:
            self._fit_info.update(self.dp.accountant.record())
        return out

    def fit_instructions(self, run_round: int, partition_id: int) -> FitInstructions:
        """What one sampled client is told besides the weights: the round, its
        partition, the signal exchange's signals and :meth:`client_params`."""
        signals = (
            self.exchange.signals_for_round(run_round)
            if self.exchange is not None
            else (None, None)
        )
        return FitInstructions.build(
            run_round, partition_id, signals=signals, strategy=self.client_params(run_round)
        )

    def aggregate_fit(self, server_round: int, results, failures):
        """The round's new global model from the clients' results, in named steps: screen
        the results (:meth:`_screen`), end a round without usable results
        (:meth:`_empty_round`), average the kept ones (:meth:`_average`), hand the average
        and the kept results to :meth:`server_update`, and record the round's client
        statistics (:func:`client_statistics`)."""
        rnd = self.run_round(server_round)
        timers.server_event("results", round=rnd, results=len(results), failures=len(failures))
        raised = [client_failure(f, self.round_timeout_s) for f in failures]
        reasons = [f"client error: {self._note_error(line)}" for _, line in raised]
        kept = self._screen(results, reasons)
        kept.sort(key=lambda r: r.partition_id)  # order-independent arithmetic
        kept, average = self._verify(kept, reasons)
        # the uploads' store entries go now: what _screen mapped stays readable
        self.transport.release(results)
        if self.secagg and len(kept) < len(results):
            kept = self._discard_secagg_sum(rnd, kept, len(results), reasons)
        for r in reasons:
            log.warning("round %d: dropped a client result (%s)", rnd, r)
        if reasons:
            self._note_error(reasons[0])
        self._round_errors = reasons
        self._count_client_failures(results, raised, reasons, kept)
        info = self._round_info(rnd, kept, len(reasons))
        info.update(self._weight_store_note(reasons))
        if self.secagg:  # every received result is a masked vector inside the sum
            info["model_bytes_up"] = self.secagg_upload_bytes * len(results)
            info["secagg_clients"] = len(kept)
        if not kept:
            return self._empty_round(rnd, info)
        self.consecutive_empty = 0
        self.rounds_trained += 1
        if average is None:
            average = self._average(server_round, kept, info)
        extra = self.server_update(rnd, average, kept) or {}
        info.update(client_statistics(kept))
        info.update(extra)
        self._fit_info = info
        return self.transport.result(self.weights), {}

    def _count_client_failures(
        self,
        results: list,
        raised: list[tuple[int | None, str]],
        reasons: list[str],
        kept: list[ClientResult],
    ) -> None:
        """Count the round for every partition asked to train (:attr:`client_rounds`) and
        a failure, with its first error, for each that did not reach the average
        (:attr:`client_failures`): a client that raised (its partition from the error,
        :func:`client_failure`; one that sent nothing back is the partition without a
        result), or whose result was unusable (its ``partition N: why`` reason). A result
        left out of a discarded SecAgg+ sum is not its client's failure."""
        sent = [int(p) for p in self._sent]
        for pid in sent:
            self.client_rounds[pid] = self.client_rounds.get(pid, 0) + 1
        failed: dict[int, str] = {}
        kept_ids = {r.partition_id for r in kept}
        answered = set(kept_ids)
        kept_res = {id(r.fit_res) for r in kept}
        for _, res in results:  # the few results that were not kept: whose were they?
            if id(res) in kept_res:
                continue
            try:
                answered.add(FitReport.from_metrics(res.metrics).partition_id)
            except ProtocolError:
                continue
        for done in sorted(answered - kept_ids):
            prefix = f"partition {done}: "
            why = next((r for r in reasons if r.startswith(prefix)), None)
            if why is not None and "discarded SecAgg+ sum" not in why:
                failed[done] = why.removeprefix(prefix)
        unnamed = []
        for named, line in raised:
            if named is not None and named in sent:
                failed.setdefault(named, line)
            else:
                unnamed.append(line)
        silent = [p for p in sent if p not in answered and p not in failed]
        if unnamed and silent:  # which of them raised which error is not known
            line = unnamed[0]
            if len(set(unnamed)) > 1:
                line += f" (or another of the round's {len(unnamed)} errors)"
            failed.update({p: line for p in silent})
        for pid, line in failed.items():
            entry = self.client_failures.setdefault(pid, {"failed": 0, "first_error": line})
            entry["failed"] += 1

    def _note_error(self, line: str) -> str:
        """Keep the run's first client error (the message of an aborted run)."""
        if self.first_client_error is None:
            self.first_client_error = line
        return line

    def _screen(self, results, reasons: list[str]) -> list[ClientResult]:
        """The results whose report, parameters and shapes are usable, as
        :class:`ClientResult`; why each other one is unusable goes to ``reasons``: a
        malformed report, undecodable parameters, wrong shapes or a non-finite training
        loss. What needs the values (hash, NaN/Inf, clipping) is :meth:`_verify`'s."""
        kept: list[ClientResult] = []
        for _, res in results:
            try:
                report = FitReport.from_metrics(res.metrics)
            except ProtocolError as exc:
                reasons.append(f"malformed fit report ({exc})")
                continue
            pid = report.partition_id
            try:
                arrays, hash_check = open_upload(res.parameters)
            except Exception as exc:  # noqa: BLE001 - any undecodable upload is dropped
                reasons.append(f"partition {pid}: undecodable parameters ({exc})")
                continue
            why = check_shapes(arrays, self.weights)
            loss = report.train_loss if report.train_loss is not None else 0.0
            if why is None and not np.isfinite(loss):
                why = "non-finite training loss"
            if why is not None:
                reasons.append(f"partition {pid}: {why}")
                continue
            kept.append(ClientResult(pid, arrays, report, res, hash_check))
        return kept

    def _verify(
        self, kept: list[ClientResult], reasons: list[str]
    ) -> tuple[list[ClientResult], list | None]:
        """The screened results whose values are usable: an upload by reference hashes
        to its name (:class:`~fedrcl_flwr.weights.reading.HashCheck`), holds no NaN/Inf and
        (client-side DP) is clipped; why each other one is not goes to ``reasons``.
        Every value used is a value checked: with the plain average (no DP, no SecAgg+)
        the uploads are read once for the hash, the NaN/Inf screen and the average
        (:func:`average_and_screen`): uploads in the weight store on one thread, each
        piece copied out of the store and hashed by its upload's check as it is
        averaged; uploads inside the messages (the process's own bytes) by
        :attr:`average_workers` threads. That average is returned when every upload
        passed (else ``None``). Otherwise (DP, SecAgg+, a dropped upload) each upload in
        the store is read again as a checked copy of its own (:func:`arrays_of`), which
        the checks, the DP wrapper and :meth:`_average` then read."""
        if not kept:
            return kept, None
        average, finite = None, False
        checks = [r.hash_check for r in kept]
        if self.dp is None and not self.secagg:
            coefs = client_coefficients([r.num_examples for r in kept], self.weighting)
            weights = [r.weights for r in kept]
            if any(c is not None for c in checks):

                def take(i: int, j: int, start: int, stop: int) -> np.ndarray:
                    check = checks[i]
                    if check is None:  # bytes of the message
                        return weights[i][j].reshape(-1)[start:stop]
                    return check.take(j, start, stop)

                average, finite = average_and_screen(
                    weights, coefs, self.kinds, take, dtype=self.average_dtype
                )
            else:
                average, finite = average_and_screen(
                    weights,
                    coefs,
                    self.kinds,
                    workers=self.average_workers,
                    dtype=self.average_dtype,
                )
        hashed = []
        for r in kept:
            if r.hash_check is not None and average is not None:
                try:
                    r.hash_check.finish()
                except StoreError as exc:
                    reasons.append(f"partition {r.partition_id}: undecodable parameters ({exc})")
                    continue
            hashed.append(r)
        if average is not None and finite and len(hashed) == len(kept):
            return kept, average
        good = []
        for r in hashed:
            why = None
            if r.hash_check is not None:  # read again: a checked copy of its own
                try:
                    r = replace(r, weights=arrays_of(r.fit_res.parameters), hash_check=None)
                except StoreError as exc:
                    why = f"undecodable parameters ({exc})"
            if why is None and (average is None or not finite):
                why = check_update(r.weights, self.weights)
            if why is None and self.dp is not None and not self.secagg:
                why = self.dp.unclipped(r.weights)
            if why is not None:
                reasons.append(f"partition {r.partition_id}: {why}")
                continue
            good.append(r)
        return good, None

    def _discard_secagg_sum(
        self, rnd: int, kept: list[ClientResult], received: int, reasons: list[str]
    ) -> list[ClientResult]:
        """SecAgg+: an unusable result is inside the masked sum every result holds, so a
        round with one is discarded whole."""
        log.warning(
            "round %d: SecAgg+: %d result(s) unusable, and a result cannot be "
            "taken out of the masked sum: the round's aggregate is discarded",
            rnd,
            received - len(kept),
        )
        reasons += [f"partition {r.partition_id}: in a discarded SecAgg+ sum" for r in kept]
        return []

    def _round_info(self, rnd: int, kept: list[ClientResult], failures: int) -> dict:
        """The round's record so far: clients kept and failed, bytes moved, ε, and the
        signal exchange's ingest of the kept uploads."""
        info = {
            "num_clients": len(kept),
            "failures": failures,
            "model_bytes_down": self.model_bytes * len(self._sampled),
            "model_bytes_up": self.model_bytes * len(kept),
            **self._avail_info,
        }
        if self.dp is not None:  # ε so far (updated in _average when this round releases)
            info.update(self.dp.accountant.record())
        if self.exchange is not None:
            info["signal_bytes_down"] = self.exchange.bytes_down_per_client(rnd) * len(
                self._sampled
            )
            info.update(self.exchange.ingest(rnd, [(r.partition_id, r.report) for r in kept]))
        return info

    def _weight_store_note(self, reasons: list[str]) -> dict:
        """``{"weight_store": line}`` when the weight store cost this round something:
        results refused because an entry did not hash to its name (a client refusing the
        model it was sent, or the server refusing an upload), and a slot found damaged
        when its model was sent again (sent in a new slot: the damage costs no more
        than the round it happened in); else nothing."""
        notes = []
        refused = sum(1 for r in reasons if "weight store entry" in r)
        if refused:
            notes.append(
                f"{refused} result(s) lost to a damaged weight store entry (did not hash to "
                "its name)"
            )
        notes += self.transport.rewritten
        self.transport.rewritten = []
        return {"weight_store": "; ".join(notes)} if notes else {}

    def _empty_round(self, rnd: int, info: dict):
        """No usable result: the global model stays; abort after
        ``max_consecutive_failed_rounds`` such rounds, or at the last round when no
        client ever trained."""
        self.consecutive_empty += 1
        log.warning(
            "round %d: every client failed; global model unchanged (%d consecutive empty rounds)",
            rnd,
            self.consecutive_empty,
        )
        self._fit_info = info
        first = (
            f"; first client error: {self.first_client_error}" if self.first_client_error else ""
        )
        if self.consecutive_empty >= self.max_failed:
            self.drain()  # the previous round's record and checkpoint first
            raise AllClientsFailed(
                f"aborting: {self.consecutive_empty} consecutive rounds in which every "
                f"client failed (federation.max_consecutive_failed_rounds="
                f"{self.max_failed}){first}"
            )
        return self.transport.result(self.weights), {}  # the last round: the rule in _round_end

    def _failure_reason(self) -> str:
        """Why the current round's update did not reach the model, in one line: every
        sampled client dropped out or was late (with counts), SecAgg+ below 2 clients or
        with an unreachable threshold (Flower's setup arithmetic,
        :func:`fedrcl_flwr.privacy.secagg_setup`), SecAgg+ discarded or halted the round,
        every client failed (the round's first error), or too few client nodes."""
        sent = len(self._sent)
        out = self._outcome
        if sent == 0 and out is not None:
            what = f"all {len(self._sampled)} sampled clients dropped out ({len(out.dropped_out)})"
            return what + (f" or were late ({len(out.late)})" if out.late else "")
        if sent == 0:
            return "no client was sent the model (no client node available)"
        errors = self._round_errors
        if self.secagg and errors and any("discarded SecAgg+ sum" in e for e in errors):
            bad = [e for e in errors if "discarded SecAgg+ sum" not in e]
            return (
                f"SecAgg+ discarded the round: {len(bad)} of {len(errors)} results unusable "
                f"and a result cannot be taken out of the masked sum ({bad[0] if bad else ''})"
            )
        if errors and self.round_timeout_s is not None:
            timed_out = f"client error: {no_reply_line(self.round_timeout_s)}"
            if all(e == timed_out for e in errors):
                return (
                    f"every client timed out: no reply within {self.round_timeout_s:g} s "
                    "(federation.round_timeout_s)"
                )
        if errors:
            return f"every client failed (first error: {errors[0].removeprefix('client error: ')})"
        if self.secagg and self.secagg_params is not None:
            from fedrcl_flwr.privacy import secagg_setup

            plan = secagg_setup(*self.secagg_params, sent)
            if plan["reason"] is not None:
                return plan["reason"]
            return (
                f"SecAgg+ halted the round with {sent} clients (a client failed or "
                "timed out during the protocol; see run.log)"
            )
        return f"no result came back from the {sent} clients sent the model"

    def _never_trained(self, rnd: int, fit_info: dict) -> str:
        """The message of a run that trained in none of its rounds."""
        first = (
            f"; first client error: {self.first_client_error}" if self.first_client_error else ""
        )
        why = fit_info.get("failure_reason")
        last = f"; round {rnd}: {why}" if why and not first else ""
        return f"no client trained in any of the {rnd} rounds{first}{last}"

    def _average(self, server_round: int, kept: list[ClientResult], info: dict) -> list:
        """The clients' average: through Flower's DP wrapper (clip, average, noise; the
        release is accounted in ``info``), SecAgg+'s unmasked average, or the uniform /
        sample-weighted average (``server.weighting``)."""
        if self.dp is not None:  # Flower's wrapper: clip (server mode), average, noise
            average = self.dp.aggregate(
                server_round, kept, secagg_active=len(kept) if self.secagg else 0
            )
            self.dp.accountant.record_release(self._sent)
            info.update(self.dp.accountant.record())
            return average
        if self.secagg:  # every result holds the same unmasked SecAgg+ average
            return [
                np.asarray(a).astype(np.asarray(w).dtype)
                for a, w in zip(kept[0].weights, self.weights)
            ]
        coefs = client_coefficients([r.num_examples for r in kept], self.weighting)
        return weighted_average([r.weights for r in kept], coefs, self.kinds, self.average_dtype)

    def _client_eval_due(self, rnd: int) -> bool:
        from fedrcl_flwr.client_eval import due

        return (
            self.per_client is not None
            and self.evaluate_fn is not None
            and due(self.per_client[0], rnd, self.rounds)
        )

    def configure_evaluate(self, server_round, parameters, client_manager):
        """Per-client evaluation when due (``fedrcl_flwr/client_eval.py``): the round's
        global model to the round's sampled partitions (or all), spread over the nodes;
        otherwise nothing (centralised evaluation only)."""
        from fedrcl_flwr.client_eval import assign

        rnd = self.run_round(server_round)
        if self._deferred is None or not self._client_eval_due(rnd):
            return []
        if self.per_client[1] == "all":
            pids = list(range(self.num_clients))
        elif self.per_client[1] == "unsampled":  # the clients this round did not learn from
            from fedrcl_flwr.client_eval import unsampled_partitions

            pids = unsampled_partitions(
                self.seed,
                rnd,
                self.num_clients,
                sample_partitions(self.seed, rnd, self.num_clients, self.clients_per_round),
            )
        else:
            pids = list(self._sampled)
        slots = self._slots(client_manager, len(pids))
        send = self.transport.send(self._deferred[2]["weights"])
        return [
            (
                slot,
                EvaluateIns(
                    send,
                    EvaluateInstructions(run_round=rnd, partition_ids=tuple(group)).to_config(),
                ),
            )
            for slot, group in zip(slots, assign(pids, len(slots)))
        ]

    def aggregate_evaluate(
        self, server_round: int, results: list, failures: list
    ) -> tuple[float | None, dict]:
        """Adds the per-client statistics to the round's record, then ends the round."""
        from fedrcl_flwr.client_eval import summarize

        if self._deferred is None:
            return None, {}
        per: dict = {}
        bad = len(failures)
        for _, res in results:
            got = EvaluateReport.from_metrics(res.metrics).results
            if not got and res.num_examples:
                bad += 1
            per.update(got)
        if failures:
            log.warning(
                "round %d: %d per-client evaluation(s) failed (%s)",
                self.run_round(server_round),
                len(failures),
                client_error_line(failures[0]),
            )
        stats = summarize(per, bad)
        rnd, due, state, info, start = self._deferred
        self._deferred = None
        self._end_round((rnd, due, state, {**info, **stats}, start))
        n = sum(c[1] for c in per.values())
        loss = sum(c[2] for c in per.values()) / n if n else None
        return loss, {k: v for k, v in stats.items() if isinstance(v, (int, float))}

    def evaluate(self, server_round: int, parameters: Parameters):
        rnd = self.run_round(server_round)
        if server_round == 0:
            return None
        self.drain()  # at most one round end in flight: the previous one is done first
        due = self.evaluate_fn is not None and (rnd % self.eval_every == 0 or rnd == self.rounds)
        state = self.state_dict()  # copies: the next round may change the live arrays
        info = dict(self._fit_info)
        if not info.get("num_clients"):  # no update reached the model: a failed round
            info["round_failed"] = True
            info["failure_reason"] = self._failure_reason()
            log.warning("round %d failed (model unchanged): %s", rnd, info["failure_reason"])
        job = (rnd, due, state, info, self._round_start)
        if self._client_eval_due(rnd):  # the record waits for aggregate_evaluate
            self._deferred = job
            return None
        record = self._end_round(job)
        if record is None or "test_loss" not in record:
            return None
        return record["test_loss"], {"accuracy": float(record.get("test_accuracy", 0.0))}

    def _end_round(self, job) -> dict | None:
        """Run the round end ``job`` now, or in the background thread (overlap)."""
        rnd = job[0]
        if self.overlap_evaluation and rnd < self.rounds:
            from concurrent.futures import ThreadPoolExecutor

            if self._round_end_executor is None:
                self._round_end_executor = ThreadPoolExecutor(
                    1, thread_name_prefix="fedrcl-round-end"
                )
            # the round's time ends here, at the hand-over: its evaluation overlaps the
            # next round, whose own time already counts those seconds
            job = (*job, time.time())
            self._round_end_pending = self._round_end_executor.submit(self._round_end, *job)
            return None  # Flower's own history only; the run's record comes from the thread
        return self._round_end(*job)

    def _round_end(
        self,
        rnd: int,
        due: bool,
        state: dict,
        fit_info: dict,
        round_start: float,
        handed_over: float | None = None,
    ) -> dict | None:
        """Evaluate the round's global model (``state["weights"]``), record it, then hand
        the round's state to ``on_checkpoint``. ``round_time_s``: seconds from the round's
        start to its record, evaluation included; for a round whose evaluation overlaps
        the next round (``handed_over``: when it was handed to the background thread) to
        the hand-over, so that the rounds' times add up to the run's time instead of
        counting the overlapped evaluation twice."""
        record = None
        timers.server_event("round_end_start", round=rnd)
        if due and self.evaluate_fn is not None:  # due only with an evaluate_fn
            loss, metrics = self.evaluate_fn(rnd, state["weights"])
            record = {
                "round": rnd,
                "test_loss": loss,
                **metrics,
                **fit_info,
                "round_time_s": (handed_over or time.time()) - round_start,
            }
        elif fit_info.get("round_failed"):  # recorded even when not evaluated
            ended = handed_over or time.time()
            record = {"round": rnd, **fit_info, "round_time_s": ended - round_start}
        if record is not None and self.on_record is not None:
            self.on_record(record)
        if rnd >= self.rounds and not state.get("rounds_trained"):
            raise AllClientsFailed(self._never_trained(rnd, fit_info))
        if self.on_checkpoint is not None:
            self.on_checkpoint(rnd, state)
        timers.server_event("round_end_end", round=rnd)
        return record

    def drain(self) -> None:
        """Wait for the overlapped round end, if any (re-raising its error); a round end
        still waiting for a per-client evaluation that never came is done without it."""
        pending, self._round_end_pending = self._round_end_pending, None
        if pending is not None:
            pending.result()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._round_end(*deferred)
