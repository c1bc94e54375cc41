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
   :class:`~strategies.screening.ClientResult` s to :meth:`server_update`, the hook
   where server optimizers (FedAvgM, FedAdam, FedACG, FedDyn) differ;
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

What a server rule declares and overrides is :class:`strategies.server_rule.ServerRule`
(this class's second base). The round's steps are small collaborators:
:mod:`strategies.sampling` (who trains, on which node), :mod:`strategies.screening`
(what a client result is and which are unusable), :mod:`strategies.averaging` (the
round's average: plain, DP or SecAgg+), :mod:`strategies.round_records` (the round
ledger, failed rounds, the round's client statistics), :mod:`strategies.round_end`
(evaluate, record and checkpoint a round, in line or in the background thread),
:mod:`strategies.state` (buffers and checkpointed state) and
:mod:`strategies.client_evaluation` (per-client evaluation).

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
``round_failed: true`` and ``failure_reason`` (one line,
:func:`strategies.round_records.failure_reason`), its progress line says ``ROUND FAILED
(model unchanged): <why>``, and a run in which no round trained ends with
:class:`~strategies.round_records.AllClientsFailed` after its last round's record (the
CLI: exit 1, one line). ``federation.max_consecutive_failed_rounds`` rounds in a row in
which every client *failed* (errors, not dropouts) abort the run earlier.

Rounds: Flower numbers the rounds of *this process* 1, 2, ... (``server_round``); a resumed
run continues at ``run_round = server_round + round_offset`` (rounds done before). Every
hook, record, sample and checkpoint uses ``run_round``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
from flwr.common import FitIns, Parameters
from flwr.server import ClientManager
from flwr.server.strategy import Strategy

from fedrcl_flwr.app.wire.flower_private import ClientProxy
from fedrcl_flwr.app.wire.transport import ServerTransport
from fedrcl_flwr.privacy import secagg_upload_bytes
from fedrcl_flwr.protocol import FitInstructions
from fedrcl_flwr.run import timers
from fedrcl_flwr.server.aggregation import average_workers, entry_kinds
from strategies.averaging import Averaging, average_kept
from strategies.client_evaluation import (
    evaluate_instructions,
    evaluation_due,
    evaluation_partitions,
    read_evaluations,
)
from strategies.round_end import RoundEndHooks, RoundEnds
from strategies.round_records import (
    AllClientsFailed,
    RoundLedger,
    client_statistics,
    failure_reason,
    weight_store_note,
)
from strategies.sampling import client_slots, draw_round, fit_messages, fit_on_slots
from strategies.screening import ClientResult, client_failure, usable_results
from strategies.server_rule import ServerRule
from strategies.state import load_strategy_state, new_buffer, strategy_state

log = logging.getLogger("fedrcl_flwr")


class FederatedStrategy(Strategy, ServerRule):
    """FedAvg with deterministic partition sampling, fault filtering and the hooks of
    :class:`~strategies.server_rule.ServerRule`, run in Flower's rounds."""

    name = "fedavg"

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
        self._ends = RoundEnds(overlap_evaluation)  # in line or in the background
        self.p = self.resolve(params)
        self.num_clients, self.clients_per_round = num_clients, clients_per_round
        self.rounds, self.seed, self.eval_every = rounds, seed, eval_every
        self.weighting = weighting
        # server.average_dtype: the average's arithmetic (fedrcl_flwr/server/aggregation.py)
        self.average_dtype = average_dtype
        self.evaluate_fn, self.on_record = evaluate_fn, on_record
        self.on_checkpoint = on_checkpoint
        self.expected_nodes, self.node_wait_s = expected_nodes, node_wait_s
        self.round_offset = round_offset
        self.exchange = exchange  # optional SignalExchange (FedCCL, FedProto, FPL)
        self.ledger = RoundLedger(max_consecutive_failed_rounds)
        self._init_model(initial_weights, trainable)
        self._init_round_state()
        for b in self.buffers:  # each declared buffer (module doc)
            setattr(self, b, new_buffer(self.weights, self.kinds, self.buffer_fill(b)))
        self._init_privacy(privacy)

    def _init_model(self, initial_weights: list[np.ndarray], trainable: list[bool]) -> None:
        """The global model, its entries' kinds, what it costs on the wire, how it travels."""
        self.weights = [np.asarray(w).copy() for w in initial_weights]
        self.kinds = entry_kinds(self.weights, trainable)
        self.model_bytes = int(sum(np.asarray(w).nbytes for w in self.weights))
        # privacy.secagg: what one client uploads instead, Flower's SecAgg+ masked vector
        self.secagg_upload_bytes = secagg_upload_bytes(self.weights)
        # how weights travel (fedrcl_flwr/app/wire/transport.py): Flower's messages unless the
        # app hands the strategy the run's weight store (simulation.transport: shared)
        self.transport = ServerTransport()

    def _init_round_state(self) -> None:
        """What the server keeps within a round (the run's records: :attr:`ledger`)."""
        self._fit_info: dict = {}
        self._avail_info: dict = {}
        self._outcome = None  # the round's availability outcome (None: all were sent)
        self._round_errors: list[str] = []  # why the round's results were unusable
        self._sampled: list[int] = []  # the round's sampled partitions (all, with availability)
        self._sent: list[int] = []  # those sent the model to train
        self._round_start = time.time()
        # threads of the server's average (the same bytes for any number: aggregation.py)
        self.average_workers = average_workers()

    def _init_privacy(self, privacy) -> None:
        """``privacy`` (a ``fedrcl_flwr.config.PrivacyConfig``; off by default): central
        DP through Flower's wrappers (``strategies/privacy.py``), SecAgg+ results
        (``fedrcl_flwr/app``)."""
        from strategies.privacy import privacy_settings

        self.secagg, self.secagg_params, self.dp = privacy_settings(self, privacy)

    def state_dict(self) -> dict:
        """The state a checkpoint holds (copies: :func:`strategies.state.strategy_state`)."""
        return strategy_state(self)

    def load_state_dict(self, state: dict) -> None:
        """Resume from a checkpoint's state (:func:`strategies.state.load_strategy_state`)."""
        load_strategy_state(self, state)

    # --------------------------------------------------------------- Strategy
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.transport.send(self.weights)

    def run_round(self, server_round: int) -> int:
        """The run's round number of Flower's ``server_round`` (shifted on resume)."""
        return server_round + self.round_offset

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
        draw = draw_round(
            self.seed, rnd, self.num_clients, self.clients_per_round, self.availability
        )
        self._outcome, self._round_errors = draw.outcome, []
        if draw.record is not None:
            self._avail_info = draw.record
        pids, out = draw.reporting, []
        if pids:
            slots = client_slots(client_manager, len(pids), self.expected_nodes, self.node_wait_s)
            pids = fit_on_slots(rnd, pids, slots)
            out = fit_messages(slots, pids, send, rnd, self.transport, self.fit_instructions)
        self._sent = pids  # the clients whose data may enter this round's release
        self._sampled = pids if self.availability is None else draw.sampled
        timers.server_event("sent", round=rnd, clients=len(out))
        # the round's record when aggregate_fit is not called (Flower skips it when there
        # are no instructions; SecAgg+ halts below 2 reporting clients): nothing trained
        self._fit_info = self._round_info(rnd, [], 0, exchange=False)
        return out

    def fit_instructions(self, run_round: int, partition_id: int) -> FitInstructions:
        """What one sampled client is told besides the weights: the round, its
        partition, the signal exchange's signals and :meth:`client_params`."""
        exchange = self.exchange
        signals = exchange.signals_for_round(run_round) if exchange is not None else (None, None)
        return FitInstructions.build(
            run_round, partition_id, signals=signals, strategy=self.client_params(run_round)
        )

    def aggregate_fit(self, server_round: int, results, failures):
        """The round's new global model from the clients' results, in named steps: screen
        the results (:func:`~strategies.screening.usable_results`), end a round without
        usable results (:meth:`_empty_round`), average the kept ones
        (:func:`~strategies.averaging.average_kept` unless screening averaged them), hand
        the average and the kept results to :meth:`server_update`, and record the round's
        client statistics (:func:`client_statistics`)."""
        rnd = self.run_round(server_round)
        timers.server_event("results", round=rnd, results=len(results), failures=len(failures))
        raised = [client_failure(f, self.round_timeout_s) for f in failures]
        reasons = [f"client error: {self.ledger.note_error(line)}" for _, line in raised]
        kept, average = usable_results(
            rnd, results, reasons, self.weights, self._averaging(), self.transport.release
        )
        if reasons:
            self.ledger.note_error(reasons[0])
        self._round_errors = reasons
        self.ledger.count_client_failures(self._sent, results, raised, reasons, kept)
        info = self._round_info(rnd, kept, len(reasons))
        info.update(weight_store_note(reasons, self.transport))
        if self.secagg:  # every received result is a masked vector inside the sum
            info["model_bytes_up"] = self.secagg_upload_bytes * len(results)
            info["secagg_clients"] = len(kept)
        if not kept:
            return self._empty_round(rnd, info)
        self.ledger.trained()
        if average is None:  # DP, SecAgg+ or a dropped upload: averaged now
            how = self._averaging()
            average = average_kept(server_round, kept, self.weights, how, info, self._sent)
        extra = self.server_update(rnd, average, kept) or {}
        info.update(client_statistics(kept))
        info.update(extra)
        self._fit_info = info
        return self.transport.result(self.weights), {}

    def _round_info(
        self, rnd: int, kept: list[ClientResult], failures: int, exchange: bool = True
    ) -> dict:
        """The round's record so far: clients kept and failed, bytes moved, ε, and (with
        ``exchange``) the signal exchange's ingest of the kept uploads."""
        info = {
            "num_clients": len(kept),
            "failures": failures,
            "model_bytes_down": self.model_bytes * len(self._sampled),
            "model_bytes_up": self.model_bytes * len(kept),
            **self._avail_info,
        }
        if self.dp is not None:  # ε so far (updated by average_kept when this round releases)
            info.update(self.dp.accountant.record())
        if self.exchange is not None and exchange:
            info["signal_bytes_down"] = self.exchange.bytes_down_per_client(rnd) * len(
                self._sampled
            )
            info.update(self.exchange.ingest(rnd, [(r.partition_id, r.report) for r in kept]))
        return info

    def _empty_round(self, rnd: int, info: dict):
        """No usable result: the global model stays; abort after
        ``max_consecutive_failed_rounds`` such rounds, or at the last round when no
        client ever trained."""
        abort = self.ledger.empty_round(rnd)
        self._fit_info = info
        if abort is not None:
            self.drain()  # the previous round's record and checkpoint first
            raise AllClientsFailed(abort)
        return self.transport.result(self.weights), {}  # the last round: finish_round's rule

    def _failure_reason(self) -> str:
        """Why the current round's update did not reach the model, in one line
        (:func:`strategies.round_records.failure_reason`)."""
        return failure_reason(
            sampled=len(self._sampled),
            sent=len(self._sent),
            outcome=self._outcome,
            errors=self._round_errors,
            round_timeout_s=self.round_timeout_s,
            secagg_params=self.secagg_params if self.secagg else None,
        )

    def _averaging(self) -> Averaging:
        """How the round's average is taken (``strategies/averaging.py``)."""
        plain = (self.kinds, self.weighting, self.average_dtype, self.average_workers)
        return Averaging(*plain, dp=self.dp, secagg=self.secagg)

    def _client_eval_due(self, rnd: int) -> bool:
        return evaluation_due(self.per_client, self.evaluate_fn is not None, rnd, self.rounds)

    def configure_evaluate(self, server_round, parameters, client_manager):
        """Per-client evaluation when due (``strategies/client_evaluation.py``): the
        round's global model to the round's sampled partitions (or all, or as many
        unsampled), spread over the nodes; otherwise nothing (centralised evaluation only)."""
        rnd = self.run_round(server_round)
        deferred = self._ends.deferred
        if deferred is None or not self._client_eval_due(rnd):
            return []
        assert self.per_client is not None  # _client_eval_due
        which, n, k = self.per_client[1], self.num_clients, self.clients_per_round
        pids = evaluation_partitions(which, self.seed, rnd, n, k, self._sampled)
        slots = client_slots(client_manager, len(pids), self.expected_nodes, self.node_wait_s)
        send = self.transport.send(deferred[2]["weights"])
        return evaluate_instructions(slots, pids, send, rnd)

    def aggregate_evaluate(
        self, server_round: int, results: list, failures: list
    ) -> tuple[float | None, dict]:
        """Adds the per-client statistics to the round's record, then ends the round."""
        if self._ends.deferred is None:
            return None, {}
        stats, loss = read_evaluations(self.run_round(server_round), results, failures)
        rnd, due, state, info, start = self._ends.deferred
        self._ends.deferred = None
        self._ends.run(self._round_end_hooks(), (rnd, due, state, {**info, **stats}, start))
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
            self._ends.deferred = job
            return None
        record = self._ends.run(self._round_end_hooks(), job)
        if record is None or "test_loss" not in record:
            return None
        return record["test_loss"], {"accuracy": float(record.get("test_accuracy", 0.0))}

    def _round_end_hooks(self) -> RoundEndHooks:
        """What a round end calls, as configured now (``strategies/round_end.py``)."""
        return RoundEndHooks(
            rounds=self.rounds,
            evaluate_fn=self.evaluate_fn,
            on_record=self.on_record,
            on_checkpoint=self.on_checkpoint,
            never_trained=self.ledger.never_trained,
        )

    def drain(self) -> None:
        """Wait for the overlapped round end, if any (re-raising its error); a round end
        still waiting for a per-client evaluation that never came is done without it."""
        self._ends.drain(self._round_end_hooks())
