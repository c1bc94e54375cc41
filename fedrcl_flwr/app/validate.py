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

from clients import client_class
from fedrcl_flwr.components import check_model_rules
from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.errors import ConfigError
from strategies import strategy_class


def validate_components(cfg: ExperimentConfig, source: str | None = None) -> None:
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
    from fedrcl_flwr.run.runtime import probe_model

    def get_model():  # built only when a value needs it
        return probe_model(cfg)

    check_model_rules("client.params", f"method '{cls.method}'", cls.rules, p, get_model)
    check_model_rules("server.params", f"strategy '{scls.name}'", scls.rules, sp, get_model)
    if cls.strategies is not None and cfg.server.strategy not in cls.strategies:
        raise ConfigError(
            f"'server.strategy' must be {' or '.join(cls.strategies)} for "
            f"client.method '{cls.method}', got {cfg.server.strategy!r}"
        )
    settings = cls.exchange_settings(p)
    if settings is not None:
        from fedrcl_flwr.server.signal_exchange import SignalExchange

        SignalExchange({**settings, **cfg.server.signals})
    elif cfg.server.signals:
        raise ConfigError(
            f"server.signals is set but method '{cfg.client.method}' exchanges no signals"
        )
    cls.check_config(cfg, p)
    from fedrcl_flwr.privacy import check_privacy

    check_privacy(cfg, cls, settings, get_model)
    if cfg.privacy.secagg:
        secagg_workflow(cfg)  # Flower's own checks of the SecAgg+ parameters


def secagg_max_weight(cfg: ExperimentConfig) -> float:
    """The largest weight a client gives its upload under SecAgg+
    (:func:`fedrcl_flwr.protocol.upload_weight`): 1 under uniform weighting (every client
    reports one example), else ``privacy.secagg_max_weight`` or the largest partition of
    the configured split."""
    from fedrcl_flwr.protocol import upload_weight

    if cfg.privacy.secagg_max_weight is not None:
        return float(cfg.privacy.secagg_max_weight)
    if cfg.server.weighting == "uniform":
        return float(upload_weight(1, secagg=True, weighting="uniform"))
    from fedrcl_flwr.run.runtime import client_partitions

    return float(
        max(
            upload_weight(len(p), secagg=True, weighting=cfg.server.weighting)
            for p in client_partitions(cfg)
        )
    )


def secagg_workflow(cfg: ExperimentConfig, *, max_weight: float = 1.0):
    """Flower's ``SecAggPlusWorkflow`` for the ``privacy.secagg_*`` parameters (a
    ``ConfigError`` for values Flower refuses, and for shares or a threshold its setup
    stage would halt every round on: ``fedrcl_flwr.privacy.check_secagg_plan``); the stage time-out is
    ``federation.round_timeout_s``."""
    from flwr.server.workflow import SecAggPlusWorkflow

    pr = cfg.privacy
    n = cfg.federation.sampled_per_round()
    if pr.secagg_quantization_range * n >= 1 << 32:
        raise ConfigError(
            f"'privacy.secagg_quantization_range' ({pr.secagg_quantization_range})"
            f" x clients per round ({n}) must stay below 2**32, SecAgg+'s "
            "modulus, or the masked sum overflows"
        )
    try:
        workflow = SecAggPlusWorkflow(
            pr.secagg_num_shares,
            pr.secagg_threshold,
            max_weight=max_weight,
            clipping_range=pr.secagg_clipping_range,
            quantization_range=pr.secagg_quantization_range,
            timeout=cfg.federation.round_timeout_s,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"privacy.secagg_*: Flower's SecAgg+ refuses the parameters ({exc})"
        ) from None
    from fedrcl_flwr.privacy import check_secagg_plan

    check_secagg_plan(cfg)  # what Flower's setup stage would halt on, every round
    return workflow
