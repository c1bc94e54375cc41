"""Per-process building blocks shared by the server and the clients (no Flower here).

A Ray worker (or a SuperNode's ClientApp process) loads the dataset and computes the
partition once and keeps them for every round and every virtual client it serves; clients
only hold index arrays into the one shared training set. Models are built once per process
and re-loaded with the global weights each round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.config.catalog import dataset_info
from fedrcl_flwr.models import build_model


def _key(obj) -> str:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    return json.dumps(obj, sort_keys=True, default=str)


class WorkerCache:
    """Everything a process keeps between the messages (and runs) it serves, in one
    object: a Ray actor, a SuperNode's ClientApp process, the ServerApp, the CLI and a test
    each hold :data:`WORKER`. Cleared with :meth:`clear` (or only the datasets with
    :meth:`clear_datasets`); nothing else in the project holds process-wide state of its
    own.

    * ``prepared``: the dataset cache entry the CLI prepared, per (dataset, seed)
      (:func:`use_prepared_dataset`: this process only opens it);
    * ``datasets`` and ``partitions``: the opened datasets and their client index arrays
      (the 4 latest of each, keyed by the dataset / partition sections as JSON);
    * ``configs``: the experiments read from Flower run configs (``fedrcl_flwr.app``),
      the 4 latest, keyed by the file's content;
    * ``probes``: models built for checks before a run (:func:`probe_model`);
    * ``node``: the name of this machine / Ray node in client records;
    * ``models``: the model pool (:func:`worker_model`) of one model configuration;
    * ``device_data``: a real device's own training data, per ``data-path``.
    """

    MAX_ENTRIES = 4

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        """Forget everything (the next message rebuilds what it needs)."""
        with self._lock:
            self.prepared: dict = {}
            self.configs: OrderedDict = OrderedDict()
            self.probes: OrderedDict = OrderedDict()
            self.node: str | None = None
            self.models: tuple = (None, {})  # (model key, {slot: model})
            self.device_data: dict = {}
            self.clear_datasets()

    def clear_datasets(self) -> None:
        """Forget the opened datasets and partitions (one dataset in memory at a time)."""
        with self._lock:
            self.datasets: OrderedDict = OrderedDict()
            self.partitions: OrderedDict = OrderedDict()

    def get(self, store: str, key, build):
        """``store[key]``, built by ``build()`` on a miss; the stores of datasets,
        partitions, probes and configs keep their :attr:`MAX_ENTRIES` latest entries."""
        with self._lock:
            table = getattr(self, store)
            if key in table:
                if isinstance(table, OrderedDict):
                    table.move_to_end(key)
                return table[key]
            value = build()
            table[key] = value
            if isinstance(table, OrderedDict) and len(table) > self.MAX_ENTRIES:
                table.popitem(last=False)
            return value


WORKER = WorkerCache()  # this process's


def use_prepared_dataset(cfg: ExperimentConfig, entry: str) -> None:
    """Declare that this process's dataset is the cache entry ``entry`` prepared by the
    CLI before the run (``fedrcl_flwr.data.cache``): :func:`load_bundle` then opens it and
    never builds the dataset; an absent or corrupt entry is one
    :class:`~fedrcl_flwr.data.sources.raw.DatasetError` naming the host. Called by the
    ServerApp and the ClientApp when the run config carries ``dataset-cache``."""
    WORKER.prepared[(_key(cfg.dataset), cfg.seed)] = str(entry)


def prepare_dataset(cfg: ExperimentConfig, note=None):
    """Build (or check) the dataset's cache entry; returns its path. The CLI's step
    before any Flower process; ``note`` hears why an existing entry was rebuilt."""
    from fedrcl_flwr.data.cache import store

    bundle, entry = store.load(cfg.dataset, cfg.seed, note=note)
    WORKER.clear_datasets()
    return entry


def _open_dataset(dataset_key: str, seed: int):
    """(bundle, cache entry) of a dataset section given as JSON."""
    from fedrcl_flwr.config import DatasetConfig, SyntheticConfig
    from fedrcl_flwr.data.cache import store
    from fedrcl_flwr.data.cache.entries import open_prepared

    fields = json.loads(dataset_key)  # the (already validated) dataset section
    d = DatasetConfig(**{**fields, "synthetic": SyntheticConfig(**fields["synthetic"])})
    prepared = WORKER.prepared.get((dataset_key, seed))
    if prepared is not None:
        return open_prepared(prepared, d), Path(prepared)
    return store.load(d, seed)


def _dataset(cfg: ExperimentConfig):
    key = _key(cfg.dataset)
    return WORKER.get("datasets", (key, cfg.seed), lambda: _open_dataset(key, cfg.seed))


def load_bundle(cfg: ExperimentConfig):
    """The experiment's dataset, from the dataset cache (``fedrcl_flwr.data.cache``:
    memory-mapped, built on first use unless :func:`use_prepared_dataset` said it was
    prepared), kept per process."""
    return _dataset(cfg)[0]


def client_partitions(cfg: ExperimentConfig) -> list:
    """Index arrays of every client: computed once and stored beside the dataset's cache
    entry (:func:`fedrcl_flwr.data.cache.splits.load_partition`), so that the CLI's check and
    every process of the run after it only read them; kept per process."""
    dataset_key, partition_key = _key(cfg.dataset), _key(cfg.partition)
    key = (dataset_key, partition_key, cfg.federation.num_clients, cfg.seed)
    return WORKER.get("partitions", key, lambda: _partition(cfg, *key))


def _partition(
    cfg: ExperimentConfig, dataset_key: str, partition_key: str, num_clients: int, seed: int
) -> list:
    from fedrcl_flwr.data.cache import splits
    from fedrcl_flwr.data.partition import partition

    bundle, entry = _dataset(cfg)
    p = json.loads(partition_key)

    def compute():
        return partition(
            bundle.train_labels,
            num_clients,
            p["scheme"],
            alpha=p["alpha"],
            balanced=p["balanced"],
            shards_per_client=p["shards_per_client"],
            min_size=p["min_size"],
            domains=bundle.train_domains,
            domains_per_client=p["domains_per_client"],
            samples_per_class=p.get("samples_per_class"),
            seed=seed if p["seed"] is None else p["seed"],
            path=p["path"],
            generator=p.get("generator"),
            num_classes=bundle.num_classes,
            domain_fraction=p.get("domain_fraction"),
            classes_per_client=p.get("classes_per_client", 2),
            partitioner=p.get("partitioner"),
        )

    if p["path"]:  # a split file: read, nothing drawn
        return compute()
    settings: list = [dataset_key, partition_key, num_clients, seed]
    if p["scheme"] == "flwr_datasets":  # Flower's draws: its version decides the split
        import hashlib
        from importlib.metadata import version

        from fedrcl_flwr.config import partitioners
        from fedrcl_flwr.data.sources import hf

        code = b"".join(Path(str(m.__file__)).read_bytes() for m in (hf, partitioners))
        settings.append([version("flwr-datasets"), hashlib.sha256(code).hexdigest()])
    return splits.load_partition(entry, settings, num_clients, compute)


def set_node_name(name: str) -> None:
    """Name this process's machine / cluster node in client records (the ClientApp sets
    the Ray node when it runs on a multi-node Ray cluster)."""
    WORKER.node = str(name)


def node_name() -> str:
    """Where this process runs: the name :func:`set_node_name` gave, else the host name.
    Clients report it with every result; the server counts them per round
    (``client_nodes`` in ``metrics.jsonl``)."""
    if WORKER.node is None:
        import socket

        WORKER.node = socket.gethostname()
    return WORKER.node


def pick_device(name: str = "auto") -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("client.device is 'cuda' but no CUDA device is visible")
        return torch.device("cuda")
    return torch.device("cpu")


def new_model(cfg: ExperimentConfig, bundle) -> nn.Module:
    model = build_model(
        cfg.model.name,
        num_classes=cfg.model.num_classes or bundle.num_classes,
        in_channels=bundle.in_channels,
        image_size=bundle.image_size,
        params=cfg.model.params,
    )
    if cfg.model.init == "pytorch":
        from fedrcl_flwr.models import reset_to_pytorch_default

        reset_to_pytorch_default(model)
    return model


def check_model(cfg: ExperimentConfig, bundle=None) -> None:
    """The configured model can be built: ``model.params`` keys the model takes, a known
    backbone, a readable backbone weights file that fits. A
    :class:`~fedrcl_flwr.config.ConfigError` otherwise — found by the CLI before any
    Flower process starts rather than by every ServerApp/ClientApp. ``bundle`` gives the
    dataset's real shapes (the ``run`` command); without it the nominal shapes of
    :func:`probe_model` are used (the sweep's up-front check, cached per model)."""
    from fedrcl_flwr.errors import ConfigError

    if bundle is not None:
        try:
            with torch.random.fork_rng(devices=[]):
                new_model(cfg, bundle)
            return
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"model {cfg.model.name!r}: {exc}") from None
    problem = _probe(cfg)[1]
    if isinstance(problem, (ValueError, TypeError)):  # what new_model raises for bad input
        raise ConfigError(f"model {cfg.model.name!r}: {problem}")


def probe_model(cfg: ExperimentConfig) -> nn.Module | None:
    """The configured model at nominal input shapes, built without loading data, for
    checks before a run (its feature taps, its blocks); ``None`` when it cannot be built
    (a missing weights file, ...: reported where the model is really built). Its
    ``probe_input_shape`` is the (C, H, W) of one input it accepts. Cached per process:
    treat it as read-only."""
    return _probe(cfg)[0]


def _probe(cfg: ExperimentConfig):
    d = cfg.dataset
    synth = dataset_info(d.name).generated
    channels = d.synthetic.channels if synth else 3
    size = d.image_size or (d.synthetic.image_size if synth else 32)
    classes = cfg.model.num_classes or (d.synthetic.num_classes if synth else 10)
    key = (cfg.model.name, _key(cfg.model.params), classes, channels, size)
    return WORKER.get("probes", key, lambda: _build_probe(*key))


def _build_probe(name: str, params_key: str, classes: int, channels: int, size: int):
    """``(model, None)``, or ``(None, the exception that stopped it)``."""
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(
                name,
                num_classes=classes,
                in_channels=channels,
                image_size=size,
                params=json.loads(params_key),
            )
    except Exception as exc:  # noqa: BLE001 - see probe_model
        return None, exc
    # a plain attribute; nn.Module.__getattr__'s declared type (Tensor | Module) is not it
    model.probe_input_shape = (channels, size, size)  # type: ignore[assignment]
    return model.eval(), None


def initial_model(cfg: ExperimentConfig, bundle) -> nn.Module:
    """The round-0 global model, initialised deterministically from ``cfg.seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return new_model(cfg, bundle)


def worker_model(
    cfg: ExperimentConfig, bundle, device: torch.device, slot: str = "local"
) -> nn.Module:
    """One model instance per ``slot`` and process, re-used by every virtual client it
    serves: ``local`` is the model a client trains; other slots are second instances
    (the frozen global / previous models of FedNTD, FitNet, MOON, FedMLB; see
    ``FederatedClient.frozen_model``), so a process holds one model per slot whatever the
    number of clients. Building one does not consume the caller's RNG (a client's
    randomness must not depend on whether its process had built the model already)."""
    key = (
        cfg.model.name,
        _key(cfg.model.params),
        cfg.model.num_classes,
        bundle.num_classes,
        bundle.in_channels,
        bundle.image_size,
        str(device),
    )
    with WORKER._lock:
        if WORKER.models[0] != key:  # a new configuration empties the pool
            WORKER.models = (key, {})
        slots = WORKER.models[1]
        if slot not in slots:
            with torch.random.fork_rng(devices=[]):
                slots[slot] = new_model(cfg, bundle).to(device)
        return slots[slot]


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """All state_dict entries (parameters and buffers) in a fixed order, as NumPy copies."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def weight_views(model: nn.Module) -> list[np.ndarray]:
    """:func:`get_weights` without the copy: read-only NumPy views of the model's
    tensors (on a GPU, the one copy to the host), valid until the model changes."""
    out = []
    for v in model.state_dict().values():
        a = v.detach().cpu().numpy()
        a.flags.writeable = False
        out.append(a)
    return out


def constant_tensor(array, **kwargs) -> torch.Tensor:
    """``torch.as_tensor(array, **kwargs)`` of an array that may be a read-only view of a
    received message (:mod:`fedrcl_flwr.codec`), which torch shares without copying and
    warns about: the tensor is only read (a weight loaded, a received model compared)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(array, **kwargs)


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    sd = model.state_dict()
    if len(weights) != len(sd):
        raise ValueError(f"expected {len(sd)} arrays for the model, got {len(weights)}")
    new = {}
    for (k, v), w in zip(sd.items(), weights):
        if tuple(v.shape) != tuple(np.shape(w)):
            raise ValueError(
                f"shape mismatch for '{k}': model {tuple(v.shape)} vs received {tuple(np.shape(w))}"
            )
        new[k] = constant_tensor(np.asarray(w), dtype=v.dtype)
    model.load_state_dict(new, strict=True)


def trainable_mask(model: nn.Module) -> list[bool]:
    """For each state_dict entry: True for trainable parameters, False for buffers."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return [k in names for k in model.state_dict().keys()]


def client_seed(seed: int, server_round: int, partition_id: int) -> int:
    """Seed of a client's local randomness: depends only on (seed, round, partition id)."""
    h = hashlib.sha256(f"{seed}:{server_round}:{partition_id}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def sample_partitions(seed: int, server_round: int, num_clients: int, k: int) -> list[int]:
    """The partition ids trained in ``server_round``.

    Depends only on (seed, round, num_clients, k): identical for every method, strategy
    and number of workers.
    """
    if not 1 <= k <= num_clients:
        raise ValueError(f"cannot sample {k} of {num_clients} clients")
    rng = np.random.default_rng([int(seed), int(server_round), 0x5A3F])
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))


def make_batches(
    dataset,
    indices: np.ndarray,
    batch_size: int,
    seed: int,
    device: torch.device | None = None,
    last_batch: str = "keep",
):
    """``batches(epoch)`` for :func:`fedrcl_flwr.training.train_local`: the shuffled,
    augmented batches of :func:`fedrcl_flwr.data.datasets.iterate_batches`, with a
    generator seeded with ``(seed, epoch)`` only (the permutation and the augmentation
    draws, on the host whatever ``device``), delivered on ``device`` (default: the CPU;
    a CUDA device gets pinned, non-blocking copies of the uint8 pixels, normalised and
    augmented there). ``last_batch``: keep, drop or fold the epoch's last, incomplete
    batch (:func:`fedrcl_flwr.data.datasets.batch_bounds`)."""
    from fedrcl_flwr.data.datasets import iterate_batches

    def batches(epoch: int):
        g = torch.Generator()
        g.manual_seed((seed + 1000003 * epoch) & ((1 << 63) - 1))
        return iterate_batches(
            dataset, indices, batch_size, generator=g, device=device, last_batch=last_batch
        )

    return batches
