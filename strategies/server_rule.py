"""What a server rule declares and overrides, without Flower: its name, its parameters
(``server.params``: ``defaults`` with their allowed values in ``rules``,
:mod:`fedrcl_flwr.components`, checked before the run), its server-optimizer state
(``buffers``: created, checkpointed and restored by the strategy, ``strategies/state.py``)
and the hooks :class:`strategies.base.FederatedStrategy` calls in each round:
:meth:`ServerRule.weights_to_send`, :meth:`ServerRule.client_params`,
:meth:`ServerRule.client_loss_terms` (runs on the client) and
:meth:`ServerRule.server_update`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedrcl_flwr.components import resolve_params
from fedrcl_flwr.protocol import FitInstructions, StrategyParams

if TYPE_CHECKING:  # the client-side hook's types (torch)
    from fedrcl_flwr.training import LossTerm
    from strategies.screening import ClientResult


class StrategyClient(Protocol):
    """What a strategy's client-side hook (:meth:`FedRCLStrategy.client_loss_terms`) may
    use of the client: ``clients/base.py``'s ``FederatedClient`` provides it. Named here so
    that the strategies, a layer below the clients, never import them."""

    def received_trainable(self) -> list[Any]: ...

    def distance_to_received_term(self, name: str, weight: float) -> LossTerm: ...


class ServerRule:
    """The declarations and hooks of a server rule (module doc); the defaults are
    FedAvg's."""

    name: str  # server.strategy (set on each strategy class)
    defaults: dict = {}
    rules: dict = {}  # parameter name -> fedrcl_flwr.components.Rule (allowed values)
    buffers: tuple = ()  # names of the declared server-optimizer state (module doc)
    p: dict  # the resolved server.params
    weights: list  # the global model (NumPy arrays in the model's state order)
    kinds: list  # each entry's kind: fedrcl_flwr.server.aggregation.entry_kinds

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
