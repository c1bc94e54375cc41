"""A round's client results and their screening: what a kept result is
(:class:`ClientResult`), why a failed client failed in one line (:func:`client_failure`:
Flower's error text unwrapped), and which results are unusable — exceptions, malformed
reports, undecodable parameters, wrong shapes, NaN/Inf, an upload that does not hash to
its name, an unclipped update under client-side DP (:func:`screen`, :func:`verify`).

Used by :class:`strategies.base.FederatedStrategy` in ``aggregate_fit``; the checks of one
upload are :func:`fedrcl_flwr.server.aggregation.check_shapes` / ``check_update``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from flwr.common import FitRes

from fedrcl_flwr.app.wire.transport import arrays_of, open_upload
from fedrcl_flwr.protocol import FitReport, ProtocolError, untag_partition
from fedrcl_flwr.server.aggregation import check_shapes, check_update
from fedrcl_flwr.weights.entries import StoreError
from strategies.averaging import Averaging, checked_average

log = logging.getLogger("fedrcl_flwr")

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


@dataclass(frozen=True)
class ClientResult:
    """One kept client result of a round, what :meth:`FederatedStrategy.server_update`
    receives (sorted by partition id)."""

    partition_id: int
    # the client's model, NumPy arrays in the model's state order; for an upload in the
    # weight store whose hash_check is set, views of the store for the shapes only (its
    # values are read through hash_check, or as a checked copy: verify)
    weights: list
    report: FitReport  # what it reported (fedrcl_flwr/protocol.py)
    fit_res: FitRes  # Flower's result (Flower's DP wrapper reads it)
    hash_check: Any = None  # the upload's store hash check (screening only)

    @property
    def num_examples(self) -> int:
        """The weight it gave its upload (``fedrcl_flwr.protocol.upload_weight``)."""
        return int(self.fit_res.num_examples)


def screen(results: list, weights: list, reasons: list[str]) -> list[ClientResult]:
    """The results whose report, parameters and shapes (against the global model
    ``weights``) are usable, as :class:`ClientResult`; why each other one is unusable goes
    to ``reasons``: a malformed report, undecodable parameters, wrong shapes or a
    non-finite training loss. What needs the values (hash, NaN/Inf, clipping) is
    :func:`verify`'s."""
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
        why = check_shapes(arrays, weights)
        loss = report.train_loss if report.train_loss is not None else 0.0
        if why is None and not np.isfinite(loss):
            why = "non-finite training loss"
        if why is not None:
            reasons.append(f"partition {pid}: {why}")
            continue
        kept.append(ClientResult(pid, arrays, report, res, hash_check))
    return kept


def verify(
    kept: list[ClientResult], reasons: list[str], weights: list, how: Averaging
) -> tuple[list[ClientResult], list | None]:
    """The screened results whose values are usable: an upload by reference hashes
        to its name (:class:`~fedrcl_flwr.weights.reading.HashCheck`), holds no NaN/Inf and
        (client-side DP, ``how.dp``) is clipped; why each other
        one is not goes to ``reasons``. Every value used is a value checked: with the plain
        average (no DP, no SecAgg+) the uploads are read once
    (:func:`~strategies.averaging.checked_average`), and
        that average is returned when every upload passed (else ``None``). Otherwise (DP,
        SecAgg+, a dropped upload) each upload in the store is read again as a checked copy
        of its own (:func:`arrays_of`), which the checks, the DP wrapper and the strategy's
        average then read."""
    if not kept:
        return kept, None
    dp, secagg = how.dp, how.secagg
    average, finite = None, False
    if dp is None and not secagg:
        average, finite = checked_average(kept, how)
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
    values_checked = average is not None and finite
    return _recheck(hashed, reasons, weights, values_checked, dp, secagg), None


def _recheck(
    hashed: list[ClientResult],
    reasons: list[str],
    weights: list,
    values_checked: bool,
    dp: Any,
    secagg: bool,
) -> list[ClientResult]:
    """:func:`verify`'s second reading: each upload in the store as a checked copy of its
    own, its NaN/Inf screen (unless the first reading already screened every value) and
    client-side DP's clipping check."""
    good = []
    for r in hashed:
        why = None
        if r.hash_check is not None:  # read again: a checked copy of its own
            try:
                r = replace(r, weights=arrays_of(r.fit_res.parameters), hash_check=None)
            except StoreError as exc:
                why = f"undecodable parameters ({exc})"
        if why is None and not values_checked:
            why = check_update(r.weights, weights)
        if why is None and dp is not None and not secagg:
            why = dp.unclipped(r.weights)
        if why is not None:
            reasons.append(f"partition {r.partition_id}: {why}")
            continue
        good.append(r)
    return good


def usable_results(
    rnd: int,
    results: list,
    reasons: list[str],
    weights: list,
    how: Averaging,
    release: Callable[[list], None],
) -> tuple[list[ClientResult], list | None]:
    """``(kept, average or None)`` of a round's ``results``, in order: :func:`screen`,
    sort by partition id (order-independent arithmetic), :func:`verify`, ``release`` the
    uploads' store entries (what :func:`screen` mapped stays readable), and with SecAgg+
    :func:`discard_secagg_sum`; why each dropped result was unusable goes to ``reasons``
    and to the log."""
    kept = screen(results, weights, reasons)
    kept.sort(key=lambda r: r.partition_id)  # order-independent arithmetic
    kept, average = verify(kept, reasons, weights, how)
    release(results)
    if how.secagg and len(kept) < len(results):
        kept = discard_secagg_sum(rnd, kept, len(results), reasons)
    for r in reasons:
        log.warning("round %d: dropped a client result (%s)", rnd, r)
    return kept, average


def discard_secagg_sum(
    rnd: int, kept: list[ClientResult], received: int, reasons: list[str]
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
