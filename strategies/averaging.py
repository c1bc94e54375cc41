"""The average of a round's kept client results: the plain uniform / sample-weighted
average (``server.weighting``, :func:`fedrcl_flwr.server.aggregation.weighted_average`),
read in one pass with the uploads' NaN/Inf screen and hash checks
(:func:`checked_average`), Flower's fixed-clipping DP wrapper (``strategies/privacy.py``)
or SecAgg+'s unmasked average (:func:`average_kept`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedrcl_flwr.server.aggregation import (
    average_and_screen,
    client_coefficients,
    weighted_average,
)


@dataclass(frozen=True)
class Averaging:
    """How the round's average is taken: the entries' kinds
    (:func:`~fedrcl_flwr.server.aggregation.entry_kinds`), ``server.weighting``,
    ``server.average_dtype``, the threads for uploads inside the messages, and the
    privacy settings that replace the plain average."""

    kinds: list
    weighting: str
    dtype: str
    workers: int
    dp: Any = None  # privacy.dp: strategies.privacy.CentralDP (Flower's wrapper averages)
    secagg: bool = False  # privacy.secagg: every result holds SecAgg+'s unmasked average


def checked_average(kept: list, how: Averaging) -> tuple[list, bool]:
    """``(average, finite)`` of the screened results (``kept``: ``ClientResult`` s,
    ``strategies/screening.py``, which imports this module), each upload read once for
    the hash, the NaN/Inf screen and the average (:func:`average_and_screen`): uploads in
    the weight store on one thread, each piece copied out of the store and hashed by its
    upload's check as it is averaged; uploads inside the messages (the process's own
    bytes) by ``how.workers`` threads."""
    coefs = client_coefficients([r.num_examples for r in kept], how.weighting)
    weights = [r.weights for r in kept]
    checks = [r.hash_check for r in kept]
    if any(c is not None for c in checks):

        def take(i: int, j: int, start: int, stop: int) -> np.ndarray:
            check = checks[i]
            if check is None:  # bytes of the message
                return weights[i][j].reshape(-1)[start:stop]
            return check.take(j, start, stop)

        return average_and_screen(weights, coefs, how.kinds, take, dtype=how.dtype)
    return average_and_screen(weights, coefs, how.kinds, workers=how.workers, dtype=how.dtype)


def average_kept(
    server_round: int,
    kept: list,
    weights: list,
    how: Averaging,
    info: dict,
    sent: list[int],
) -> list:
    """The clients' average: through Flower's DP wrapper (``how.dp``: clip, average,
    noise; the release of the data of the clients ``sent`` the model is accounted in
    ``info``), SecAgg+'s unmasked average (every result holds it; cast to the global
    model's dtypes), or the uniform / sample-weighted average."""
    dp, secagg = how.dp, how.secagg
    if dp is not None:  # Flower's wrapper: clip (server mode), average, noise
        average = dp.aggregate(server_round, kept, secagg_active=len(kept) if secagg else 0)
        dp.accountant.record_release(sent)
        info.update(dp.accountant.record())
        return average
    if secagg:  # every result holds the same unmasked SecAgg+ average
        return [np.asarray(a).astype(np.asarray(w).dtype) for a, w in zip(kept[0].weights, weights)]
    coefs = client_coefficients([r.num_examples for r in kept], how.weighting)
    return weighted_average([r.weights for r in kept], coefs, how.kinds, how.dtype)
