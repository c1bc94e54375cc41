"""The checks of the optional feature sections and of the split's generator, each the one
home of its rule: per-client evaluation (``evaluation.per_client``, used by
:mod:`fedrcl_flwr.client_eval`), unreliable clients (``federation.availability``, by
:mod:`fedrcl_flwr.availability`), privacy (``privacy``, by :mod:`fedrcl_flwr.privacy`),
trackers (``output.tracker``, by :mod:`fedrcl_flwr.tracking`) and the partition generator
(``partition.generator``, by :mod:`fedrcl_flwr.data.partition`). They live in the config
layer so that the config checks import nothing above it (README, "Architecture"); the
modules that implement the features import them from here. A problem is one
:class:`~fedrcl_flwr.errors.ConfigError` naming the key and the file."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fedrcl_flwr.config.catalog import GENERATORS, RETHINKFL_GENERATORS
from fedrcl_flwr.config.extras import installed, pip_install
from fedrcl_flwr.config.schema import ExperimentConfig
from fedrcl_flwr.errors import ConfigError, PartitionError, shown

# ----------------------------------------------------------------- unreliable clients

DROPOUT_DISTS = {"uniform": ("low", "high"), "beta": ("a", "b")}
SPEED_DISTS = {"lognormal": ("sigma",), "uniform": ("low", "high")}


def _cfg_error(source: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: {msg}")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_spec(
    spec: Any,
    key: str,
    source: str,
    num_clients: int,
    dists: dict,
    ok: Callable[[float], bool],
    what: str,
) -> None:
    """A number, a list of ``num_clients`` numbers or ``{distribution: ..., params}``;
    ``ok(value)`` checks each number (``what`` says the rule)."""
    if isinstance(spec, bool):
        raise _cfg_error(
            source, f"'{key}' must be a number, a list or a mapping, got {shown(spec)}"
        )
    if _num(spec):
        if not ok(spec):
            raise _cfg_error(source, f"'{key}' must be {what}, got {shown(spec)}")
        return
    if isinstance(spec, list):
        if len(spec) != num_clients:
            raise _cfg_error(
                source,
                f"'{key}' lists {len(spec)} values but "
                f"'federation.num_clients' is {num_clients} (one per "
                "client)",
            )
        for i, v in enumerate(spec):
            if not _num(v) or not ok(v):
                raise _cfg_error(source, f"'{key}[{i}]' must be {what}, got {shown(v)}")
        return
    if not isinstance(spec, dict):
        raise _cfg_error(
            source,
            f"'{key}' must be a number, a list or a mapping, got {type(spec).__name__} ({shown(spec)})",
        )
    dist = spec.get("distribution")
    if dist not in dists:
        raise _cfg_error(
            source, f"'{key}.distribution' must be one of {', '.join(dists)}, got {shown(dist)}"
        )
    allowed = ("distribution",) + dists[dist]
    for k in spec:
        if k not in allowed:
            raise _cfg_error(
                source, f"unknown key '{key}.{k}' (allowed for {dist}: {', '.join(allowed)})"
            )
    for k in dists[dist]:
        if k not in spec:
            raise _cfg_error(source, f"'{key}.{k}' is required for distribution {dist}")
        if not _num(spec[k]):
            raise _cfg_error(source, f"'{key}.{k}' must be a finite number, got {shown(spec[k])}")


def check_availability(cfg: ExperimentConfig, source: str) -> None:
    """``federation.availability``: every value in range, before the run (one
    ``ConfigError`` naming the key and ``source``; the plain numbers ``stragglers.deadline``
    and ``stragglers.jitter`` are rules in ``fedrcl_flwr.config.CONFIG_RULES``)."""
    av = cfg.federation.availability
    n = cfg.federation.num_clients
    key = "federation.availability.dropout"
    _check_spec(
        av.dropout, key, source, n, DROPOUT_DISTS, lambda v: 0 <= v < 1, "a probability in [0, 1)"
    )
    if isinstance(av.dropout, dict):
        d = av.dropout
        if d["distribution"] == "uniform" and not 0 <= d["low"] <= d["high"] < 1:
            raise _cfg_error(
                source,
                f"'{key}' uniform needs 0 <= low <= high < 1, got low={d['low']}, high={d['high']}",
            )
        if d["distribution"] == "beta" and not (d["a"] > 0 and d["b"] > 0):
            raise _cfg_error(
                source, f"'{key}' beta needs a > 0 and b > 0, got a={d['a']}, b={d['b']}"
            )
    st = av.stragglers
    key = "federation.availability.stragglers"
    if st.speed is not None:
        _check_spec(
            st.speed, f"{key}.speed", source, n, SPEED_DISTS, lambda v: v > 0, "a speed factor > 0"
        )
        if isinstance(st.speed, dict):
            d = st.speed
            if d["distribution"] == "uniform" and not 0 < d["low"] <= d["high"]:
                raise _cfg_error(
                    source,
                    f"'{key}.speed' uniform needs 0 < low <= high, "
                    f"got low={d['low']}, high={d['high']}",
                )
            if d["distribution"] == "lognormal" and d["sigma"] < 0:
                raise _cfg_error(source, f"'{key}.speed.sigma' must be >= 0, got {d['sigma']}")
    if st.speed is None and (st.deadline is not None or st.jitter):
        raise _cfg_error(
            source,
            f"'{key}.deadline' / '{key}.jitter' need '{key}.speed' (the clients' speed factors)",
        )


# ------------------------------------------------------------ per-client evaluation


def check_client_eval(cfg: ExperimentConfig, source: str) -> None:
    """``evaluation.per_client`` consistent with the rest of the experiment (one
    ``ConfigError`` naming the key and ``source``; each key's own range is a rule in
    ``fedrcl_flwr.config.CONFIG_RULES``)."""
    pc = cfg.evaluation.per_client
    key = "evaluation.per_client"
    if not pc.every:
        return
    every = cfg.federation.eval_every
    if pc.every % every:
        raise _cfg_error(
            source,
            f"'{key}.every' ({pc.every}) must be a multiple of "
            f"'federation.eval_every' ({every}): client metrics go "
            "into the evaluated rounds' records",
        )
    if pc.clients == "unsampled" and cfg.federation.sampled_per_round() >= (
        cfg.federation.num_clients
    ):
        raise _cfg_error(
            source,
            f"'{key}.clients' unsampled needs clients that a round does not sample, but "
            f"every round samples all {cfg.federation.num_clients}; use sampled or all",
        )
    if pc.local_test == "domain" and cfg.partition.scheme != "domain":
        raise _cfg_error(
            source,
            f"'{key}.local_test' domain needs partition.scheme domain "
            f"(got {cfg.partition.scheme}); use holdout",
        )
    if test_source(cfg) == "holdout" and pc.local_test_fraction <= 0:
        raise _cfg_error(
            source,
            f"'{key}.local_test_fraction' must be > 0 for a held-out "
            "local test share (local_test holdout)",
        )


def test_source(cfg: ExperimentConfig) -> str:
    """``holdout`` or ``domain`` (``auto`` resolved)."""
    lt = cfg.evaluation.per_client.local_test
    if lt == "auto":
        return "domain" if cfg.partition.scheme == "domain" else "holdout"
    return lt


# ----------------------------------------------------------------------------- privacy


MAX_DP_NOISE = 1e30  # σ·C: a larger noise std overflows float32 models (max ~3.4e38)


def check_privacy_section(cfg: ExperimentConfig, source: str) -> None:
    """The ``privacy`` section on its own beyond each key's rule (types by the schema,
    ranges by ``fedrcl_flwr.config.CONFIG_RULES``): the required keys of ``privacy.dp``,
    the accountant installed, a threshold given as a proportion at most 1."""
    dp = cfg.privacy.dp
    if dp is not None:
        if dp.noise_multiplier is None or dp.clipping_norm is None:
            missing = "noise_multiplier" if dp.noise_multiplier is None else "clipping_norm"
            raise ConfigError(
                f"{source}: 'privacy.dp.{missing}' is required when privacy.dp is set"
            )
        product = dp.noise_multiplier * dp.clipping_norm
        if not product <= MAX_DP_NOISE:  # also inf (overflow) and nan
            raise ConfigError(
                f"{source}: 'privacy.dp.noise_multiplier' x 'privacy.dp.clipping_norm' "
                f"({shown(dp.noise_multiplier)} x {shown(dp.clipping_norm)} = {product:g}) must be a "
                f"finite number <= {MAX_DP_NOISE:g}: the noise std would overflow the model"
            )
        if not installed("privacy"):
            raise ConfigError(
                f"{source}: 'privacy.dp' needs the dp-accounting package for "
                f"its privacy accountant ({pip_install('privacy')})"
            )
    p = cfg.privacy
    if cfg.server.average_dtype != "float64" and (dp is not None or p.secagg):
        raise ConfigError(
            f"{source}: 'server.average_dtype: {cfg.server.average_dtype}' (the authors' "
            "plain average) cannot be combined with "
            + ("privacy.dp" if dp is not None else "privacy.secagg")
            + ", which average the updates themselves; set it to float64"
        )
    if isinstance(p.secagg_threshold, float) and p.secagg_threshold > 1:
        raise ConfigError(
            f"{source}: 'privacy.secagg_threshold' as a proportion must be "
            f"<= 1, got {shown(p.secagg_threshold)}"
        )


# ---------------------------------------------------------------------------- trackers

# each tracker is installed by the extra of its name (fedrcl_flwr/config/extras.py)
TRACKERS = ("tensorboard", "wandb", "mlflow")


def enabled_trackers(cfg: ExperimentConfig) -> list[str]:
    """``output.tracker`` with the ``output.tensorboard: true`` alias, in order, once each."""
    names = [str(t) for t in cfg.output.tracker]
    if cfg.output.tensorboard:
        names.append("tensorboard")
    return list(dict.fromkeys(names))


def check_trackers(cfg: ExperimentConfig, source: str) -> None:
    """``output.tracker`` names known trackers, each once, whose package is installed
    (a :class:`~fedrcl_flwr.errors.ConfigError` naming the key and ``source``)."""
    raw = cfg.output.tracker
    for t in raw:
        if t not in TRACKERS:
            raise ConfigError(
                f"{source}: 'output.tracker' must list trackers among "
                f"{', '.join(TRACKERS)}, got {shown(t)}"
            )
    if len(set(raw)) != len(raw):
        raise ConfigError(f"{source}: 'output.tracker' lists a tracker twice: {raw}")
    for t in enabled_trackers(cfg):
        if not installed(t):
            raise ConfigError(
                f"{source}: 'output.tracker' includes {t} but the {t} package "
                f"is not installed ({pip_install(t)}, or remove it)"
            )


# ---------------------------------------------------------------- partition generator


def resolve_generator(scheme: str, balanced: bool, generator: str | None) -> str:
    """The generator a split uses (``partition.generator``, see the module docstring):
    ``None`` is ``fedrcl`` for the balanced Dirichlet split and ``project`` otherwise. The
    balanced Dirichlet split exists only as the authors' algorithm (``fedrcl`` /
    ``fedrcl_labels``); ``domain`` only as the project's; ``file`` draws nothing and
    ignores it. Anything else is a :class:`PartitionError` (also raised by the config
    check, before a run)."""
    if generator is not None and generator not in GENERATORS:
        raise PartitionError(
            f"partition.generator must be one of {', '.join(GENERATORS)} "
            f"(or null), got {shown(generator)}"
        )
    if (
        generator == "feduv"
        and scheme not in ("iid", "file")
        and not (scheme == "dirichlet" and not balanced)
    ):
        raise PartitionError(
            "partition.generator feduv has FedUV's two splits only: scheme iid, or "
            "dirichlet with balanced: false"
        )
    if scheme == "dirichlet" and balanced:
        if generator == "project":
            raise PartitionError(
                "partition.generator project has no balanced Dirichlet "
                "split (it is the FedRCL authors' algorithm): use fedrcl "
                "(their trainer's draws, the default) or fedrcl_labels"
            )
        return generator or "fedrcl"
    if scheme == "file":
        return "project"
    if scheme == "domain" and generator in RETHINKFL_GENERATORS:
        return generator
    if generator in RETHINKFL_GENERATORS:
        raise PartitionError(
            f"partition.generator {generator} is RethinkFL's domain-skew split: "
            "it needs partition.scheme domain"
        )
    if scheme in ("domain", "pathological", "flwr_datasets") and generator not in (
        None,
        "project",
    ):
        raise PartitionError(
            f"partition.generator {generator} has no '{scheme}' split "
            "(the authors' code has none): leave it null or project"
        )
    return generator or "project"
