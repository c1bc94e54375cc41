"""Drive the real strategy and clients round by round in one process, without Flower's
runtime: the same ``configure_fit`` -> ``fit`` -> ``aggregate_fit`` -> ``evaluate`` ->
``configure_evaluate`` -> ``evaluate`` (clients) -> ``aggregate_evaluate`` calls Flower's
server loop makes. For tests, debugging and the simulation-overhead benchmark.
"""

from __future__ import annotations

import copy
from pathlib import Path

from flwr.app import Context
from flwr.common import EvaluateIns, FitIns
from flwr.server import Grid

from clients import client_class
from fedrcl_flwr.app.server_app import build_server
from fedrcl_flwr.app.wire.transport import ServerTransport, fallback_reason
from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.run.run_files import CLIENT_STATE_DIR
from fedrcl_flwr.weights.lifecycle import remove_store, temporary_store


class _Slot:
    def __init__(self, cid: str):
        self.cid = cid


class _Manager:
    def __init__(self, n: int):
        self._all = {str(i): _Slot(str(i)) for i in range(n)}

    def wait_for(self, num, timeout=0):
        return True

    def all(self):
        return self._all


def evaluate_clients(strategy, server_round: int, manager, make) -> None:
    """Flower's federated evaluation after the centralised one: ``configure_evaluate``
    -> each client's ``evaluate`` -> ``aggregate_evaluate`` (skipped, as by Flower,
    when there are no instructions)."""
    ins = strategy.configure_evaluate(server_round, None, manager)
    if not ins:
        return
    results, failures = [], []
    for slot, eval_ins in ins:
        try:  # the client's own Flower Client, as the ClientApp hands it the message
            results.append(
                (
                    slot,
                    make()
                    .to_client()
                    .evaluate(EvaluateIns(eval_ins.parameters, dict(eval_ins.config))),
                )
            )
        except Exception as exc:  # noqa: BLE001 - mirrors Flower: failure, not crash
            failures.append(exc)
    strategy.aggregate_evaluate(server_round, results, failures)


def run_inprocess(
    cfg: ExperimentConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    client_factory=None,
    overlap_evaluation: bool = False,
):
    """Run the experiment sequentially; returns the strategy. ``stop_after`` ends early
    (as if killed) after that many rounds of this call. ``overlap_evaluation`` evaluates
    each round in the background while the next trains, as the ServerApp does (see
    ``strategies/base.py``). An experiment whose privacy needs the ClientApp's mods
    (``privacy.secagg``, ``privacy.dp.mode: client``) runs through Flower's workflow
    instead (:func:`run_workflow_inprocess`; ``client_factory`` and
    ``overlap_evaluation`` do not apply). Weights travel as configured
    (``simulation.transport``: by reference through a weight store of this call's own,
    removed at the end, or inside the messages; ``fedrcl_flwr/app/wire/transport.py``)."""
    dp = cfg.privacy.dp
    if cfg.privacy.secagg or (dp is not None and dp.mode == "client"):
        return run_workflow_inprocess(cfg, out_dir, resume=resume, stop_after=stop_after)
    strategy, rounds_left = build_server(
        cfg, Path(out_dir), resume=resume, overlap_evaluation=overlap_evaluation
    )
    root = None
    if fallback_reason(cfg) is None:
        store, root = temporary_store()
        strategy.transport = ServerTransport(
            store, f"weights by reference through {root}", uploads=strategy.clients_per_round
        )
        strategy.transport.prepare(strategy.weights)
    try:
        _rounds(strategy, cfg, out_dir, rounds_left, stop_after, client_factory)
    finally:
        if root is not None:
            remove_store(root)
    return strategy


def _rounds(strategy, cfg, out_dir, rounds_left, stop_after, client_factory) -> None:
    """:func:`run_inprocess`'s loop: Flower's legacy server loop, call for call."""
    manager = _Manager(cfg.federation.sampled_per_round())
    cls = client_class(cfg.client.method)
    state_dir = str(Path(out_dir) / CLIENT_STATE_DIR)  # as the ClientApp: per-client state
    make = client_factory or (lambda: cls(cfg, state_dir=state_dir))
    for server_round in range(1, rounds_left + 1):
        ins = strategy.configure_fit(server_round, None, manager)
        results, failures = [], []
        for slot, fit_ins in ins:
            try:  # the client's own Flower Client, as the ClientApp hands it the message
                res = make().to_client().fit(FitIns(fit_ins.parameters, dict(fit_ins.config)))
                results.append((slot, res))
            except Exception as exc:  # noqa: BLE001 - mirrors Flower: failure, not crash
                failures.append(exc)
        if ins:  # as Flower: no instructions (every client dropped out), no aggregate_fit
            strategy.aggregate_fit(server_round, results, failures)
        strategy.evaluate(server_round, None)
        evaluate_clients(strategy, server_round, manager, make)
        if stop_after is not None and server_round >= stop_after:
            break
    strategy.drain()
    if strategy.tracker is not None:  # stopped early: close what a killed run leaves open
        strategy.tracker.close()


class InProcessGrid(Grid):
    """A Flower ``Grid`` that hands each message to the project's real ClientApp
    (``client_app.app``: its mods, Flower's ``secaggplus_mod`` / ``fixedclipping_mod``,
    the method's client) in this process, one node per sampled client, each with its own
    ``Context`` kept across messages as a SuperNode keeps it. A ClientApp exception
    becomes an error reply, as Flower's runtime makes it."""

    def __init__(self, run_config: dict, num_nodes: int, run_id: int = 1):
        from types import SimpleNamespace

        from flwr.app import RecordDict

        self._run = SimpleNamespace(run_id=run_id)
        self.contexts = {
            1000 + i: Context(
                run_id=run_id,
                node_id=1000 + i,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i in range(num_nodes)
        }

    def set_run(self, run) -> None:
        pass

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        from flwr.app import Message

        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError("InProcessGrid answers in send_and_receive only")

    def pull_messages(self, reply_to_message_ids=None, *, message_ids=None):
        """Flower 1.41 / 1.42 call it ``pull_messages(message_ids)``, 1.43
        ``pull_messages(reply_to_message_ids=None, *, message_ids=None)`` (``message_ids``
        deprecated): both forms are accepted; replies come only from
        :meth:`send_and_receive`."""
        raise NotImplementedError("InProcessGrid answers in send_and_receive only")

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Error, Message

        from fedrcl_flwr.app.client_app import app as client_app
        from fedrcl_flwr.app.wire.flower_private import CLIENT_APP_RAISED_EXCEPTION

        replies = []
        for msg in messages:
            msg = copy.deepcopy(msg)  # a message on the wire is each node's own copy
            try:
                replies.append(client_app(msg, self.contexts[msg.metadata.dst_node_id]))
            except Exception as exc:  # noqa: BLE001 - Flower's runtime replies an error
                replies.append(
                    Message(
                        Error(CLIENT_APP_RAISED_EXCEPTION, f"{type(exc).__name__}: {exc}"),
                        reply_to=msg,
                    )
                )
        return replies


def run_workflow_inprocess(
    cfg: ExperimentConfig, out_dir: Path, *, resume: bool = False, stop_after: int | None = None
):
    """Run the experiment through Flower's workflow API in this process: the real
    ``ServerApp`` steps (``DefaultWorkflow``, with Flower's ``SecAggPlusWorkflow`` when
    ``privacy.secagg``) and the real ``ClientApp`` with its mods on an
    :class:`InProcessGrid`. What :func:`run_inprocess` uses when the experiment needs the
    ClientApp's privacy mods (SecAgg+, client-side DP clipping); returns the strategy."""
    from flwr.app import RecordDict
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.workflow import DefaultWorkflow

    from fedrcl_flwr.app.server_app import EagerClientManager
    from fedrcl_flwr.app.validate import secagg_max_weight, secagg_workflow
    from fedrcl_flwr.app.wire.flower_private import task_identity
    from fedrcl_flwr.run.run_files import CONFIG_FILE

    out_dir = Path(out_dir)
    strategy, rounds_left = build_server(cfg, out_dir, resume=resume)
    run_config: dict[str, bool | float | int | str] = {
        "experiment": str(out_dir / CONFIG_FILE),
        "output-dir": str(out_dir),
        "resume": "true" if resume else "false",
    }
    rounds = rounds_left if stop_after is None else min(stop_after, rounds_left)
    grid = InProcessGrid(run_config, cfg.federation.sampled_per_round())
    server_ctx = Context(
        run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config
    )
    fit = secagg_workflow(cfg, max_weight=secagg_max_weight(cfg)) if cfg.privacy.secagg else None
    try:
        if rounds > 0:
            with task_identity(1, 1):
                DefaultWorkflow(fit_workflow=fit)(
                    grid,
                    LegacyContext(
                        context=server_ctx,
                        config=ServerConfig(num_rounds=rounds),
                        strategy=strategy,
                        client_manager=EagerClientManager(),
                    ),
                )
        strategy.drain()
    finally:
        if strategy.tracker is not None:
            strategy.tracker.close()
    return strategy
