"""The checks across keys (:data:`CROSS_CHECKS`), run in order after each key's rule
(:data:`~fedrcl_flwr.config.rules.CONFIG_RULES`) by :func:`check_config`; the first problem
is one :class:`ConfigError` naming the key and the file.
"""

from __future__ import annotations

import math
import typing
from typing import Any

from fedrcl_flwr.config.catalog import (
    DATASETS,
    dataset_info,
    domain_datasets_in_words,
    ema_round,
    is_report_metric,
    metric_choices,
)
from fedrcl_flwr.config.rules import _shorten, check_rules, name_problem
from fedrcl_flwr.config.schema import DatasetConfig, ExperimentConfig, PartitionConfig
from fedrcl_flwr.errors import ConfigError, shown

MIN_NORMALIZE_STD = 1e-3  # dataset.normalize.std: a smaller divisor blows pixels up past 1e3
MAX_SUPERNODES = 10_000  # SuperNodes one simulation may start (each is registered in the DB)


def check_config(cfg: ExperimentConfig, source: str) -> None:
    """Every check of a loaded configuration, in order: each key's rule
    (:data:`CONFIG_RULES`), then the checks across keys (:data:`CROSS_CHECKS`). The first
    problem is one :class:`ConfigError` naming the key and ``source``."""
    check_rules(cfg, source)
    for check in CROSS_CHECKS:
        check(cfg, source)


def _check_federation_size(cfg: ExperimentConfig, source: str) -> None:
    fed = cfg.federation
    if fed.participation is None and fed.clients_per_round is None:
        raise ConfigError(
            f"{source}: set one of 'federation.participation' or 'federation.clients_per_round'"
        )
    if fed.clients_per_round is not None and fed.clients_per_round > fed.num_clients:
        raise ConfigError(
            f"{source}: 'federation.clients_per_round' ({fed.clients_per_round}) exceeds "
            f"'federation.num_clients' ({fed.num_clients})"
        )
    generated = dataset_info(cfg.dataset.name).generated
    if generated and fed.num_clients > cfg.dataset.synthetic.num_train:
        raise ConfigError(
            f"{source}: 'federation.num_clients' ({fed.num_clients}) exceeds "
            f"'dataset.synthetic.num_train' ({cfg.dataset.synthetic.num_train}): every "
            "client needs at least one sample"
        )


def _check_report_metric(cfg: ExperimentConfig, source: str) -> None:
    rm = cfg.evaluation.report_metric
    target = ema_round(rm)
    if target is not None and target not in cfg.evaluation.target_rounds:
        raise ConfigError(
            f"{source}: 'evaluation.report_metric' {rm} needs {target} in "
            f"'evaluation.target_rounds' (got {cfg.evaluation.target_rounds})"
        )


def _check_local_optimiser(cfg: ExperimentConfig, source: str) -> None:
    if cfg.client.nesterov and (cfg.client.optimizer != "sgd" or cfg.client.momentum <= 0):
        raise ConfigError(
            f"{source}: 'client.nesterov' needs client.optimizer sgd and "
            f"'client.momentum' > 0 (got {cfg.client.optimizer}, momentum "
            f"{cfg.client.momentum})"
        )
    if cfg.client.lr_schedule == "cosine" and cfg.client.lr_decay != 1.0:
        raise ConfigError(
            f"{source}: 'client.lr_schedule' cosine replaces the per-round decay: set "
            f"'client.lr_decay' to 1 (got {cfg.client.lr_decay})"
        )
    if cfg.client.amp == "fp16" and cfg.client.device == "cpu":
        raise ConfigError(
            f"{source}: 'client.amp' fp16 needs a CUDA device (client.device "
            "is cpu); use bf16 or off"
        )


def _check_data_and_split(cfg: ExperimentConfig, source: str) -> None:
    """What the dataset and the partition scheme need of each other."""
    info = dataset_info(cfg.dataset.name)
    if info.source == "path" and not cfg.dataset.path:
        raise ConfigError(
            f"{source}: 'dataset.path' is required when dataset.name is {cfg.dataset.name}"
        )
    _check_new_schemes(cfg, source)
    check_normalize(cfg.dataset, source)
    _check_generator(cfg.partition, source)
    if cfg.partition.scheme == "file" and not cfg.partition.path:
        raise ConfigError(
            f"{source}: 'partition.path' is required when partition.scheme is "
            "file (a JSON or the authors' dict-literal split file)"
        )
    if cfg.dataset.domain_column is not None and cfg.dataset.name != "hf_disk":
        raise ConfigError(
            f"{source}: 'dataset.domain_column' names a column of an hf_disk dataset, not "
            f"of {shown(cfg.dataset.name)} (npz: d_train / d_test and domain_names)"
        )
    if cfg.partition.scheme == "domain":
        ds = cfg.dataset
        if info.generated and ds.synthetic.num_domains < 2:
            raise ConfigError(
                f"{source}: 'partition.scheme' domain needs 'dataset.synthetic.num_domains' >= 2"
            )
        if info.domain_folders and len(ds.domains) < 2:
            raise ConfigError(
                f"{source}: 'partition.scheme' domain on an image folder needs "
                "'dataset.domains' (two or more domain sub-folders)"
            )
        if ds.name == "hf_disk" and not ds.domain_column:
            raise ConfigError(
                f"{source}: 'partition.scheme' domain on hf_disk needs "
                "'dataset.domain_column' (the column naming each image's domain)"
            )
        if not info.domains:
            raise ConfigError(
                f"{source}: 'partition.scheme' domain needs a dataset with "
                f"domains ({domain_datasets_in_words()}), "
                f"not {shown(ds.name)}"
            )


def _check_new_schemes(cfg: ExperimentConfig, source: str) -> None:
    """``pathological`` (k within the classes the config can tell) and ``flwr_datasets``
    (its partitioner spec, :mod:`fedrcl_flwr.config.partitioners`); ``partition.
    partitioner`` only with ``flwr_datasets``."""
    p = cfg.partition
    info = dataset_info(cfg.dataset.name)
    if info.requires is not None:
        import importlib.util

        if importlib.util.find_spec(info.requires.module) is None:
            raise ConfigError(
                f"{source}: 'dataset.name' {cfg.dataset.name} needs {info.requires.what} "
                f"(pip install 'fedrcl-flwr[{info.requires.extra}]')"
            )
    if p.partitioner is not None and p.scheme != "flwr_datasets":
        raise ConfigError(
            f"{source}: 'partition.partitioner' applies to partition.scheme flwr_datasets "
            f"only (scheme is {p.scheme}); remove it"
        )
    if p.scheme == "pathological":
        known = cfg.model.num_classes
        if info.generated:
            known = cfg.dataset.synthetic.num_classes
        if known is not None and p.classes_per_client > known:
            raise ConfigError(
                f"{source}: 'partition.classes_per_client' ({p.classes_per_client}) exceeds "
                f"the {known} classes of the dataset"
            )
    if p.scheme == "flwr_datasets":
        from fedrcl_flwr.config.partitioners import check_spec

        if not p.partitioner:
            raise ConfigError(
                f"{source}: 'partition.partitioner' is required when partition.scheme is "
                "flwr_datasets ({name: <a flwr_datasets partitioner class>, <its arguments>})"
            )
        seed = cfg.seed if p.seed is None else p.seed
        check_spec(p.partitioner, cfg.federation.num_clients, seed, source)


def _check_reference(cfg: ExperimentConfig, source: str) -> None:
    check_reference(cfg.reference, source)


def _check_feature_sections(cfg: ExperimentConfig, source: str) -> None:
    """The sections of optional features (per-client evaluation, unreliable clients,
    trackers, privacy: :mod:`fedrcl_flwr.config.sections`), and the extras they need
    installed (:mod:`fedrcl_flwr.config.extras`)."""
    from fedrcl_flwr.config.extras import installed, pip_install
    from fedrcl_flwr.config.sections import (
        check_availability,
        check_client_eval,
        check_privacy_section,
        check_trackers,
    )

    check_client_eval(cfg, source)
    check_availability(cfg, source)
    if cfg.output.tensorboard and not installed("tensorboard"):
        raise ConfigError(
            f"{source}: 'output.tensorboard' is true but the tensorboard "
            f"package is not installed ({pip_install('tensorboard')}, or set "
            "it to false)"
        )
    check_trackers(cfg, source)
    check_privacy_section(cfg, source)


def _check_names_and_paths(cfg: ExperimentConfig, source: str) -> None:
    why = name_problem(cfg.name)
    if why:
        raise ConfigError(
            f"{source}: 'name' {why} (it names the run's directory), got {_shorten(cfg.name)}"
        )
    if not cfg.output.dir.strip() or "\0" in cfg.output.dir:
        raise ConfigError(
            f"{source}: 'output.dir' must be a directory path, got {shown(cfg.output.dir)}"
        )


def _check_supernodes(cfg: ExperimentConfig, source: str) -> None:
    fed = cfg.federation
    nodes = cfg.supernodes()
    if nodes > MAX_SUPERNODES:
        raise ConfigError(
            f"{source}: {nodes} SuperNodes ('simulation.num_supernodes', default the "
            f"clients sampled per round) is more than {MAX_SUPERNODES}; SuperNodes are "
            "execution slots, not clients: set simulation.num_supernodes to a few hundred "
            "at most"
        )
    if cfg.simulation.num_supernodes and cfg.simulation.num_supernodes > fed.num_clients:
        raise ConfigError(
            f"{source}: 'simulation.num_supernodes' ({cfg.simulation.num_supernodes}) exceeds "
            f"'federation.num_clients' ({fed.num_clients}); extra SuperNodes would never train"
        )


def dataset_channels(d: DatasetConfig) -> int | None:
    """Channels of the dataset's images, where the config decides it."""
    info = DATASETS.get(d.name)
    if info is not None and info.generated:
        return int(d.synthetic.channels)
    return info.channels if info is not None else None


def normalize_constants(value: Any, where: str, channels: int | None) -> tuple | None:
    """``(mean, std)`` of an explicit ``dataset.normalize`` mapping (``None`` for
    true / false), checked: exactly the keys ``mean`` and ``std``, each a list of
    ``channels`` finite numbers (any common length when ``channels`` is None), mean in
    [0, 1], std >= :data:`MIN_NORMALIZE_STD`. A problem is one :class:`ConfigError` naming the key and ``where``."""
    if isinstance(value, bool):
        return None
    key = "dataset.normalize"
    if isinstance(value, dict):
        unknown = sorted(str(k) for k in value if k not in ("mean", "std"))
        missing = [k for k in ("mean", "std") if k not in value]
        if unknown or missing:
            what = (
                f"unknown key '{key}.{unknown[0]}'"
                if unknown
                else f"'{key}.{missing[0]}' is missing"
            )
            raise ConfigError(
                f"{where}: {what}: '{key}' as a mapping takes exactly the keys mean and "
                f"std (lists, one value per channel), got {sorted(map(str, value))}"
            )
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: '{key}' must be true, false or {{mean: [...], std: "
            f"[...]}} (one value per channel), got {shown(value)}"
        )
    mean, std = (
        _channel_values(value[part], f"{key}.{part}", where, channels) for part in ("mean", "std")
    )
    if len(mean) != len(std):
        raise ConfigError(
            f"{where}: '{key}.mean' has {len(mean)} values and '{key}.std' "
            f"{len(std)}: give one of each per channel"
        )
    if not all(0.0 <= m <= 1.0 for m in mean):
        raise ConfigError(f"{where}: '{key}.mean' must be in [0, 1] (pixel units), got {mean}")
    if not all(s >= MIN_NORMALIZE_STD for s in std):
        raise ConfigError(
            f"{where}: '{key}.std' must be >= {MIN_NORMALIZE_STD:g} (dividing pixels in "
            f"[0, 1] by less overflows the input), got {std}"
        )
    return mean, std


def _channel_values(v: Any, key: str, where: str, channels: int | None) -> list[float]:
    """``v`` of :func:`normalize_constants` as floats: a non-empty list of finite
    numbers, ``channels`` of them when given."""
    ok = (
        isinstance(v, list)
        and len(v) > 0
        and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v
        )
    )
    if not ok:
        raise ConfigError(
            f"{where}: '{key}' must be a list of numbers, one per channel, got {shown(v)}"
        )
    if channels is not None and len(v) != channels:
        raise ConfigError(
            f"{where}: '{key}' has {len(v)} values but the images "
            f"have {channels} channel(s), got {shown(v)}"
        )
    return [float(x) for x in v]


def check_normalize(d: DatasetConfig, source: str) -> None:
    normalize_constants(d.normalize, source, dataset_channels(d))


def _check_generator(p: PartitionConfig, source: str) -> None:
    from fedrcl_flwr.config.sections import resolve_generator
    from fedrcl_flwr.errors import PartitionError

    try:
        resolve_generator(p.scheme, p.balanced, p.generator)
    except PartitionError as exc:
        raise ConfigError(f"{source}: {exc}") from None


REFERENCE_KEYS = ("source", "metric", "values", "when")


def check_reference(ref: Any, source: str) -> list[dict]:
    """Validate the paper numbers of an experiment and return them as a list of blocks.

    ``reference`` is one block or a list of blocks, each ``{source: "FedRCL Table 1",
    metric: final | best | last5 | ema@ROUND, values: {label: percent}, when: {dotted key:
    value}}``. ``label`` is the method as ``report`` names rows (``client.method``, or
    ``server.strategy+client.method`` for a server optimizer other than fedavg); ``when``
    (optional) restricts a block to runs whose resolved config has those values (a YAML
    whose comments give the numbers of other columns, e.g. another alpha)."""
    if ref is None:
        return []
    blocks = ref if isinstance(ref, list) else [ref]
    for i, b in enumerate(blocks):
        where = f"reference[{i}]" if isinstance(ref, list) else "reference"
        if not isinstance(b, dict):
            raise ConfigError(f"{source}: '{where}' must be a mapping with source, metric, values")
        for k in b:
            if k not in REFERENCE_KEYS:
                raise ConfigError(
                    f"{source}: unknown key '{where}.{k}' (allowed here: "
                    f"{', '.join(REFERENCE_KEYS)})"
                )
        if not isinstance(b.get("source"), str) or not b["source"]:
            raise ConfigError(f"{source}: '{where}.source' must name the paper's table")
        if not is_report_metric(b.get("metric")):
            raise ConfigError(
                f"{source}: '{where}.metric' must be {metric_choices()}, got {shown(b.get('metric'))}"
            )
        vals = b.get("values")
        if not isinstance(vals, dict) or not vals:
            raise ConfigError(
                f"{source}: '{where}.values' must map method labels to the "
                "paper's accuracy in percent"
            )
        for k, v in vals.items():
            if not isinstance(k, str) or not (
                v is None
                or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 100)
            ):
                raise ConfigError(
                    f"{source}: '{where}.values.{k}' must be a percentage in "
                    f"[0, 100] (or null), got {shown(v)}"
                )
        when = b.get("when", {})
        if not isinstance(when, dict) or not all(isinstance(k, str) for k in when):
            raise ConfigError(f"{source}: '{where}.when' must map dotted config keys to values")
    return blocks


def _check_registries(cfg: ExperimentConfig, source: str) -> None:
    """The model name; ``client.method`` / ``server.strategy`` and their parameters are
    checked by ``fedrcl_flwr.app.validate.validate_components`` (it imports the method's
    Flower client, which this module must not)."""
    from fedrcl_flwr.models import MODEL_NAMES

    if cfg.model.name not in MODEL_NAMES:
        raise ConfigError(
            f"{source}: 'model.name' must be one of {', '.join(sorted(MODEL_NAMES))}, "
            f"got {shown(cfg.model.name)}"
        )


# the checks across keys, in the order they run (after CONFIG_RULES)
CROSS_CHECKS: tuple[typing.Callable[[ExperimentConfig, str], None], ...] = (
    _check_federation_size,
    _check_report_metric,
    _check_local_optimiser,
    _check_data_and_split,
    _check_reference,
    _check_feature_sections,
    _check_names_and_paths,
    _check_supernodes,
    _check_registries,
)
