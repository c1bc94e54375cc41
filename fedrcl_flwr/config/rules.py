"""The allowed values of each key that has a range or a set of choices (:data:`CONFIG_RULES`),
as the component parameters declare theirs (:class:`~fedrcl_flwr.components.Rule`), and
the rule for names the tool turns into directories (:func:`name_problem`).

Types are checked from the annotations first (:mod:`fedrcl_flwr.config.loading`); null
(allowed only where the annotation is Optional) never reaches a rule.
"""

from __future__ import annotations

from typing import Any

from fedrcl_flwr.components import (
    Rule,
    at_least,
    between,
    non_negative,
    one_of,
    or_null,
    positive,
    with_text,
)
from fedrcl_flwr.config.catalog import (
    DATASET_NAMES,
    GENERATORS,
    PER_CLIENT_CLIENTS,
    PER_CLIENT_LOCAL_TESTS,
    SCHEME_NAMES,
    TEST_SPLITS,
    in_words,
    is_report_metric,
    metric_choices,
)
from fedrcl_flwr.config.schema import ExperimentConfig
from fedrcl_flwr.errors import ConfigError, shown


def _fraction(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1


MAX_NAME_BYTES = 128  # a name the tool turns into a directory (experiment, sweep, label)


def name_problem(text: Any, max_bytes: int = MAX_NAME_BYTES) -> str | None:
    """Why ``text`` cannot be one directory name the tool creates, or ``None``: it must
    be a non-empty string, one path component (no ``/`` or ``\\``, not ``.`` or ``..``),
    without control characters, at most ``max_bytes`` bytes in UTF-8."""
    if not isinstance(text, str) or not text.strip():
        return "must be a non-empty name"
    if any(c in text for c in "/\\"):
        return "must be one path component (no '/' or '\\')"
    if text.strip() in (".", ".."):
        return "may not be '.' or '..'"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "may not contain control characters"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return "must be valid Unicode text"
    if size > max_bytes:
        return f"is {size} bytes long (at most {max_bytes})"
    return None


def _shorten(text: Any, limit: int = 60) -> str:
    return shown(text, limit)


def _ray_address_ok(v: Any) -> bool:
    if v is None:
        return True
    host, sep, port = str(v).rpartition(":")
    return (
        bool(sep)
        and bool(host)
        and port.isdigit()
        and 0 < int(port) < 65536
        and not any(c.isspace() for c in str(v))
    )


# --------------------------------------------------------------------------------------
# Rules: the allowed values of each key that has a range or a set of choices, as the
# component parameters declare theirs (fedrcl_flwr.components.Rule; ``bad`` holds values
# tests/config/test_config.py feeds in). Types are checked from the annotations first; null
# (allowed only where the annotation is Optional) never reaches a rule.
# --------------------------------------------------------------------------------------


def _u32(null: bool = False) -> Rule:
    return Rule(
        lambda v: 0 <= v < 2**32,
        "must be in [0, 2**32)" + (" (or null)" if null else ""),
        (-1, 2**32),
    )


def _label_ok(v: str) -> bool:
    return bool(v.strip()) and v.isprintable() and len(v) <= 80


def _betas_ok(v: list) -> bool:
    return len(v) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in v
    )


CONFIG_RULES: dict[str, Rule] = {
    "seed": _u32(),
    "label": Rule(
        _label_ok,
        "must be one line of printable text, at most 80 characters (or null)",
        ("", "two\nlines", "x" * 81),
    ),
    "dataset.name": one_of(*DATASET_NAMES),
    "dataset.val_fraction": between(0, 1, hi_open=True),
    "dataset.test_fraction": between(0, 1, lo_open=True, hi_open=True),
    "dataset.test_split": one_of(*TEST_SPLITS),
    "dataset.domains": Rule(
        lambda v: all(isinstance(d, str) and d for d in v),
        "must be a list of domain (folder) names",
        ([""], [3]),
    ),
    "dataset.image_size": at_least(8),
    "dataset.rotation": with_text(between(0, 180), "must be in [0, 180] degrees"),
    "dataset.crop_pad": or_null(non_negative()),
    "dataset.pad_fill": Rule(lambda v: v in ("black", "mean"), "must be black or mean", ("white",)),
    "dataset.synthetic.num_train": at_least(1),
    "dataset.synthetic.num_test": at_least(1),
    "dataset.synthetic.num_classes": at_least(2),
    "dataset.synthetic.image_size": at_least(8),
    "dataset.synthetic.channels": at_least(1),
    "dataset.synthetic.subclusters": at_least(1),
    "dataset.synthetic.num_domains": at_least(1),
    "dataset.synthetic.noise": non_negative(),
    "dataset.synthetic.distractor_strength": non_negative(),
    "dataset.synthetic.class_weight": positive(),
    "partition.scheme": one_of(*SCHEME_NAMES),
    "partition.seed": _u32(null=True),
    "partition.generator": Rule(
        lambda v: v in GENERATORS, f"must be {in_words(GENERATORS)} (or null)", ("authors",)
    ),
    "partition.domain_fraction": Rule(
        lambda v: (
            v is None
            or (isinstance(v, list) and len(v) > 0 and all(map(_fraction, v)))
            or _fraction(v)
        ),
        "must be a number in (0, 1], a list of them (one per domain), or null",
        (0.0, 1.5, [0.5, 2.0]),
    ),
    "partition.alpha": positive(),
    "partition.shards_per_client": at_least(1),
    "partition.classes_per_client": at_least(1),
    "partition.min_size": non_negative(),
    "partition.domains_per_client": at_least(1),
    "partition.samples_per_class": or_null(at_least(1)),
    "model.num_classes": at_least(2),
    "model.init": Rule(
        lambda v: v in ("model", "pytorch"), "must be 'model' or 'pytorch'", ("torch",)
    ),
    "federation.num_clients": at_least(1),
    "federation.rounds": at_least(1),
    "federation.participation": between(0, 1, lo_open=True),
    "federation.clients_per_round": at_least(1),
    "federation.eval_every": at_least(1),
    "federation.max_consecutive_failed_rounds": at_least(1),
    "federation.round_timeout_s": or_null(positive()),
    "federation.availability.stragglers.deadline": or_null(positive()),
    "federation.availability.stragglers.jitter": non_negative(),
    "client.optimizer": one_of("sgd", "adam", "adamw"),
    "client.betas": Rule(
        _betas_ok,
        "must be two numbers in [0, 1), e.g. [0.9, 0.999]",
        ([0.9], [0.9, 1.0], [0.9, True]),
    ),
    "client.eps": between(0, 1, lo_open=True, hi_open=True),
    "client.lr": positive(),
    "client.lr_decay": between(0, 1, lo_open=True),
    "client.lr_schedule": one_of("exponential", "cosine"),
    "client.epoch_lr_decay": between(0, 1, lo_open=True),
    "client.momentum": between(0, 1, hi_open=True),
    "client.weight_decay": non_negative(),
    "client.local_epochs": between(1, 10_000),
    "client.batch_size": at_least(1),
    "client.iterations_per_epoch": between(1, 1_000_000),
    "client.grad_clip": or_null(positive()),
    "client.device": Rule(
        lambda v: v in ("auto", "cpu", "cuda"), "must be auto, cpu or cuda", ("gpu",)
    ),
    "client.amp": one_of("off", "bf16", "fp16"),
    "client.channels_last": Rule(
        lambda v: v == "auto" or isinstance(v, bool), "must be auto, true or false", ("yes",)
    ),
    "server.weighting": Rule(
        lambda v: v in ("uniform", "samples"), "must be 'uniform' or 'samples'", ("clients",)
    ),
    "server.average_dtype": one_of("float64", "float32"),
    "evaluation.ema": between(0, 1, hi_open=True),
    "evaluation.target_rounds": Rule(
        lambda v: all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in v),
        "must be a list of positive integers",
        ([0], [1.5], [True]),
    ),
    "evaluation.batch_size": at_least(1),
    "evaluation.representation_every": non_negative(),
    "evaluation.report_metric": Rule(
        is_report_metric,
        f"must be {metric_choices()} (ROUND a target round, e.g. ema@500)",
        ("ema@0", "last10", "client_mean", "ema@0_domain_mean", "last5_domain_mean_domain_mean"),
    ),
    "evaluation.local_representation_every": non_negative(),
    "evaluation.robust_every": non_negative(),
    "evaluation.robust_eps": with_text(
        between(0, 1, lo_open=True), "must be in (0, 1] (pixel units)"
    ),
    "evaluation.robust_step": with_text(
        between(0, 1, lo_open=True), "must be in (0, 1] (pixel units)"
    ),
    "evaluation.robust_steps": between(1, 10_000),
    "evaluation.robust_samples": at_least(1),
    "evaluation.per_client.every": with_text(non_negative(), "must be >= 0 (0 = off)"),
    "evaluation.per_client.local_test_fraction": between(0, 1, hi_open=True),
    "evaluation.per_client.finetune_steps": between(0, 100_000),
    "evaluation.per_client.clients": Rule(
        lambda v: v in PER_CLIENT_CLIENTS, f"must be {in_words(PER_CLIENT_CLIENTS)}", ("some",)
    ),
    "evaluation.per_client.local_test": one_of(*PER_CLIENT_LOCAL_TESTS),
    "simulation.num_cpus": with_text(at_least(1), "must be a whole number >= 1"),
    "simulation.num_gpus": non_negative(),
    "simulation.init_num_cpus": at_least(1),
    "simulation.init_num_gpus": non_negative(),
    "simulation.num_supernodes": at_least(1),
    "simulation.startup_timeout_s": positive(),
    "simulation.ray_address": Rule(
        _ray_address_ok,
        "must be HOST:PORT of a Ray head node, an explicit address ('auto' could join "
        "another user's Ray on this machine), or null: a private local Ray",
        ("localhost", "host:0", "host:99999", "a b:1", "auto"),
    ),
    "simulation.transport": one_of("shared", "flower"),
    "output.checkpoint_every": non_negative(),
    "output.tracker_project": Rule(
        lambda v: bool(v.strip()) and "/" not in v,
        "must be a non-empty name without slashes",
        (" ", "a/b"),
    ),
    "output.tracker_timeout_s": between(0, 3600, lo_open=True),
    "output.tracker_group": Rule(
        lambda v: bool(v.strip()), "must be a non-empty name (or null)", (" ",)
    ),
    "privacy.dp.mode": Rule(
        lambda v: v in ("server", "client"), "must be server or client", ("both",)
    ),
    "privacy.dp.noise_multiplier": non_negative(),
    "privacy.dp.clipping_norm": positive(),
    "privacy.dp.delta": between(0, 1, lo_open=True, hi_open=True),
    "privacy.secagg_num_shares": with_text(
        positive(), "must be > 0 (an int: a count, a float: a proportion)"
    ),
    "privacy.secagg_threshold": with_text(
        positive(), "must be > 0 (an int: a count, a float: a proportion)"
    ),
    "privacy.secagg_clipping_range": positive(),
    "privacy.secagg_quantization_range": at_least(2),
    "privacy.secagg_max_weight": or_null(positive()),
}


def check_rules(cfg: ExperimentConfig, source: str) -> None:
    for key, rule in CONFIG_RULES.items():
        value = value_at(cfg, key)
        if value is not None and not rule.ok(value):
            raise ConfigError(f"{source}: '{key}' {rule.text}, got {shown(value)}")


def value_at(cfg: ExperimentConfig, key: str) -> Any:
    """The value of dotted ``key``; ``None`` below a section that is null
    (``privacy.dp.mode`` without ``privacy.dp``)."""
    obj: Any = cfg
    for part in key.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part)
    return obj
