"""``partition.scheme: flwr_datasets``: Flower Datasets' partitioners, named in the
experiment and checked before a run.

``partition.partitioner`` is ``{name: <a class of flwr_datasets.partitioner>, <its
keyword arguments>}``, e.g. ``{name: DirichletPartitioner, alpha: 0.3,
min_partition_size: 5}`` or ``{name: PathologicalPartitioner,
num_classes_per_partition: 2, class_assignment_mode: first-deterministic}``. The project
supplies ``num_partitions`` (``federation.num_clients``) and ``partition_by`` (the
column of labels, ``label``; ``partition_by: domain`` partitions by the domain ids of a
dataset with domains, e.g. ``NaturalIdPartitioner``: one client per domain); ``seed``,
where the class takes one and the spec does not give it, is the split's seed
(``partition.seed``, default the experiment's ``seed``). The split itself is computed by
:func:`fedrcl_flwr.data.sources.hf.flwr_datasets_split` (labels in, index lists out).

:func:`check_spec` runs with the config's checks (one line naming the key and the file,
exit 2, before any Flower process): flwr-datasets installed, the class known and one
that splits samples (not the vertical, feature-splitting ones nor an abstract base), the
arguments accepted by its constructor, and the constructor's own checks of their values
(it is built once, without data), and the values Flower leaves to its arithmetic
(:data:`AT_LEAST_ONE`: ``GroupedNaturalIdPartitioner``'s ``group_size``). An argument
Flower takes as a NumPy array (:data:`ARRAY_ARGS`: ``DistributionPartitioner``'s
``distribution_array``) is written in YAML as a list of lists of numbers, one row per
label, and handed to Flower as a float64 array. Only ``flwr_datasets.partitioner`` is
imported (it imports Hugging Face ``datasets``); nothing of :mod:`fedrcl_flwr.data`.

Offline and quiet: every import and use goes through :func:`offline`, which sets
``FLWR_TELEMETRY_ENABLED=0`` (Flower Datasets' usage telemetry; read when it is first
imported) and ``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1`` (no Hugging Face Hub
access) unless the environment already sets them, and restores the environment after.
(In flwr-datasets 0.6.1 only ``FederatedDataset`` and the plotting helpers send telemetry,
never a partitioner; it is off regardless.)
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from typing import Any

from fedrcl_flwr.errors import ConfigError, shown

KEY = "partition.partitioner"
EXTRA = "flwr-datasets"
# set by the project, never by the spec
PROJECT_ARGS = ("num_partitions",)
# the columns a partitioner may read: the labels, or the domain ids
COLUMNS = ("label", "domain")
# classes of flwr_datasets.partitioner that do not split samples from a YAML spec:
# the base classes, the vertical (feature-splitting) ones, and one that takes a function
NOT_SAMPLE_SPLITTERS = (
    "Partitioner",
    "IdToSizeFncPartitioner",
    "VerticalEvenPartitioner",
    "VerticalSizePartitioner",
)
_OFFLINE_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
# arguments whose value Flower's constructor does not check although its arithmetic needs
# it (flwr-datasets 0.6.1: GroupedNaturalIdPartitioner(group_size=0) takes ``n % 0``)
AT_LEAST_ONE = {"GroupedNaturalIdPartitioner": ("group_size",)}
# arguments Flower takes as a NumPy array, given in YAML as a list of lists of numbers
# (DistributionPartitioner's distribution_array: one row per label); at most this many
ARRAY_ARGS = {"DistributionPartitioner": ("distribution_array",)}
MAX_ARRAY_ENTRIES = 1_000_000


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Flower Datasets' telemetry off and Hugging Face offline for the block (values the
    environment already holds are kept), the environment restored afterwards."""
    saved = {k: os.environ.get(k) for k in _OFFLINE_ENV}
    for k, v in _OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def install_hint() -> str:
    return f"pip install 'fedrcl-flwr[{EXTRA}]'"


def partitioner_module(where: str) -> Any:
    """``flwr_datasets.partitioner`` (imported offline), or a :class:`ConfigError` saying
    how to install it."""
    import importlib

    with offline():
        try:
            return importlib.import_module("flwr_datasets.partitioner")
        except ImportError:
            raise ConfigError(
                f"{where}: partition.scheme flwr_datasets needs Flower Datasets ({install_hint()})"
            ) from None


def names(module: Any) -> list[str]:
    """The partitioners a spec may name (every sample-splitting class the module exports)."""
    return sorted(
        n
        for n in getattr(module, "__all__", [])
        if n not in NOT_SAMPLE_SPLITTERS and inspect.isclass(getattr(module, n, None))
    )


def _parameters(cls: Any) -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(cls.__init__).parameters)
    params.pop("self", None)
    return params


def constructor_args(spec: Any, num_clients: int, seed: int, where: str) -> tuple[Any, dict]:
    """(class, keyword arguments) of ``spec`` for ``num_clients`` clients and split seed
    ``seed``, checked (see the module docstring); ``partition_by`` is returned as given
    (``label`` or ``domain``). A problem is a :class:`ConfigError` naming ``where`` and
    the key."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ConfigError(
            f"{where}: '{KEY}' must be a mapping {{name: <a flwr_datasets partitioner "
            f"class>, <its arguments>}}, got {shown(spec)}"
        )
    module = partitioner_module(where)
    name = spec["name"]
    known = names(module)
    if name not in known:
        raise ConfigError(f"{where}: '{KEY}.name' {shown(name)} is not one of {', '.join(known)}")
    cls = getattr(module, name)
    params = _parameters(cls)
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    _check_argument_names(kwargs, params, name, where)
    if "partition_by" in params:
        kwargs.setdefault("partition_by", "label")
        if kwargs["partition_by"] not in COLUMNS:
            raise ConfigError(
                f"{where}: '{KEY}.partition_by' must be label or domain (the columns the "
                f"project gives it), got {shown(kwargs['partition_by'])}"
            )
    for k in AT_LEAST_ONE.get(name, ()):
        if k in kwargs and not (
            isinstance(kwargs[k], int) and not isinstance(kwargs[k], bool) and kwargs[k] >= 1
        ):
            raise ConfigError(
                f"{where}: '{KEY}.{k}' must be an integer >= 1, got {shown(kwargs[k])}"
            )
    for k in ARRAY_ARGS.get(name, ()):
        if k in kwargs:
            kwargs[k] = _number_table(kwargs[k], f"{KEY}.{k}", where)
    if "num_partitions" in params:
        kwargs["num_partitions"] = int(num_clients)
    if "seed" in params:
        kwargs.setdefault("seed", int(seed))
    missing = [
        p
        for p, par in params.items()
        if par.default is inspect.Parameter.empty
        and par.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and p not in kwargs
    ]
    if missing:
        raise ConfigError(f"{where}: '{KEY}' for {name} needs {', '.join(missing)}")
    return cls, kwargs


def _check_argument_names(kwargs: dict, params: dict, name: str, where: str) -> None:
    """Every key of ``kwargs`` is an argument of partitioner ``name`` (whose parameters
    are ``params``; any key when it takes ``**kwargs``) that the project does not set."""
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for k in kwargs:
        if k in PROJECT_ARGS:
            raise ConfigError(
                f"{where}: '{KEY}.{k}' is set by the project (federation.num_clients); remove it"
            )
        if k not in params and not takes_kwargs:
            accepted = [p for p in params if p not in PROJECT_ARGS]
            raise ConfigError(
                f"{where}: '{KEY}.{k}' is not an argument of {name} "
                f"(it takes {', '.join(accepted) or 'nothing else'})"
            )


def _number_table(value: Any, key: str, where: str) -> Any:
    """A YAML list of equally long lists of finite numbers >= 0 as a float64 NumPy array
    (what Flower's ``DistributionPartitioner`` takes), or a :class:`ConfigError`."""
    import math

    import numpy as np

    def number(v: Any) -> bool:  # finite and >= 0; an int of 400 digits is no float
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return 0 <= v < 2**63 if isinstance(v, int) else math.isfinite(v) and v >= 0

    rows: list = value if isinstance(value, list) else []
    ok = bool(rows) and all(isinstance(r, list) and r for r in rows)
    ok = ok and len({len(r) for r in rows}) == 1 and len(rows) * len(rows[0]) <= MAX_ARRAY_ENTRIES
    ok = ok and all(number(v) for r in rows for v in r)
    if not ok:
        raise ConfigError(
            f"{where}: '{key}' must be a list of equally long lists of numbers >= 0 (one "
            f"row per label, at most {MAX_ARRAY_ENTRIES:,} numbers), got {shown(value)}"
        )
    return np.asarray(rows, dtype=np.float64)


def build(spec: Any, num_clients: int, seed: int, where: str) -> tuple[Any, str | None]:
    """The partitioner object of ``spec`` (built offline, no data yet) and the column it
    partitions by (``None`` for one that reads none). Its constructor's own checks
    (a negative ``alpha``, an unknown mode) are a :class:`ConfigError`."""
    cls, kwargs = constructor_args(spec, num_clients, seed, where)
    try:
        with offline():
            obj = cls(**kwargs)
    except Exception as exc:  # noqa: BLE001 - any refusal of the constructor is one line
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"{where}: '{KEY}' ({spec['name']}): {text}") from None
    return obj, kwargs.get("partition_by")


def check_spec(spec: Any, num_clients: int, seed: int, where: str) -> None:
    """Everything that can be checked without the data (see the module docstring)."""
    build(spec, num_clients, seed, where)
