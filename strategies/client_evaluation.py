"""Per-client evaluation on the server side (``per_client``, :mod:`fedrcl_flwr.client_eval`):
which partitions evaluate the round's global model on their local test data, the
``EvaluateIns`` that ask them (spread over the client nodes), and the round's
``client_acc_*`` statistics from their replies.

:class:`strategies.base.FederatedStrategy` calls these from ``configure_evaluate`` and
``aggregate_evaluate`` in a round where the evaluation is due; the round's record waits
for the replies.
"""

from __future__ import annotations

import logging

from flwr.common import EvaluateIns, Parameters

from fedrcl_flwr.client_eval import assign, due, summarize, unsampled_partitions
from fedrcl_flwr.protocol import EvaluateInstructions, EvaluateReport
from fedrcl_flwr.run.runtime import sample_partitions
from strategies.screening import client_error_line

log = logging.getLogger("fedrcl_flwr")


def evaluation_partitions(
    which: str, seed: int, rnd: int, num_clients: int, clients_per_round: int, sampled: list
) -> list[int]:
    """The partitions that evaluate in round ``rnd``: ``"all"``, ``"unsampled"`` (as many
    as the round sampled, among those it did not learn from) or the round's ``sampled``."""
    if which == "all":
        return list(range(num_clients))
    if which == "unsampled":  # the clients this round did not learn from
        return unsampled_partitions(
            seed, rnd, num_clients, sample_partitions(seed, rnd, num_clients, clients_per_round)
        )
    return list(sampled)


def evaluate_instructions(slots: list, pids: list[int], send: Parameters, rnd: int) -> list:
    """``(slot, EvaluateIns)`` for each client node: the global model ``send`` and the
    partitions it evaluates (:func:`fedrcl_flwr.client_eval.assign`)."""
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


def read_evaluations(rnd: int, results: list, failures: list) -> tuple[dict, float | None]:
    """``(statistics, loss)`` of the round's per-client evaluation replies: the
    ``client_acc_*`` statistics (:func:`fedrcl_flwr.client_eval.summarize`; a failed
    evaluation, or a reply without results from a node that had examples, counts as
    bad) and the mean test loss over every evaluated example (``None``: none)."""
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
            rnd,
            len(failures),
            client_error_line(failures[0]),
        )
    stats = summarize(per, bad)
    n = sum(c[1] for c in per.values())
    loss = sum(c[2] for c in per.values()) / n if n else None
    return stats, loss


def evaluation_due(
    per_client: tuple[int, str] | None, centralised: bool, rnd: int, rounds: int
) -> bool:
    """Is the per-client evaluation due in round ``rnd`` (``per_client``: ``(every,
    which)`` or ``None``; only in a run with a centralised evaluation, ``centralised``)?"""
    return per_client is not None and centralised and due(per_client[0], rnd, rounds)
