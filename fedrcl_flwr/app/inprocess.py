"""Drive the real strategy and clients round by round in one process, without Flower's
runtime: the same ``configure_fit`` -> ``fit`` -> ``aggregate_fit`` -> ``evaluate`` ->
``configure_evaluate`` -> ``evaluate`` (clients) -> ``aggregate_evaluate`` calls Flower's
server loop makes. For tests, debugging and the simulation-overhead benchmark.
"""

from __future__ import annotations

from pathlib import Path

from flwr.common import (
    Code,
    EvaluateRes,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from clients import client_class
from fedrcl_flwr.app.server_app import build_server
from fedrcl_flwr.config import ExperimentConfig


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
        try:
            loss, n, metrics = make().evaluate(parameters_to_ndarrays(eval_ins.parameters),
                                               dict(eval_ins.config))
            results.append((slot, EvaluateRes(Status(Code.OK, ""), loss, n, metrics)))
        except Exception as exc:  # noqa: BLE001 - mirrors Flower: failure, not crash
            failures.append(exc)
    strategy.aggregate_evaluate(server_round, results, failures)


def run_inprocess(cfg: ExperimentConfig, out_dir: Path, *, resume: bool = False,
                  stop_after: int | None = None, client_factory=None,
                  overlap_evaluation: bool = False):
    """Run the experiment sequentially; returns the strategy. ``stop_after`` ends early
    (as if killed) after that many rounds of this call. ``overlap_evaluation`` evaluates
    each round in the background while the next trains, as the ServerApp does (see
    ``strategies/base.py``)."""
    strategy, rounds_left = build_server(cfg, Path(out_dir), resume=resume,
                                         overlap_evaluation=overlap_evaluation)
    manager = _Manager(cfg.federation.sampled_per_round())
    cls = client_class(cfg.client.method)
    state_dir = str(Path(out_dir) / "client_state")  # as the ClientApp: per-client state
    make = client_factory or (lambda: cls(cfg, state_dir=state_dir))
    for server_round in range(1, rounds_left + 1):
        ins = strategy.configure_fit(server_round, None, manager)
        results, failures = [], []
        for slot, fit_ins in ins:
            try:
                client = make()
                weights, n, metrics = client.fit(parameters_to_ndarrays(fit_ins.parameters),
                                                 dict(fit_ins.config))
                results.append((slot, FitRes(Status(Code.OK, ""),
                                             ndarrays_to_parameters(weights), n, metrics)))
            except Exception as exc:  # noqa: BLE001 - mirrors Flower: failure, not crash
                failures.append(exc)
        if ins:  # as Flower: no instructions (every client dropped out), no aggregate_fit
            strategy.aggregate_fit(server_round, results, failures)
        strategy.evaluate(server_round, None)
        evaluate_clients(strategy, server_round, manager, make)
        if stop_after is not None and server_round >= stop_after:
            break
    strategy.drain()
    return strategy
