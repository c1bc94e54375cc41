"""Experiment configuration: a typed schema with defaults, YAML loading, dotted overrides.

An experiment is one YAML file whose top-level sections map onto the dataclasses below.
Every key is checked on load: unknown keys, wrong types (from the annotations),
out-of-range values (each key's declared :class:`~fedrcl_flwr.components.Rule` in
:data:`CONFIG_RULES`) and inconsistent combinations (the named checks of
:data:`CROSS_CHECKS`, in order) raise a single :class:`ConfigError` that names the
offending key and the file it came from.

Overrides use dotted keys, e.g. ``client.lr=0.05`` or ``partition.alpha=0.1``; values are
parsed as YAML scalars (``true``, ``0.3``, ``[0, 1]``, ``null``) and then validated like
keys in the file.

Reading YAML (files and ``--set`` values alike, one loader, :class:`_Loader`): the file must
be UTF-8 and at most :data:`MAX_YAML_BYTES`; a key given twice in one mapping (at any
level) is an error naming the key and both lines; anchors/aliases may not expand to more
than :data:`MAX_YAML_NODES` nodes (an "alias bomb" is refused before anything is copied);
floats are read as a person writes them (``1e-3``, ``1E-3``, ``.5``, ``-2.5e+4`` are floats,
not strings as under YAML 1.1). Every float in the schema must be finite (``inf``/``nan``
are refused).

Method- and strategy-specific parameters live in the mappings ``client.params`` and
``server.params``; their keys and values are checked against the method's / strategy's
declared contract by ``fedrcl_flwr.app.validate`` when the config is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from fedrcl_flwr.catalog import (
    DATASET_NAMES,
    DATASETS,
    DOMAIN_DATASETS,
    GENERATORS,
    PER_CLIENT_CLIENTS,
    PER_CLIENT_LOCAL_TESTS,
    SCHEME_NAMES,
    ema_round,
    in_words,
    is_report_metric,
    metric_choices,
)
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
from fedrcl_flwr.errors import ConfigError


MAX_YAML_BYTES = 1 << 20  # an experiment file is a few KB; refuse anything over 1 MiB
MAX_SUPERNODES = 10_000  # SuperNodes one simulation may start (each is registered in the DB)
MAX_YAML_NODES = 100_000  # nodes after alias expansion (a config has a few hundred)

MAX_NAME_BYTES = 128  # a name the tool turns into a directory (experiment, sweep, label)


def name_problem(text: Any, max_bytes: int = MAX_NAME_BYTES) -> Optional[str]:
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
    r = repr(text)
    return r if len(r) <= limit else r[:limit] + "...'"


class _Loader(yaml.SafeLoader):
    """SafeLoader + duplicate-key errors + YAML 1.2 floats + a bound on alias expansion."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"unhashable key {key!r}", key_node.start_mark) from None
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"key '{key}' appears twice in the same mapping (lines "
                                  f"{seen[key]} and {line})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _resolve_float(loader_cls) -> None:
    # drop the YAML 1.1 float resolver and add one for 1e-3, 1E-3, .5, 1., -2.5e+4 (and .inf/.nan,
    # which the schema then refuses with a clear message)
    for ch, resolvers in list(loader_cls.yaml_implicit_resolvers.items()):
        loader_cls.yaml_implicit_resolvers[ch] = [
            (tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    rx = re.compile(r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?=[eE]))"""
                    r"""(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""")
    loader_cls.add_implicit_resolver("tag:yaml.org,2002:float", rx,
                                     list("-+0123456789."))


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in
                                   yaml.SafeLoader.yaml_implicit_resolvers.items()}
_resolve_float(_Loader)


class _RecursiveAlias(Exception):
    def __init__(self, node):
        self.node = node


def _expanded_size(node, memo: dict) -> int:
    """Nodes in the tree ``node`` stands for once aliases are expanded (memoised, so an
    alias bomb is measured without being expanded). A node that contains itself (a
    recursive alias, ``&a {x: *a}``) raises :class:`_RecursiveAlias`: no configuration
    is an infinite tree, and every later step (copying, hashing, printing) would recurse
    forever on one."""
    key = id(node)
    if key in memo:
        if memo[key] is None:  # still being measured: the node contains itself
            raise _RecursiveAlias(node)
        return memo[key]
    memo[key] = None
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(n, memo) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[key] = size
    return size


def parse_yaml(text: str, source: str) -> Any:
    """The one YAML reader of the project (files and ``--set`` values)."""
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            try:
                size = _expanded_size(node, {})
            except _RecursiveAlias as rec:
                raise ConfigError(f"{source}: line {rec.node.start_mark.line + 1}: a "
                                  "recursive alias (an anchor used inside itself) is not "
                                  "allowed") from None
            if size > MAX_YAML_NODES:
                raise ConfigError(f"{source}: YAML expands to {size} nodes through anchors/"
                                  f"aliases (at most {MAX_YAML_NODES} allowed)")
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        one = " ".join(str(exc).replace('in "<unicode string>", ', "").split())
        raise ConfigError(f"{source}: not valid YAML ({one})") from None


# --------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------


@dataclass
class SyntheticConfig:
    """Parameters of the embedded synthetic image dataset (``dataset.name: synthetic``)."""

    num_train: int = 20000
    num_test: int = 4000
    num_classes: int = 10
    image_size: int = 32
    channels: int = 3
    subclusters: int = 3  # sub-clusters per class (intra-class structure)
    num_domains: int = 1  # >1: restyled "domains" for inter-domain splits
    # difficulty: pixel noise, strength of class-independent distractor patterns, and
    # weight of the class pattern against the (shared) sub-cluster patterns
    noise: float = 0.9
    distractor_strength: float = 1.0
    class_weight: float = 1.0


@dataclass
class DatasetConfig:
    """Which data to use and how to load it.

    ``name``: synthetic | cifar10 | cifar100 | mnist | fmnist | svhn | usps | stl10 |
    tinyimagenet | imagefolder | digit5 | npz. ``root`` is where torchvision datasets /
    image folders live; ``path`` is the ``.npz`` file for ``npz``; ``download`` lets
    torchvision fetch missing data (needs a network). ``domains`` names the domain
    sub-folders of an image-folder tree (PACS, Office-10, DomainNet) or a subset of
    Digit-5's domains; ``test_fraction`` is held out for testing from image folders that
    have no ``train``/``test`` split. ``verify_md5`` (default true): torchvision checks
    the CIFAR / SVHN / STL-10 files against the official release's MD5s; false loads
    files of your own in those layouts (still decoded by torchvision's classes).

    Input pipeline (training batches; test batches are only normalised), as torchvision's
    ``RandomRotation(rotation)`` -> ``RandomCrop(size, padding=crop_pad)`` ->
    ``RandomHorizontalFlip()`` -> ``ToTensor()`` -> ``Normalize(mean, std)`` applied to the
    PIL image (pixel-exact for the same angle, offsets and flip, ``pad_fill: black``;
    ``fedrcl_flwr/augment.py``), run batched on the training device, when ``augment`` is on:

    * ``rotation`` (degrees, 0 = off): a random rotation in [−rotation, rotation], nearest
      neighbour, black corners (the FedRCL authors use 10, ``datasets/build.py``);
    * ``crop_pad``: the random crop's padding (null = the dataset's default: CIFAR 4,
      Tiny-ImageNet 8, STL-10 12, ...; the FedRCL authors pad 4 for CIFAR and
      Tiny-ImageNet; 0 = no crop); ``flip`` (null = the dataset's default: on for CIFAR,
      STL-10, Tiny-ImageNet, synthetic and image folders; off for the digit datasets):
      random horizontal flip. ``npz`` arrays get no augmentation unless asked for
      (``crop_pad``, ``flip``, ``rotation``): a flip is wrong for digits, text and most
      images that are not natural photographs;
    * ``pad_fill``: ``black`` pads the crop with pixel value 0 before normalisation, as the
      authors' PIL pipelines do; ``mean`` (default) pads after normalisation with 0, i.e.
      with the normalisation mean colour;
    * ``normalize``: ``true`` = the training set's per-channel mean / std; ``false`` =
      none (pixels in [0, 1]); ``{mean: [...], std: [...]}`` = fixed constants, one per
      channel (mean in [0, 1], std > 0), as the authors' ``Normalize`` (FedRCL:
      ``datasets/configs.yaml``).
    """

    name: str = "synthetic"
    root: str = "~/data"
    path: Optional[str] = None
    download: bool = False
    augment: bool = True
    rotation: float = 0.0
    crop_pad: Optional[int] = None
    flip: Optional[bool] = None
    pad_fill: str = "mean"  # black | mean
    normalize: Union[bool, dict] = True  # true | false | {mean: [...], std: [...]}
    image_size: Optional[int] = None
    val_fraction: float = 0.0
    domains: list = field(default_factory=list)
    test_fraction: float = 0.2
    verify_md5: bool = True
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # where prepared arrays are kept (fedrcl_flwr/data/cache.py); null = $FEDRCL_FLWR_CACHE_DIR,
    # else $XDG_CACHE_HOME/fedrcl-flwr or ~/.cache/fedrcl-flwr. Must be the same path on
    # every node of a Ray cluster (a shared filesystem).
    cache_dir: Optional[str] = None


@dataclass
class PartitionConfig:
    """How the training set is split over clients (see ``fedrcl_flwr.data.partition``)."""

    scheme: str = "dirichlet"  # iid | dirichlet | shards | domain | file
    alpha: float = 0.3
    balanced: bool = True
    shards_per_client: int = 2
    min_size: int = 10
    domains_per_client: int = 1
    # scheme domain + balanced: samples of every class per (client, domain); null = the
    # largest size every domain can give (FedCCL's balanced inter-domain setting)
    samples_per_class: Optional[int] = None
    # seeds the split alone (null = the experiment's ``seed``); ``dirichlet`` + ``balanced``
    # with seed 0 is the split the FedRCL authors' trainer computes (their temp_seed(0))
    seed: Optional[int] = None
    # ``scheme: file``: JSON {"<client>": [indices]} or the authors' dict-literal text file
    path: Optional[str] = None
    # project | fedrcl | fedrcl_labels; null = fedrcl for the balanced Dirichlet split (the
    # authors' function as their trainer calls it), project otherwise (see partition.py)
    generator: Optional[str] = None


@dataclass
class ModelConfig:
    """Model from the registry in ``fedrcl_flwr.models`` (e.g. resnet18_gn, cnn5, cnn4)."""

    name: str = "cnn5"
    params: dict = field(default_factory=dict)
    # number of classes; null = from the dataset. Set it for real devices whose local
    # data may not contain every class.
    num_classes: Optional[int] = None
    # initialisation: "model" = the model's own (Kaiming-normal convs for resnet18_gn);
    # "pytorch" = every layer's PyTorch default (the FedRCL authors' ResNet-18)
    init: str = "model"


@dataclass
class StragglerConfig:
    """Stragglers under a simulated clock (``fedrcl_flwr/availability.py``; off while
    ``speed`` is null). ``speed``: each client's speed factor (1 = nominal): a number
    (every client), a list (one per client), ``{distribution: lognormal, sigma: S}``
    (median 1) or ``{distribution: uniform, low: L, high: H}``, drawn once per client
    from the seed. A client's simulated round time is its workload (its local steps over
    the mean client's) divided by its speed, times ``exp(jitter * z)`` with z ~ N(0, 1)
    drawn per (round, client); a client whose time exceeds ``deadline`` (in units of the
    nominal round time; null = no deadline) is late and dropped from the round."""

    speed: Optional[Union[float, list, dict]] = None
    deadline: Optional[float] = None
    jitter: float = 0.0


@dataclass
class AvailabilityConfig:
    """Unreliable clients (``fedrcl_flwr/availability.py``; off by default). ``dropout``:
    the probability that a sampled client does not report in a round: a number (every
    client), a list (one per client), or ``{distribution: uniform, low: L, high: H}`` /
    ``{distribution: beta, a: A, b: B}`` drawn once per client from the seed.
    ``stragglers``: see :class:`StragglerConfig`."""

    dropout: Union[float, list, dict] = 0.0
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)


@dataclass
class FederationConfig:
    """Size of the federation. Give ``participation`` (fraction) or ``clients_per_round``."""

    num_clients: int = 100
    rounds: int = 50
    participation: Optional[float] = 0.05
    clients_per_round: Optional[int] = None
    eval_every: int = 1
    max_consecutive_failed_rounds: int = 3
    # a client that has not answered after this many seconds is dropped from the round
    # (counted in ``failures``); null = wait for every client
    round_timeout_s: Optional[float] = None
    # simulated dropout and stragglers (off by default; see AvailabilityConfig)
    availability: AvailabilityConfig = field(default_factory=AvailabilityConfig)

    def sampled_per_round(self) -> int:
        if self.clients_per_round is not None:
            return self.clients_per_round
        assert self.participation is not None
        return max(1, int(round(self.participation * self.num_clients)))


@dataclass
class ClientConfig:
    """Local objective and local optimisation (identical for every method).

    ``lr`` at round t (1-based) is ``lr * lr_decay ** (t - 1)``; a fresh optimiser is
    built every round: ``optimizer`` sgd (``momentum``, ``nesterov``), adam or adamw
    (``betas``, ``eps``); ``weight_decay`` for all (see ``training.make_optimizer``).
    ``epoch_lr_decay`` decays it further inside the round: local epoch e (0-based) runs at
    ``lr * lr_decay ** (t - 1) * epoch_lr_decay ** e`` (the FedRCL authors use 0.998,
    ``trainer.local_lr_decay``; 1 = off). ``iterations_per_epoch`` (if set) overrides
    ``batch_size`` so that one local epoch is exactly that many steps (the FedRCL authors
    use 10).

    ``amp`` (``off`` | ``bf16`` | ``fp16``, default ``off``): mixed precision of the
    forward pass (``torch.autocast``; the loss terms stay float32; ``fp16`` adds a loss
    scaler and needs CUDA). ``channels_last`` (``auto`` | ``true`` | ``false``): train
    convolutional models in NHWC memory format; ``auto`` = on a CUDA device only, when the
    model's normalisation layers keep NHWC there (see ``fedrcl_flwr.accel``). YAML reads a
    bare ``off`` as false; both mean ``off``.
    """

    method: str = "fedavg"
    params: dict = field(default_factory=dict)
    optimizer: str = "sgd"
    lr: float = 0.1
    lr_decay: float = 0.998
    epoch_lr_decay: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 1e-3
    local_epochs: int = 5
    batch_size: int = 50
    iterations_per_epoch: Optional[int] = None
    grad_clip: Optional[float] = 10.0
    device: str = "auto"  # auto | cpu | cuda
    amp: Union[str, bool] = "off"  # off | bf16 | fp16 (a bare YAML off is false)
    channels_last: Union[str, bool] = "auto"  # auto | true | false

    def __post_init__(self):
        if self.amp is False:  # YAML 1.1 reads `amp: off` as a boolean
            self.amp = "off"


@dataclass
class ServerConfig:
    """Server rule (``strategy``) and its parameters (``params``)."""

    strategy: str = "fedavg"
    weighting: str = "uniform"  # uniform | samples
    params: dict = field(default_factory=dict)
    # signal exchange for FedCCL / FedProto / FPL (see strategies/signal_exchange.py)
    signals: dict = field(default_factory=dict)


@dataclass
class PerClientEvalConfig:
    """Per-client (personalised) evaluation (``fedrcl_flwr/client_eval.py``; off while
    ``every`` is 0). Every ``every`` rounds (and at the last round) the global model is
    evaluated on each sampled client's local test data (``clients: all``: every client),
    after ``finetune_steps`` local cross-entropy steps on the client's training data when
    > 0. Local test data (``local_test``): ``holdout`` = a ``local_test_fraction`` share of
    the client's own partition, split once from the partition seed and removed from its
    training data; ``domain`` = the test samples of the client's own domain(s)
    (``partition.scheme: domain``; training data unchanged); ``auto`` = domain for
    ``partition.scheme: domain``, else holdout."""

    every: int = 0
    local_test_fraction: float = 0.2
    finetune_steps: int = 0
    clients: str = "sampled"  # sampled | all
    local_test: str = "auto"  # auto | holdout | domain


@dataclass
class EvaluationConfig:
    """Centralised evaluation of the global model. EMA_t = ema*EMA_{t-1} + (1-ema)*acc_t."""

    ema: float = 0.9
    target_rounds: list = field(default_factory=list)
    batch_size: int = 500
    representation_every: int = 0  # >0: representation metrics every k rounds
    # the metric the experiment's paper reports (copied into summary.json): final | best |
    # last5 (mean of the last five evaluated rounds, FedCCL) | ema@ROUND (EMA accuracy at
    # a target round, FedRCL)
    report_metric: str = "final"
    # >0: every k rounds each sampled client also measures its LOCAL model right after
    # local training (FedRCL Figs. 2-3) on the test set (up to 2000 samples; clients with
    # their own data: that data); logged as local_repr_* (mean over the round's clients)
    # and local_repr_effective_rank_per_client
    local_representation_every: int = 0
    # FGSM / PGD robust accuracy of the global model (FedCCL Table 8), any method.
    # eps/step are in [0, 1] pixel units (adversarial pixels clamped to [0, 1], the data's
    # normalisation applied inside the attacked model): 8/255, 2/255, 20 steps = PGD-20.
    robust_every: int = 0
    robust_eps: float = 8 / 255
    robust_step: float = 2 / 255
    robust_steps: int = 20
    robust_samples: int = 1000
    # per-client (personalised) evaluation, off by default (see PerClientEvalConfig)
    per_client: PerClientEvalConfig = field(default_factory=PerClientEvalConfig)


@dataclass
class SimulationConfig:
    """Flower simulation resources: per-client CPUs/GPUs and Ray's init caps.

    ``num_supernodes`` (default: the clients sampled per round; at most 10000 and at most
    ``federation.num_clients``) is the number of execution slots
    (:meth:`ExperimentConfig.supernodes`). ``startup_timeout_s``:
    the CLI gives up (exit 1, everything torn down) when the submitted run is still
    ``pending``/``starting`` after this many seconds without a round recorded (Flower
    issue #7953: runs that never leave ``pending``). ``ray_address``: join an existing Ray
    cluster (``HOST:PORT`` of its head, or ``auto`` for the cluster this machine belongs
    to) instead of starting a private local Ray; ``num_cpus`` / ``num_gpus`` are then
    per-client requests against the whole cluster, ``init_num_cpus`` / ``init_num_gpus``
    do not apply, and ``dataset.cache_dir`` must be a path every node sees.
    """

    num_cpus: int = 1
    num_gpus: float = 0.0
    init_num_cpus: Optional[int] = None
    init_num_gpus: Optional[float] = None
    num_supernodes: Optional[int] = None  # default: the clients sampled per round
    startup_timeout_s: float = 300.0
    ray_address: Optional[str] = None


def _ray_address_ok(v) -> bool:
    if v is None or v == "auto":
        return True
    host, sep, port = str(v).rpartition(":")
    return bool(sep) and bool(host) and port.isdigit() and 0 < int(port) < 65536 \
        and not any(c.isspace() for c in str(v))


@dataclass
class OutputConfig:
    """Where results go. ``dir`` is relative to the working directory unless absolute;
    ``{name}`` in it is replaced by the experiment name (the only placeholder: any other
    brace is a literal character). It may not be empty."""

    dir: str = "runs/{name}"
    checkpoint_every: int = 0
    save_model: bool = True
    # TensorBoard event files in <dir>/tensorboard (needs the `tensorboard` extra); an
    # alias of `tensorboard` in `tracker`
    tensorboard: bool = False
    # experiment trackers fed from the records of metrics.jsonl (fedrcl_flwr/tracking.py):
    # any of tensorboard, wandb, mlflow (extras of the same names)
    tracker: list = field(default_factory=list)
    # the W&B project / MLflow experiment the runs go to
    tracker_project: str = "fedrcl-flwr"
    # W&B group / MLflow parent run of the run (a sweep sets its name; null = none)
    tracker_group: Optional[str] = None


@dataclass
class DPConfig:
    """Central differential privacy (``privacy.dp``, see ``fedrcl_flwr/privacy.py``):
    Flower's fixed-clipping wrappers, ``mode`` server (the server clips each update) or
    client (each client clips with Flower's ``fixedclipping_mod``); Gaussian noise of
    std ``noise_multiplier * clipping_norm / clients_per_round`` on the average; ε
    reported at ``delta``."""

    mode: str = "server"
    noise_multiplier: Optional[float] = None
    clipping_norm: Optional[float] = None
    delta: float = 1e-5


@dataclass
class PrivacyConfig:
    """Privacy of the client updates (``fedrcl_flwr/privacy.py``). ``dp``: central DP
    (null = off). ``secagg``: Flower's SecAgg+ (``secaggplus_mod`` + ``SecAggPlusWorkflow``)
    with its parameters ``secagg_num_shares`` / ``secagg_threshold`` (an int: a count; a
    float: a proportion of the sampled clients / of the shares, as in Flower),
    ``secagg_clipping_range`` (model values are clipped to ±range before quantisation) and
    ``secagg_quantization_range`` (quantisation levels) and ``secagg_max_weight`` (the
    largest client weight, null = 1 under uniform weighting, else the largest partition)."""

    dp: Optional[DPConfig] = None
    secagg: bool = False
    secagg_num_shares: Union[int, float] = 1.0
    secagg_threshold: Union[int, float] = 0.5
    secagg_clipping_range: float = 8.0
    secagg_quantization_range: int = 1 << 22
    secagg_max_weight: Optional[float] = None


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    # how `report` and `plot` name this run's row (a sweep sets its variant's label);
    # null = the method and what tells it apart (fedrcl_flwr.tables). Not a setting:
    # runs that differ only by label compute the same thing.
    label: Optional[str] = None
    seed: int = 0
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    # the paper's numbers for this setting (see check_reference): {source, metric, values
    # {method label: percent}, when {dotted key: value}} or a list of such blocks
    reference: Optional[Union[dict, list]] = None

    def supernodes(self) -> int:
        """SuperNodes of a simulation: ``simulation.num_supernodes``, by default the
        clients sampled per round. A SuperNode is an execution slot, not a client: the
        server assigns each sampled partition to one node per round, so more nodes than
        that would never train, and each extra node costs Flower's simulation engine a
        look-up per message it dispatches."""
        return self.simulation.num_supernodes or self.federation.sampled_per_round()

    def output_dir(self) -> Path:
        """``output.dir`` with ``{name}`` replaced by the experiment name (the only
        placeholder; any other brace is a literal character of the path)."""
        return Path(self.output.dir.replace("{name}", self.name)).expanduser()


# --------------------------------------------------------------------------------------
# Rules: the allowed values of each key that has a range or a set of choices, as the
# component parameters declare theirs (fedrcl_flwr.components.Rule; ``bad`` holds values
# tests/test_config.py feeds in). Types are checked from the annotations first; null
# (allowed only where the annotation is Optional) never reaches a rule.
# --------------------------------------------------------------------------------------


def _u32(null: bool = False) -> Rule:
    return Rule(lambda v: 0 <= v < 2**32, "must be in [0, 2**32)" + (" (or null)" if null
                                                                        else ""), (-1, 2**32))


def _label_ok(v: str) -> bool:
    return bool(v.strip()) and v.isprintable() and len(v) <= 80


def _betas_ok(v: list) -> bool:
    return len(v) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                               and 0 <= b < 1 for b in v)


CONFIG_RULES: dict[str, Rule] = {
    "seed": _u32(),
    "label": Rule(_label_ok, "must be one line of printable text, at most 80 characters "
                             "(or null)", ("", "two\nlines", "x" * 81)),
    "dataset.name": one_of(*DATASET_NAMES),
    "dataset.val_fraction": between(0, 1, hi_open=True),
    "dataset.test_fraction": between(0, 1, lo_open=True, hi_open=True),
    "dataset.domains": Rule(lambda v: all(isinstance(d, str) and d for d in v),
                            "must be a list of domain (folder) names", ([""], [3])),
    "dataset.image_size": at_least(8),
    "dataset.rotation": with_text(between(0, 180), "must be in [0, 180] degrees"),
    "dataset.crop_pad": or_null(non_negative()),
    "dataset.pad_fill": Rule(lambda v: v in ("black", "mean"), "must be black or mean",
                             ("white",)),
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
    "partition.generator": Rule(lambda v: v in GENERATORS,
                                f"must be {in_words(GENERATORS)} (or null)", ("authors",)),
    "partition.alpha": positive(),
    "partition.shards_per_client": at_least(1),
    "partition.min_size": non_negative(),
    "partition.domains_per_client": at_least(1),
    "partition.samples_per_class": or_null(at_least(1)),
    "model.num_classes": at_least(2),
    "model.init": Rule(lambda v: v in ("model", "pytorch"), "must be 'model' or 'pytorch'",
                       ("torch",)),
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
    "client.betas": Rule(_betas_ok, "must be two numbers in [0, 1), e.g. [0.9, 0.999]",
                         ([0.9], [0.9, 1.0], [0.9, True])),
    "client.eps": between(0, 1, lo_open=True, hi_open=True),
    "client.lr": positive(),
    "client.lr_decay": between(0, 1, lo_open=True),
    "client.epoch_lr_decay": between(0, 1, lo_open=True),
    "client.momentum": between(0, 1, hi_open=True),
    "client.weight_decay": non_negative(),
    "client.local_epochs": at_least(1),
    "client.batch_size": at_least(1),
    "client.iterations_per_epoch": at_least(1),
    "client.grad_clip": or_null(positive()),
    "client.device": Rule(lambda v: v in ("auto", "cpu", "cuda"), "must be auto, cpu or cuda",
                          ("gpu",)),
    "client.amp": one_of("off", "bf16", "fp16"),
    "client.channels_last": Rule(lambda v: v == "auto" or isinstance(v, bool),
                                 "must be auto, true or false", ("yes",)),
    "server.weighting": Rule(lambda v: v in ("uniform", "samples"),
                             "must be 'uniform' or 'samples'", ("clients",)),
    "evaluation.ema": between(0, 1, hi_open=True),
    "evaluation.target_rounds": Rule(
        lambda v: all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in v),
        "must be a list of positive integers", ([0], [1.5], [True])),
    "evaluation.batch_size": at_least(1),
    "evaluation.representation_every": non_negative(),
    "evaluation.report_metric": Rule(
        is_report_metric,
        f"must be {metric_choices()} (ROUND a target round, e.g. ema@500)",
        ("ema@0", "last10", "client_mean")),
    "evaluation.local_representation_every": non_negative(),
    "evaluation.robust_every": non_negative(),
    "evaluation.robust_eps": with_text(between(0, 1, lo_open=True),
                                       "must be in (0, 1] (pixel units)"),
    "evaluation.robust_step": with_text(between(0, 1, lo_open=True),
                                        "must be in (0, 1] (pixel units)"),
    "evaluation.robust_steps": at_least(1),
    "evaluation.robust_samples": at_least(1),
    "evaluation.per_client.every": with_text(non_negative(), "must be >= 0 (0 = off)"),
    "evaluation.per_client.local_test_fraction": between(0, 1, hi_open=True),
    "evaluation.per_client.finetune_steps": non_negative(),
    "evaluation.per_client.clients": Rule(lambda v: v in PER_CLIENT_CLIENTS,
                                          f"must be {in_words(PER_CLIENT_CLIENTS)}", ("some",)),
    "evaluation.per_client.local_test": one_of(*PER_CLIENT_LOCAL_TESTS),
    "simulation.num_cpus": with_text(at_least(1), "must be a whole number >= 1"),
    "simulation.num_gpus": non_negative(),
    "simulation.init_num_cpus": at_least(1),
    "simulation.init_num_gpus": non_negative(),
    "simulation.num_supernodes": at_least(1),
    "simulation.startup_timeout_s": positive(),
    "simulation.ray_address": Rule(_ray_address_ok, "must be HOST:PORT of a Ray head node or "
                                   "'auto' (or null: a private local Ray)",
                                   ("localhost", "host:0", "host:99999", "a b:1")),
    "output.checkpoint_every": non_negative(),
    "output.tracker_project": Rule(lambda v: bool(v.strip()) and "/" not in v,
                                   "must be a non-empty name without slashes", (" ", "a/b")),
    "output.tracker_group": Rule(lambda v: bool(v.strip()), "must be a non-empty name "
                                                            "(or null)", (" ",)),
    "privacy.dp.mode": Rule(lambda v: v in ("server", "client"), "must be server or client",
                            ("both",)),
    "privacy.dp.noise_multiplier": non_negative(),
    "privacy.dp.clipping_norm": positive(),
    "privacy.dp.delta": between(0, 1, lo_open=True, hi_open=True),
    "privacy.secagg_num_shares": with_text(positive(), "must be > 0 (an int: a count, a "
                                                       "float: a proportion)"),
    "privacy.secagg_threshold": with_text(positive(), "must be > 0 (an int: a count, a "
                                                      "float: a proportion)"),
    "privacy.secagg_clipping_range": positive(),
    "privacy.secagg_quantization_range": at_least(2),
    "privacy.secagg_max_weight": or_null(positive()),
}


# --------------------------------------------------------------------------------------
# Building dataclasses from mappings, with checks
# --------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        null = " or null" if type(None) in typing.get_args(tp) else ""
        return " or ".join(_type_name(a) for a in args) + null
    if origin is not None:
        return origin.__name__
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check ``value`` against annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ConfigError as exc:
                if "finite" in str(exc):
                    raise
        raise ConfigError(
            f"{source}: '{key}' must be {_type_name(tp)}, got {type(value).__name__} "
            f"({value!r})"
        )
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"{source}: '{key}' must be a finite number, got {value!r}")
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        if value is None:
            return {}
    elif tp is list or origin is list:
        if isinstance(value, list):
            return list(value)
    elif dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if isinstance(value, dict):
            return _build(tp, value, key, source)
    else:  # pragma: no cover - schema uses only the types above
        return value
    raise ConfigError(
        f"{source}: '{key}' must be {_type_name(tp)}, got {type(value).__name__} ({value!r})"
    )


def _build(cls: type, data: dict, prefix: str, source: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            where = f"{prefix}.{k}" if prefix else str(k)
            allowed = ", ".join(sorted(names))
            raise ConfigError(f"{source}: unknown key '{where}' (allowed here: {allowed})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            key = f"{prefix}.{f.name}" if prefix else f.name
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], key, source)
    return cls(**kwargs)


def _check_ranges(cfg: ExperimentConfig, source: str) -> None:
    """Every check of a loaded configuration, in order: each key's rule
    (:data:`CONFIG_RULES`), then the checks across keys (:data:`CROSS_CHECKS`). The first
    problem is one :class:`ConfigError` naming the key and ``source``."""
    _check_rules(cfg, source)
    for check in CROSS_CHECKS:
        check(cfg, source)


def _check_rules(cfg: ExperimentConfig, source: str) -> None:
    for key, rule in CONFIG_RULES.items():
        value = _value_at(cfg, key)
        if value is not None and not rule.ok(value):
            raise ConfigError(f"{source}: '{key}' {rule.text}, got {value!r}")


def _value_at(cfg: ExperimentConfig, key: str) -> Any:
    """The value of dotted ``key``; ``None`` below a section that is null
    (``privacy.dp.mode`` without ``privacy.dp``)."""
    obj: Any = cfg
    for part in key.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part)
    return obj


def _check_federation_size(cfg: ExperimentConfig, source: str) -> None:
    fed = cfg.federation
    if fed.participation is None and fed.clients_per_round is None:
        raise ConfigError(
            f"{source}: set one of 'federation.participation' or "
            "'federation.clients_per_round'"
        )
    if fed.clients_per_round is not None and fed.clients_per_round > fed.num_clients:
        raise ConfigError(
            f"{source}: 'federation.clients_per_round' ({fed.clients_per_round}) exceeds "
            f"'federation.num_clients' ({fed.num_clients})"
        )
    if cfg.dataset.name == "synthetic" and fed.num_clients > cfg.dataset.synthetic.num_train:
        raise ConfigError(
            f"{source}: 'federation.num_clients' ({fed.num_clients}) exceeds "
            f"'dataset.synthetic.num_train' ({cfg.dataset.synthetic.num_train}): every "
            "client needs at least one sample")


def _check_report_metric(cfg: ExperimentConfig, source: str) -> None:
    rm = cfg.evaluation.report_metric
    target = ema_round(rm)
    if target is not None and target not in cfg.evaluation.target_rounds:
        raise ConfigError(f"{source}: 'evaluation.report_metric' {rm} needs {target} in "
                          f"'evaluation.target_rounds' (got {cfg.evaluation.target_rounds})")


def _check_local_optimiser(cfg: ExperimentConfig, source: str) -> None:
    if cfg.client.nesterov and (cfg.client.optimizer != "sgd" or cfg.client.momentum <= 0):
        raise ConfigError(f"{source}: 'client.nesterov' needs client.optimizer sgd and "
                          f"'client.momentum' > 0 (got {cfg.client.optimizer}, momentum "
                          f"{cfg.client.momentum})")
    if cfg.client.amp == "fp16" and cfg.client.device == "cpu":
        raise ConfigError(f"{source}: 'client.amp' fp16 needs a CUDA device (client.device "
                          "is cpu); use bf16 or off")


def _check_data_and_split(cfg: ExperimentConfig, source: str) -> None:
    """What the dataset and the partition scheme need of each other."""
    if cfg.dataset.name == "npz" and not cfg.dataset.path:
        raise ConfigError(f"{source}: 'dataset.path' is required when dataset.name is npz")
    check_normalize(cfg.dataset, source)
    _check_generator(cfg.partition, source)
    if cfg.partition.scheme == "file" and not cfg.partition.path:
        raise ConfigError(f"{source}: 'partition.path' is required when partition.scheme is "
                          "file (a JSON or the authors' dict-literal split file)")
    if cfg.partition.scheme == "domain":
        ds = cfg.dataset
        if ds.name == "synthetic" and ds.synthetic.num_domains < 2:
            raise ConfigError(
                f"{source}: 'partition.scheme' domain needs "
                "'dataset.synthetic.num_domains' >= 2"
            )
        if ds.name == "imagefolder" and len(ds.domains) < 2:
            raise ConfigError(f"{source}: 'partition.scheme' domain on an image folder needs "
                              "'dataset.domains' (two or more domain sub-folders)")
        if ds.name not in DOMAIN_DATASETS:
            raise ConfigError(f"{source}: 'partition.scheme' domain needs a dataset with "
                              f"domains (synthetic, digit5, imagefolder, npz with d_train), "
                              f"not {ds.name!r}")


def _check_reference(cfg: ExperimentConfig, source: str) -> None:
    check_reference(cfg.reference, source)


def _check_feature_sections(cfg: ExperimentConfig, source: str) -> None:
    """The sections of optional features, each checked by the module that implements it
    (per-client evaluation, unreliable clients, trackers, privacy), and the extras they
    need installed (:mod:`fedrcl_flwr.extras`)."""
    from fedrcl_flwr import availability, client_eval
    from fedrcl_flwr.extras import installed, pip_install
    from fedrcl_flwr.privacy import check_privacy_section
    from fedrcl_flwr.tracking import check_trackers

    client_eval.check_config(cfg, source)
    availability.check_config(cfg, source)
    if cfg.output.tensorboard and not installed("tensorboard"):
        raise ConfigError(f"{source}: 'output.tensorboard' is true but the tensorboard "
                          f"package is not installed ({pip_install('tensorboard')}, or set "
                          "it to false)")
    check_trackers(cfg, source)
    check_privacy_section(cfg, source)


def _check_names_and_paths(cfg: ExperimentConfig, source: str) -> None:
    why = name_problem(cfg.name)
    if why:
        raise ConfigError(f"{source}: 'name' {why} (it names the run's directory), got "
                          f"{_shorten(cfg.name)}")
    if not cfg.output.dir.strip() or "\0" in cfg.output.dir:
        raise ConfigError(f"{source}: 'output.dir' must be a directory path, got "
                          f"{cfg.output.dir!r}")


def _check_supernodes(cfg: ExperimentConfig, source: str) -> None:
    fed = cfg.federation
    nodes = cfg.supernodes()
    if nodes > MAX_SUPERNODES:
        raise ConfigError(
            f"{source}: {nodes} SuperNodes ('simulation.num_supernodes', default the "
            f"clients sampled per round) is more than {MAX_SUPERNODES}; SuperNodes are "
            "execution slots, not clients: set simulation.num_supernodes to a few hundred "
            "at most")
    if cfg.simulation.num_supernodes and cfg.simulation.num_supernodes > fed.num_clients:
        raise ConfigError(
            f"{source}: 'simulation.num_supernodes' ({cfg.simulation.num_supernodes}) exceeds "
            f"'federation.num_clients' ({fed.num_clients}); extra SuperNodes would never train")


def dataset_channels(d: DatasetConfig) -> Optional[int]:
    """Channels of the dataset's images, where the config decides it."""
    if d.name == "synthetic":
        return int(d.synthetic.channels)
    info = DATASETS.get(d.name)
    return info.channels if info is not None else None


def normalize_constants(value: Any, where: str, channels: Optional[int]) -> Optional[tuple]:
    """``(mean, std)`` of an explicit ``dataset.normalize`` mapping (``None`` for
    true / false), checked: exactly the keys ``mean`` and ``std``, each a list of
    ``channels`` finite numbers (any common length when ``channels`` is None), mean in
    [0, 1], std > 0. A problem is one :class:`ConfigError` naming the key and ``where``."""
    if isinstance(value, bool):
        return None
    key = "dataset.normalize"
    if not isinstance(value, dict) or set(value) != {"mean", "std"}:
        got = sorted(map(str, value)) if isinstance(value, dict) else repr(value)
        raise ConfigError(f"{where}: '{key}' must be true, false or {{mean: [...], std: "
                          f"[...]}} (one value per channel), got {got}")
    out = []
    for part in ("mean", "std"):
        v = value[part]
        ok = isinstance(v, list) and len(v) > 0 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for x in v)
        if not ok:
            raise ConfigError(f"{where}: '{key}.{part}' must be a list of numbers, one per "
                              f"channel, got {v!r}")
        if channels is not None and len(v) != channels:
            raise ConfigError(f"{where}: '{key}.{part}' has {len(v)} values but the images "
                              f"have {channels} channel(s), got {v!r}")
        out.append([float(x) for x in v])
    mean, std = out
    if len(mean) != len(std):
        raise ConfigError(f"{where}: '{key}.mean' has {len(mean)} values and '{key}.std' "
                          f"{len(std)}: give one of each per channel")
    if not all(0.0 <= m <= 1.0 for m in mean):
        raise ConfigError(f"{where}: '{key}.mean' must be in [0, 1] (pixel units), got {mean}")
    if not all(s > 0 for s in std):
        raise ConfigError(f"{where}: '{key}.std' must be > 0, got {std}")
    return mean, std


def check_normalize(d: DatasetConfig, source: str) -> None:
    normalize_constants(d.normalize, source, dataset_channels(d))


def _check_generator(p: PartitionConfig, source: str) -> None:
    from fedrcl_flwr.data.partition import PartitionError, resolve_generator

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
            raise ConfigError(f"{source}: '{where}' must be a mapping with source, metric, "
                              "values")
        for k in b:
            if k not in REFERENCE_KEYS:
                raise ConfigError(f"{source}: unknown key '{where}.{k}' (allowed here: "
                                  f"{', '.join(REFERENCE_KEYS)})")
        if not isinstance(b.get("source"), str) or not b["source"]:
            raise ConfigError(f"{source}: '{where}.source' must name the paper's table")
        if not is_report_metric(b.get("metric")):
            raise ConfigError(f"{source}: '{where}.metric' must be {metric_choices()}, got "
                              f"{b.get('metric')!r}")
        vals = b.get("values")
        if not isinstance(vals, dict) or not vals:
            raise ConfigError(f"{source}: '{where}.values' must map method labels to the "
                              "paper's accuracy in percent")
        for k, v in vals.items():
            if not isinstance(k, str) or not (
                    v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and 0 <= v <= 100)):
                raise ConfigError(f"{source}: '{where}.values.{k}' must be a percentage in "
                                  f"[0, 100] (or null), got {v!r}")
        when = b.get("when", {})
        if not isinstance(when, dict) or not all(isinstance(k, str) for k in when):
            raise ConfigError(f"{source}: '{where}.when' must map dotted config keys to "
                              "values")
    return blocks


def _check_registries(cfg: ExperimentConfig, source: str) -> None:
    """The model name; ``client.method`` / ``server.strategy`` and their parameters are
    checked by ``fedrcl_flwr.app.validate.validate_components`` (it imports the method's
    Flower client, which this module must not)."""
    from fedrcl_flwr.models import MODEL_NAMES

    if cfg.model.name not in MODEL_NAMES:
        raise ConfigError(
            f"{source}: 'model.name' must be one of {', '.join(sorted(MODEL_NAMES))}, "
            f"got {cfg.model.name!r}"
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


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def get_key(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` (value as a YAML scalar/list) into ``(key, value)``."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    value = parse_yaml(raw, f"override '{text}'") if raw.strip() != "" else ""
    return key, value


def apply_overrides(data: dict, overrides: list[str] | list[tuple[str, Any]]) -> dict:
    """Apply dotted overrides to a raw mapping (before validation)."""
    data = _deepcopy(data)
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override '{key}': '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d


def config_from_dict(data: dict, source: str = "<config>") -> ExperimentConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections")
    cfg = _build(ExperimentConfig, data, "", source)
    _check_ranges(cfg, source)
    return cfg


def read_text_file(path: Path, limit: int, what: str, *, label: Optional[str] = None,
                   error: type = ConfigError) -> str:
    """The project's one reader of text files it is given (experiments, sweeps, run
    files, split files): a regular file (not a directory, device or FIFO) of at most
    ``limit`` bytes — checked before reading — decoded as UTF-8. Any problem is one
    ``error`` (a :class:`ConfigError`) starting with ``label`` (default: the path);
    ``what`` names the kind of file in the size message."""
    path = Path(path)
    label = str(path) if label is None else label
    try:
        if not path.is_file():
            raise error(f"{label}: not a regular file" if path.exists()
                        else f"{label}: no such file")
        size = path.stat().st_size
        if size > limit:
            raise error(f"{label}: {size} bytes is too large for {what} (at most {limit} "
                        "bytes)")
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{label}: cannot read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise error(f"{label}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at line "
                    f"{line}); save the file as UTF-8") from None


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file not found: {path}")
    text = read_text_file(path, MAX_YAML_BYTES, "an experiment file")
    data = parse_yaml(text, str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override and validate an experiment YAML file."""
    data = read_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides)
        source = f"{path} (with overrides)"
    else:
        source = str(path)
    return config_from_dict(data, source)


def to_dict(cfg: ExperimentConfig) -> dict:
    return dataclasses.asdict(cfg)


# What ``run --resume`` may change (dotted keys; a section name covers its keys): how
# long the run goes on, how often it evaluates, checkpoints and reports, and where and
# with what resources it runs. Anything else — method and its params, strategy, data,
# partition, model, seed, local optimisation, EMA, attack settings, name — would make the
# records after the resume those of another experiment, so it is refused.
RESUME_MAY_CHANGE = (
    "federation.rounds",                    # not below the rounds already done
    "federation.eval_every",
    "federation.round_timeout_s",
    "federation.max_consecutive_failed_rounds",
    "evaluation.batch_size",
    "evaluation.representation_every",
    "evaluation.local_representation_every",
    "evaluation.robust_every",
    "evaluation.target_rounds",
    "evaluation.report_metric",
    "output",                               # dir (always the run's), checkpoints, model, TB
    "simulation",                           # resources: CPUs, GPUs, SuperNodes, Ray
    "client.device",
    "dataset.cache_dir",
    "dataset.download",
    "reference",                            # the paper's numbers (reporting only)
    "label",                                # the report's row name (reporting only)
)


def changed_keys(old: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    """Dotted keys whose resolved value differs between two configurations."""
    from fedrcl_flwr.tables import flatten_keys

    a, b = flatten_keys(to_dict(old)), flatten_keys(to_dict(new))
    missing = object()
    return sorted(k for k in set(a) | set(b) if a.get(k, missing) != b.get(k, missing))


def resume_refusals(old: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    """The changed keys that ``run --resume`` refuses (not in :data:`RESUME_MAY_CHANGE`)."""
    return [k for k in changed_keys(old, new)
            if not any(k == p or k.startswith(p + ".") for p in RESUME_MAY_CHANGE)]


def dump_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the resolved config (after defaults and overrides) as YAML."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
