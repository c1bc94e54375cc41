"""Who trains in a round: the sampled partitions (:func:`fedrcl_flwr.run.runtime.sample_partitions`:
seed and round only, the same for every method and strategy), those of them that report
(``availability``, :mod:`fedrcl_flwr.availability`: the others drop out or would be late
and are sent nothing), and the client nodes they run on (Flower node ids are random and
are used only as execution slots, in a fixed order).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flwr.common import FitIns, Parameters
from flwr.server import ClientManager

from fedrcl_flwr.app.wire.flower_private import ClientProxy
from fedrcl_flwr.run.runtime import sample_partitions

log = logging.getLogger("fedrcl_flwr")


@dataclass(frozen=True)
class RoundDraw:
    """A round's sampling: every sampled partition, those that report (to be sent the
    model), and with ``availability`` its outcome and record entries (else ``None``)."""

    sampled: list[int]
    reporting: list[int]
    outcome: Any = None  # fedrcl_flwr.availability.RoundOutcome
    record: dict | None = None


def draw_round(
    seed: int, rnd: int, num_clients: int, clients_per_round: int, availability: Any
) -> RoundDraw:
    """Sample round ``rnd``'s partitions and, with ``availability``, who of them drops out
    or would be late (sent nothing)."""
    pids = sample_partitions(seed, rnd, num_clients, clients_per_round)
    if availability is None:
        return RoundDraw(pids, pids)
    outcome = availability.round(rnd, pids)
    record = availability.record(rnd, outcome)
    if not outcome.reporting:
        log.warning(
            "round %d: every sampled client dropped out or was late; global model unchanged",
            rnd,
        )
    return RoundDraw(pids, outcome.reporting, outcome, record)


def client_slots(
    client_manager: ClientManager, k: int, expected_nodes: int | None, node_wait_s: float
) -> list[ClientProxy]:
    """The connected client nodes in a fixed order (by node id as text), after waiting
    up to ``node_wait_s`` for ``k`` of them (at most ``expected_nodes``)."""
    want = min(k, expected_nodes) if expected_nodes else k
    client_manager.wait_for(want, timeout=int(node_wait_s))
    nodes = sorted(client_manager.all().items(), key=lambda kv: str(kv[0]))
    if not nodes:
        raise RuntimeError("no client nodes connected")
    return [proxy for _, proxy in nodes]


def fit_on_slots(rnd: int, pids: list[int], slots: list) -> list[int]:
    """The partitions that train: the first ``len(slots)`` when there are fewer client
    nodes than partitions (one partition per node and round), with a warning."""
    if len(slots) >= len(pids):
        return pids
    log.warning(
        "round %d: only %d client nodes for %d sampled partitions; training the first %d",
        rnd,
        len(slots),
        len(pids),
        len(slots),
    )
    return pids[: len(slots)]


def fit_messages(
    slots: list,
    pids: list[int],
    send: Parameters,
    rnd: int,
    transport: Any,
    instructions: Callable[[int, int], Any],
) -> list[tuple[ClientProxy, FitIns]]:
    """``(node, FitIns)`` for the ``i``-th partition on the ``i``-th node: the weights
    ``send`` as that client receives them (the ``ServerTransport``'s ``for_client``) and
    its fit instructions (``instructions(rnd, pid)``, a
    :class:`~fedrcl_flwr.protocol.FitInstructions`)."""
    return [
        (
            node,
            FitIns(transport.for_client(send, rnd, i), instructions(rnd, pid).to_config()),
        )
        for i, (node, pid) in enumerate(zip(slots, pids))
    ]
