"""The method contract, checked when the config is loaded (before any Flower process).

For the configured client method and server strategy: the names (registries), every
``client.params`` / ``server.params`` value (types, finiteness and the declared ``rules``,
:mod:`fedrcl_flwr.components`; rules that depend on the model are run on the configured
model built at nominal input shapes), the strategies the method works with
(``FederatedClient.strategies``), the signal exchange it needs
(``FederatedClient.exchange_settings`` with ``server.signals``) and its cross-section
checks (``FederatedClient.check_config``). Any violation is one ``ConfigError`` naming the
key (and the file, when ``source`` is given).
"""

from __future__ import annotations

from typing import Optional

from clients import client_class
from fedrcl_flwr.components import check_model_rules
from fedrcl_flwr.config import ConfigError, ExperimentConfig
from strategies import strategy_class


def validate_components(cfg: ExperimentConfig, source: Optional[str] = None) -> None:
    """Raise ConfigError if client.method/params or server.strategy/params are invalid."""
    try:
        _validate(cfg)
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError(f"{source}: {exc}") from None


def _validate(cfg: ExperimentConfig) -> None:
    cls = client_class(cfg.client.method)
    p = cls.resolve(cfg)
    scls = strategy_class(cfg.server.strategy)
    sp = scls.resolve(cfg.server.params)
    from fedrcl_flwr.runtime import probe_model

    def get_model():  # built only when a value needs it
        return probe_model(cfg)

    check_model_rules("client.params", f"method '{cls.method}'", cls.rules, p, get_model)
    check_model_rules("server.params", f"strategy '{scls.name}'", scls.rules, sp, get_model)
    if cls.strategies is not None and cfg.server.strategy not in cls.strategies:
        raise ConfigError(f"'server.strategy' must be {' or '.join(cls.strategies)} for "
                          f"client.method '{cls.method}', got {cfg.server.strategy!r}")
    settings = cls.exchange_settings(p)
    if settings is not None:
        from strategies.signal_exchange import SignalExchange

        SignalExchange({**settings, **cfg.server.signals})
    elif cfg.server.signals:
        raise ConfigError(f"server.signals is set but method '{cfg.client.method}' "
                          "exchanges no signals")
    cls.check_config(cfg, p)
