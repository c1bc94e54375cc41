"""A strategy's checkpointed state: the global model, the declared server-optimizer
buffers (:attr:`strategies.base.FederatedStrategy.buffers`: created here, one float64
array per trainable parameter, so a new optimizer cannot forget to checkpoint one), the
round ledger (:class:`strategies.round_records.RoundLedger`), the signal exchange's state
and the privacy accountant's.

Every array saved or restored is a copy: the next round may change the live arrays while
an overlapped round end still writes the checkpoint (``strategies/round_end.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def copy_arrays(arrays: list) -> list:
    """Independent copies of a list of arrays (``None`` entries kept)."""
    return [None if a is None else np.array(a, copy=True) for a in arrays]


def new_buffer(weights: list, kinds: list, fill: float) -> list:
    """A declared buffer: ``fill`` in float64 for each trainable parameter (``kinds``
    entry ``"param"``), ``None`` for BatchNorm buffers and counters."""
    return [
        np.full(np.shape(w), fill, np.float64) if k == "param" else None
        for w, k in zip(weights, kinds)
    ]


def strategy_state(strategy: Any) -> dict:
    """The state of ``strategy`` (a ``strategies.base.FederatedStrategy``, which imports
    this module) for a checkpoint (copies; partition ids as text, a checkpoint's dict
    keys)."""
    ledger = strategy.ledger
    state = {
        "weights": copy_arrays(strategy.weights),
        "consecutive_empty": ledger.consecutive_empty,
        "rounds_trained": ledger.rounds_trained,
        "first_client_error": ledger.first_client_error,
        "buffers": {b: copy_arrays(getattr(strategy, b)) for b in strategy.buffers},
        "client_rounds": {str(k): v for k, v in ledger.client_rounds.items()},
        "client_failures": {str(k): dict(v) for k, v in ledger.client_failures.items()},
    }
    if strategy.exchange is not None:
        state["exchange"] = strategy.exchange.state_dict()
    if strategy.dp is not None:
        state["privacy_accountant"] = strategy.dp.accountant.state_dict()
    return state


def load_strategy_state(strategy: Any, state: dict) -> None:
    """Restore :func:`strategy_state`'s ``state`` into ``strategy``. Checkpoints written
    before a key existed: trained (``rounds_trained`` 1), per-client counts from the
    resumed round on. A run with ``privacy.dp`` refuses a checkpoint without the
    privacy accountant (``ValueError``)."""
    strategy.weights = copy_arrays(state["weights"])
    ledger = strategy.ledger
    ledger.consecutive_empty = int(state.get("consecutive_empty", 0))
    for b in strategy.buffers:
        setattr(strategy, b, copy_arrays(state["buffers"][b]))
    ledger.rounds_trained = int(state.get("rounds_trained", 1))  # old checkpoints: trained
    ledger.first_client_error = state.get("first_client_error")
    ledger.client_rounds = {int(k): int(v) for k, v in state.get("client_rounds", {}).items()}
    ledger.client_failures = {int(k): dict(v) for k, v in state.get("client_failures", {}).items()}
    if strategy.exchange is not None and "exchange" in state:
        strategy.exchange.load_state_dict(state["exchange"])
    if strategy.dp is not None:
        if "privacy_accountant" not in state:
            raise ValueError(
                "privacy.dp is set but the checkpoint has no privacy "
                "accountant (the run started without privacy.dp)"
            )
        strategy.dp.accountant.load_state_dict(state["privacy_accountant"])
