"""A run's round and client-failure records on the server: which partitions were asked to
train and which failed with what first error (:class:`RoundLedger`, checkpointed with the
strategy), the round's client statistics (:func:`client_statistics`), and the one line
that says why a failed round's update did not reach the model (:func:`failure_reason`).

The rule for failed rounds is :mod:`strategies.base`'s (module doc): a round in which no
client's update reached the model is failed; a run in which no round trained, or
``federation.max_consecutive_failed_rounds`` rounds in a row in which every client failed,
ends with :class:`AllClientsFailed`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fedrcl_flwr.protocol import LOCAL_REPR_PREFIX, TERM_LOSS_PREFIX, FitReport, ProtocolError
from strategies.screening import ClientResult, no_reply_line

log = logging.getLogger("fedrcl_flwr")


class AllClientsFailed(RuntimeError):
    """The run trained nothing (no round's update reached the model), or too many rounds
    in a row in which every client failed."""


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


class RoundLedger:
    """What the server remembers of past rounds (checkpointed: ``strategies/state.py``):
    rounds in a row in which every client failed, rounds trained, the run's first client
    error, and per partition the rounds it was asked to train in and (one that failed at
    least once) the rounds it failed with its first error (:func:`failure_counts`)."""

    def __init__(self, max_consecutive_failed_rounds: int):
        self.max_failed = max_consecutive_failed_rounds
        self.consecutive_empty = 0
        self.rounds_trained = 0  # rounds in which at least one client result was kept
        self.first_client_error: str | None = None
        self.client_rounds: dict[int, int] = {}
        self.client_failures: dict[int, dict] = {}  # {"failed": n, "first_error": line}

    def note_error(self, line: str) -> str:
        """Keep the run's first client error (the message of an aborted run)."""
        if self.first_client_error is None:
            self.first_client_error = line
        return line

    def trained(self) -> None:
        """A round whose update reached the model."""
        self.consecutive_empty = 0
        self.rounds_trained += 1

    def empty_round(self, rnd: int) -> str | None:
        """A round in which every client failed: count it; the message to abort the run
        with after ``max_consecutive_failed_rounds`` such rounds, else ``None``."""
        self.consecutive_empty += 1
        log.warning(
            "round %d: every client failed; global model unchanged (%d consecutive empty rounds)",
            rnd,
            self.consecutive_empty,
        )
        if self.consecutive_empty < self.max_failed:
            return None
        return (
            f"aborting: {self.consecutive_empty} consecutive rounds in which every "
            f"client failed (federation.max_consecutive_failed_rounds="
            f"{self.max_failed}){self._first_error()}"
        )

    def _first_error(self) -> str:
        error = self.first_client_error
        return f"; first client error: {error}" if error else ""

    def never_trained(self, rnd: int, fit_info: dict) -> str:
        """The message of a run that trained in none of its rounds."""
        first = self._first_error()
        why = fit_info.get("failure_reason")
        last = f"; round {rnd}: {why}" if why and not first else ""
        return f"no client trained in any of the {rnd} rounds{first}{last}"

    def count_client_failures(
        self,
        sent: list[int],
        results: list,
        raised: list[tuple[int | None, str]],
        reasons: list[str],
        kept: list[ClientResult],
    ) -> None:
        """Count the round for every partition asked to train (``sent``:
        :attr:`client_rounds`) and a failure, with its first error, for each that did not
        reach the average (:attr:`client_failures`): a client that raised (its partition
        from the error, :func:`~strategies.screening.client_failure`; one that sent nothing
        back is the partition without a result), or whose result was unusable (its
        ``partition N: why`` reason). A result left out of a discarded SecAgg+ sum is not
        its client's failure."""
        sent = [int(p) for p in sent]
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


def failure_reason(
    *,
    sampled: int,
    sent: int,
    outcome: Any,
    errors: list[str],
    round_timeout_s: float | None,
    secagg_params: tuple[int, int] | None,
) -> str:
    """Why a round's update did not reach the model, in one line: every sampled client
    dropped out or was late (with counts; ``outcome`` the round's
    ``fedrcl_flwr.availability.RoundOutcome`` or ``None``), SecAgg+ below 2 clients or
    with an unreachable threshold (Flower's setup arithmetic,
    :func:`fedrcl_flwr.privacy.secagg_setup`; ``secagg_params`` set with SecAgg+), SecAgg+
    discarded or halted the round, every client failed (the round's first error,
    ``errors``), or too few client nodes. ``sampled`` / ``sent``: how many clients were
    sampled / sent the model."""
    if sent == 0 and outcome is not None:
        what = f"all {sampled} sampled clients dropped out ({len(outcome.dropped_out)})"
        return what + (f" or were late ({len(outcome.late)})" if outcome.late else "")
    if sent == 0:
        return "no client was sent the model (no client node available)"
    secagg = secagg_params is not None
    if secagg and errors and any("discarded SecAgg+ sum" in e for e in errors):
        bad = [e for e in errors if "discarded SecAgg+ sum" not in e]
        return (
            f"SecAgg+ discarded the round: {len(bad)} of {len(errors)} results unusable "
            f"and a result cannot be taken out of the masked sum ({bad[0] if bad else ''})"
        )
    if errors and round_timeout_s is not None:
        timed_out = f"client error: {no_reply_line(round_timeout_s)}"
        if all(e == timed_out for e in errors):
            return (
                f"every client timed out: no reply within {round_timeout_s:g} s "
                "(federation.round_timeout_s)"
            )
    if errors:
        return f"every client failed (first error: {errors[0].removeprefix('client error: ')})"
    if secagg_params is not None:
        from fedrcl_flwr.privacy import secagg_setup

        plan = secagg_setup(*secagg_params, sent)
        if plan["reason"] is not None:
            return plan["reason"]
        return (
            f"SecAgg+ halted the round with {sent} clients (a client failed or "
            "timed out during the protocol; see run.log)"
        )
    return f"no result came back from the {sent} clients sent the model"


def weight_store_note(reasons: list[str], transport: Any) -> dict:
    """``{"weight_store": line}`` when the weight store cost this round something:
    results refused because an entry did not hash to its name (a client refusing the
    model it was sent, or the server refusing an upload), and a slot found damaged
    when its model was sent again (the ``ServerTransport``'s notes, ``rewritten``, taken:
    sent in a new slot, the damage costs no more than the round it happened in); else
    nothing."""
    rewritten, transport.rewritten = transport.rewritten, []
    notes = []
    refused = sum(1 for r in reasons if "weight store entry" in r)
    if refused:
        notes.append(
            f"{refused} result(s) lost to a damaged weight store entry (did not hash to its name)"
        )
    notes += rewritten
    return {"weight_store": "; ".join(notes)} if notes else {}
