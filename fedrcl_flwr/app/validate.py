"""Check the names and parameters that select code (method, strategy) before a run."""

from __future__ import annotations

from clients import client_class
from clients.base import resolve_params
from fedrcl_flwr.config import ExperimentConfig
from strategies import strategy_class
from strategies.base import resolve_server_params


def validate_components(cfg: ExperimentConfig) -> None:
    """Raise ConfigError if client.method/params or server.strategy/params are invalid."""
    cls = client_class(cfg.client.method)
    resolve_params(cls.method, cls.defaults, cfg.client.params)
    scls = strategy_class(cfg.server.strategy)
    resolve_server_params(scls.name, scls.defaults, cfg.server.params)
    needs = getattr(cls, "exchange_settings", None)
    if needs is not None:
        from strategies.signal_exchange import SignalExchange

        SignalExchange({**needs(cfg), **cfg.server.signals})
    elif cfg.server.signals:
        from fedrcl_flwr.config import ConfigError

        raise ConfigError(f"server.signals is set but method '{cfg.client.method}' "
                          "exchanges no signals")
    check = getattr(cls, "check_config", None)
    if check is not None:
        check(cfg)
