"""The experiment schema: one dataclass per YAML section, with its defaults.

An experiment is one YAML file whose top-level sections map onto these dataclasses
(:class:`ExperimentConfig` is the whole file). Types come from the annotations and are
checked on load (:mod:`fedrcl_flwr.config.loading`); allowed values are the rules of
:mod:`fedrcl_flwr.config.rules` and the cross-checks of :mod:`fedrcl_flwr.config.checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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
    tinyimagenet | imagefolder | digit5 | npz | hf_disk. ``root`` is where torchvision
    datasets / image folders live; ``path`` is the ``.npz`` file for ``npz``, the
    directory a Hugging Face ``DatasetDict`` (splits ``train``, ``test``) was saved to with
    ``save_to_disk`` for ``hf_disk`` (``image_column`` / ``label_column`` name its columns,
    null = detected; ``fedrcl_flwr/data/sources/hf.py``); ``download`` lets
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
      channel (mean in [0, 1], std >= 1e-3), as the authors' ``Normalize`` (FedRCL:
      ``datasets/configs.yaml``).
    """

    name: str = "synthetic"
    root: str = "~/data"
    path: str | None = None
    download: bool = False
    augment: bool = True
    rotation: float = 0.0
    crop_pad: int | None = None
    flip: bool | None = None
    pad_fill: str = "mean"  # black | mean
    normalize: bool | dict = True  # true | false | {mean: [...], std: [...]}
    image_size: int | None = None
    val_fraction: float = 0.0
    domains: list = field(default_factory=list)
    test_fraction: float = 0.2
    # random (a seeded test_fraction of each class) | rethinkfl (RethinkFL's Office-Caltech
    # rule: image i of a domain folder, ImageFolder order, is a test image iff i % 10 > 7)
    test_split: str = "random"
    verify_md5: bool = True
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # where prepared arrays are kept (fedrcl_flwr/data/cache/); null = $FEDRCL_FLWR_CACHE_DIR,
    # else $XDG_CACHE_HOME/fedrcl-flwr or ~/.cache/fedrcl-flwr. Must be the same path on
    # every node of a Ray cluster (a shared filesystem).
    cache_dir: str | None = None
    # hf_disk: the image and label columns of the saved DatasetDict (null = detected)
    image_column: str | None = None
    label_column: str | None = None
    # hf_disk: the column naming each image's domain (a ClassLabel, strings or ints; null =
    # one domain): what partition.scheme domain splits by and evaluation reports per domain
    domain_column: str | None = None


@dataclass
class PartitionConfig:
    """How the training set is split over clients (see ``fedrcl_flwr.data.partition``)."""

    # iid | dirichlet | shards | domain | pathological | flwr_datasets | file
    scheme: str = "dirichlet"
    alpha: float = 0.3
    balanced: bool = True
    shards_per_client: int = 2
    min_size: int = 10
    domains_per_client: int = 1
    # scheme domain + balanced: samples of every class per (client, domain); null = the
    # largest size every domain can give (FedCCL's balanced inter-domain setting)
    samples_per_class: int | None = None
    # seeds the split alone (null = the experiment's ``seed``); ``dirichlet`` + ``balanced``
    # with seed 0 is the split the FedRCL authors' trainer computes (their temp_seed(0))
    seed: int | None = None
    # ``scheme: file``: JSON {"<client>": [indices]} or the authors' dict-literal text file
    path: str | None = None
    # project | fedrcl | fedrcl_labels | feduv (FedUV's partition_data: iid, unbalanced
    # dirichlet) | rethinkfl_digits | rethinkfl_office; null = fedrcl
    # for the balanced Dirichlet split (the authors' function as their trainer calls it),
    # project otherwise (see partition.py)
    generator: str | None = None
    # rethinkfl_* only: the share of its domain's training set each client draws (their
    # percent_dict), a number or one per dataset.domains entry; null = theirs (Digits
    # 0.01, Office-Caltech 0.2)
    domain_fraction: float | list | None = None
    # scheme pathological: classes per client (k)
    classes_per_client: int = 2
    # scheme flwr_datasets: {name: <flwr_datasets.partitioner class>, <its arguments>}
    # (fedrcl_flwr/config/partitioners.py)
    partitioner: dict | None = None


@dataclass
class ModelConfig:
    """Model from the registry in ``fedrcl_flwr.models`` (e.g. resnet18_gn, cnn5, cnn4)."""

    name: str = "cnn5"
    params: dict = field(default_factory=dict)
    # number of classes; null = from the dataset. Set it for real devices whose local
    # data may not contain every class.
    num_classes: int | None = None
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

    speed: float | list | dict | None = None
    deadline: float | None = None
    jitter: float = 0.0


@dataclass
class AvailabilityConfig:
    """Unreliable clients (``fedrcl_flwr/availability.py``; off by default). ``dropout``:
    the probability that a sampled client does not report in a round: a number (every
    client), a list (one per client), or ``{distribution: uniform, low: L, high: H}`` /
    ``{distribution: beta, a: A, b: B}`` drawn once per client from the seed.
    ``stragglers``: see :class:`StragglerConfig`."""

    dropout: float | list | dict = 0.0
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)


@dataclass
class FederationConfig:
    """Size of the federation. Give ``participation`` (fraction) or ``clients_per_round``."""

    num_clients: int = 100
    rounds: int = 50
    participation: float | None = 0.05
    clients_per_round: int | None = None
    eval_every: int = 1
    max_consecutive_failed_rounds: int = 3
    # a client that has not answered after this many seconds is dropped from the round
    # (counted in ``failures``); null = wait for every client
    round_timeout_s: float | None = None
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
    # exponential: lr * lr_decay ** (t - 1); cosine: lr * (1 + cos(pi (t - 1) / T)) / 2,
    # T = federation.rounds (FedUV's CosineAnnealingLR over the rounds; lr_decay must be 1)
    lr_schedule: str = "exponential"
    epoch_lr_decay: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 1e-3
    local_epochs: int = 5
    batch_size: int = 50
    iterations_per_epoch: int | None = None
    # drop each local epoch's last, incomplete batch (FedUV's DataLoader(drop_last=True));
    # false: keep it, joining a last batch of one sample to the one before for a model
    # with BatchNorm (training.last_batch_rule)
    drop_last: bool = False
    grad_clip: float | None = 10.0
    device: str = "auto"  # auto | cpu | cuda
    amp: str | bool = "off"  # off | bf16 | fp16 (a bare YAML off is false)
    channels_last: str | bool = "auto"  # auto | true | false

    def __post_init__(self) -> None:
        if self.amp is False:  # YAML 1.1 reads `amp: off` as a boolean
            self.amp = "off"


@dataclass
class ServerConfig:
    """Server rule (``strategy``) and its parameters (``params``)."""

    strategy: str = "fedavg"
    weighting: str = "uniform"  # uniform | samples
    # the average's arithmetic: float64 | float32 (the authors' state_dict loop)
    average_dtype: str = "float64"
    params: dict = field(default_factory=dict)
    # signal exchange for FedCCL / FedProto / FPL (see fedrcl_flwr/server/signal_exchange.py)
    signals: dict = field(default_factory=dict)


@dataclass
class PerClientEvalConfig:
    """Per-client (personalised) evaluation (``fedrcl_flwr/client_eval.py``; off while
    ``every`` is 0). Every ``every`` rounds (and at the last round) the global model is
    evaluated on each sampled client's local test data (``clients: unsampled``: as many
    clients not sampled in the round, an unbiased measure; ``clients: all``: every client),
    after ``finetune_steps`` local cross-entropy steps on the client's training data when
    > 0. Local test data (``local_test``): ``holdout`` = a ``local_test_fraction`` share of
    the client's own partition, split once from the partition seed and removed from its
    training data; ``domain`` = the test samples of the client's own domain(s)
    (``partition.scheme: domain``; training data unchanged); ``auto`` = domain for
    ``partition.scheme: domain``, else holdout."""

    every: int = 0
    local_test_fraction: float = 0.2
    finetune_steps: int = 0
    clients: str = "sampled"  # sampled | unsampled (unbiased) | all
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
    ``pending``/``starting`` after this many seconds without a round recorded
    (Flower issue #7953: runs that never leave ``pending``). ``ray_address``: join an existing Ray
    cluster (``HOST:PORT`` of its head; ``auto`` is refused: it could join another user's
    Ray on this machine) instead of starting a private local Ray; ``num_cpus`` / ``num_gpus`` are then
    per-client requests against the whole cluster, ``init_num_cpus`` / ``init_num_gpus``
    do not apply, and ``dataset.cache_dir`` must be a path every node sees.
    ``transport``: ``shared`` (weights by reference to the run's store in ``/dev/shm``;
    Flower's messages where that cannot work: see ``docs/performance.md``) or ``flower``.
    """

    num_cpus: int = 1
    num_gpus: float = 0.0
    init_num_cpus: int | None = None
    init_num_gpus: float | None = None
    num_supernodes: int | None = None  # default: the clients sampled per round
    startup_timeout_s: float = 300.0
    ray_address: str | None = None
    # how weights travel in a simulation (fedrcl_flwr/app/wire/transport.py): by
    # reference to a store in shared memory (shared) or inside Flower's messages (flower)
    transport: str = "shared"


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
    # experiment trackers fed from the records of metrics.jsonl (fedrcl_flwr/tracking/):
    # any of tensorboard, wandb, mlflow (extras of the same names)
    tracker: list = field(default_factory=list)
    # the W&B project / MLflow experiment the runs go to
    tracker_project: str = "fedrcl-flwr"
    # W&B group / MLflow parent run of the run (a sweep sets its name; null = none)
    tracker_group: str | None = None
    # the deadline (seconds) of every call to a tracker (start, each round, the end): a
    # tracker that does not answer in time, or fails, is dropped and the run goes on
    tracker_timeout_s: float = 30.0


@dataclass
class DPConfig:
    """Central differential privacy (``privacy.dp``, see ``fedrcl_flwr/privacy.py``):
    Flower's fixed-clipping wrappers, ``mode`` server (the server clips each update) or
    client (each client clips with Flower's ``fixedclipping_mod``); Gaussian noise of
    std ``noise_multiplier * clipping_norm / clients_per_round`` on the average; ε
    reported at ``delta``."""

    mode: str = "server"
    noise_multiplier: float | None = None
    clipping_norm: float | None = None
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

    dp: DPConfig | None = None
    secagg: bool = False
    secagg_num_shares: int | float = 1.0
    secagg_threshold: int | float = 0.5
    secagg_clipping_range: float = 8.0
    secagg_quantization_range: int = 1 << 22
    secagg_max_weight: float | None = None


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    # how `report` and `plot` name this run's row (a sweep sets its variant's label);
    # null = the method and what tells it apart (fedrcl_flwr.report.grouping). Not a setting:
    # runs that differ only by label compute the same thing.
    label: str | None = None
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
    reference: dict | list | None = None

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
