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
from functools import lru_cache
from typing import Optional

import numpy as np
import torch
from torch import nn

from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.models import build_model


def _key(obj) -> str:
    return json.dumps(dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj,
                      sort_keys=True, default=str)


# dataset key -> prepared cache entry (use_prepared_dataset): this process only opens it
_PREPARED: dict = {}


def use_prepared_dataset(cfg: ExperimentConfig, entry: str) -> None:
    """Declare that this process's dataset is the cache entry ``entry`` prepared by the
    CLI before the run (``fedrcl_flwr.data.cache``): :func:`load_bundle` then opens it and
    never builds the dataset; an absent or corrupt entry is one
    :class:`~fedrcl_flwr.data.datasets.DatasetError` naming the host. Called by the
    ServerApp and the ClientApp when the run config carries ``dataset-cache``."""
    _PREPARED[(_key(cfg.dataset), cfg.seed)] = str(entry)


def prepare_dataset(cfg: ExperimentConfig, note=None):
    """Build (or check) the dataset's cache entry; returns its path. The CLI's step
    before any Flower process; ``note`` hears why an existing entry was rebuilt."""
    from fedrcl_flwr.data import cache

    bundle, entry = cache.load(cfg.dataset, cfg.seed, note=note)
    _bundle_cached.cache_clear()
    return entry


@lru_cache(maxsize=4)
def _bundle_cached(dataset_key: str, seed: int):
    from fedrcl_flwr.config import DatasetConfig, SyntheticConfig
    from fedrcl_flwr.data import cache

    fields = json.loads(dataset_key)  # the (already validated) dataset section
    d = DatasetConfig(**{**fields, "synthetic": SyntheticConfig(**fields["synthetic"])})
    prepared = _PREPARED.get((dataset_key, seed))
    if prepared is not None:
        return cache.open_prepared(prepared, d)
    return cache.load(d, seed)[0]


def load_bundle(cfg: ExperimentConfig):
    """The experiment's dataset, from the dataset cache (``fedrcl_flwr.data.cache``:
    memory-mapped, built on first use unless :func:`use_prepared_dataset` said it was
    prepared), kept per process."""
    return _bundle_cached(_key(cfg.dataset), cfg.seed)
@lru_cache(maxsize=4)
def _partition_cached(dataset_key: str, partition_key: str, num_clients: int, seed: int):
    from fedrcl_flwr.data.partition import partition

    bundle = _bundle_cached(dataset_key, seed)
    p = json.loads(partition_key)
    return partition(
        bundle.train_labels, num_clients, p["scheme"], alpha=p["alpha"],
        balanced=p["balanced"], shards_per_client=p["shards_per_client"],
        min_size=p["min_size"], domains=bundle.train_domains,
        domains_per_client=p["domains_per_client"],
        samples_per_class=p.get("samples_per_class"),
        seed=seed if p["seed"] is None else p["seed"], path=p["path"],
        generator=p.get("generator"), num_classes=bundle.num_classes,
    )


def client_partitions(cfg: ExperimentConfig) -> list:
    """Index arrays of every client (computed once per process)."""
    return _partition_cached(_key(cfg.dataset), _key(cfg.partition),
                             cfg.federation.num_clients, cfg.seed)


_NODE = {"name": None}


def set_node_name(name: str) -> None:
    """Name this process's machine / cluster node in client records (the ClientApp sets
    the Ray node when it runs on a multi-node Ray cluster)."""
    _NODE["name"] = str(name)


def node_name() -> str:
    """Where this process runs: the name :func:`set_node_name` gave, else the host name.
    Clients report it with every result; the server counts them per round
    (``client_nodes`` in ``metrics.jsonl``)."""
    if _NODE["name"] is None:
        import socket

        _NODE["name"] = socket.gethostname()
    return _NODE["name"]


def pick_device(name: str = "auto") -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("client.device is 'cuda' but no CUDA device is visible")
        return torch.device("cuda")
    return torch.device("cpu")


def new_model(cfg: ExperimentConfig, bundle) -> nn.Module:
    model = build_model(cfg.model.name, num_classes=cfg.model.num_classes or bundle.num_classes,
                        in_channels=bundle.in_channels, image_size=bundle.image_size,
                        params=cfg.model.params)
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
    from fedrcl_flwr.config import ConfigError

    if bundle is not None:
        try:
            with torch.random.fork_rng(devices=[]):
                new_model(cfg, bundle)
            return
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"model {cfg.model.name!r}: {exc}") from None
    exc = _probe(cfg)[1]
    if isinstance(exc, (ValueError, TypeError)):  # what new_model raises for bad input
        raise ConfigError(f"model {cfg.model.name!r}: {exc}")


def probe_model(cfg: ExperimentConfig) -> Optional[nn.Module]:
    """The configured model at nominal input shapes, built without loading data, for
    checks before a run (its feature taps, its blocks); ``None`` when it cannot be built
    (a missing weights file, ...: reported where the model is really built). Its
    ``probe_input_shape`` is the (C, H, W) of one input it accepts. Cached per process:
    treat it as read-only."""
    return _probe(cfg)[0]


def _probe(cfg: ExperimentConfig):
    d = cfg.dataset
    synth = d.name == "synthetic"
    channels = d.synthetic.channels if synth else 3
    size = d.image_size or (d.synthetic.image_size if synth else 32)
    classes = cfg.model.num_classes or (d.synthetic.num_classes if synth else 10)
    return _probe_cached(cfg.model.name, _key(cfg.model.params), classes, channels, size)


@lru_cache(maxsize=4)
def _probe_cached(name: str, params_key: str, classes: int, channels: int, size: int):
    """``(model, None)``, or ``(None, the exception that stopped it)``."""
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(name, num_classes=classes, in_channels=channels,
                                image_size=size, params=json.loads(params_key))
    except Exception as exc:  # noqa: BLE001 - see probe_model
        return None, exc
    model.probe_input_shape = (channels, size, size)
    return model.eval(), None


def initial_model(cfg: ExperimentConfig, bundle) -> nn.Module:
    """The round-0 global model, initialised deterministically from ``cfg.seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return new_model(cfg, bundle)


# the process's model pool: (config key, {slot: model}); a new config empties it
_MODEL_POOL: dict = {"key": None, "slots": {}}


def worker_model(cfg: ExperimentConfig, bundle, device: torch.device,
                 slot: str = "local") -> nn.Module:
    """One model instance per ``slot`` and process, re-used by every virtual client it
    serves: ``local`` is the model a client trains; other slots are second instances
    (the frozen global / previous models of FedNTD, FitNet, MOON, FedMLB; see
    ``FederatedClient.frozen_model``), so a process holds one model per slot whatever the
    number of clients. Building one does not consume the caller's RNG (a client's
    randomness must not depend on whether its process had built the model already)."""
    key = (cfg.model.name, _key(cfg.model.params), cfg.model.num_classes, bundle.num_classes,
           bundle.in_channels,
           bundle.image_size, str(device))
    if _MODEL_POOL["key"] != key:
        _MODEL_POOL["key"], _MODEL_POOL["slots"] = key, {}
    slots = _MODEL_POOL["slots"]
    if slot not in slots:
        with torch.random.fork_rng(devices=[]):
            slots[slot] = new_model(cfg, bundle).to(device)
    return slots[slot]


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """All state_dict entries (parameters and buffers) in a fixed order, as NumPy."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    sd = model.state_dict()
    if len(weights) != len(sd):
        raise ValueError(f"expected {len(sd)} arrays for the model, got {len(weights)}")
    new = {}
    for (k, v), w in zip(sd.items(), weights):
        if tuple(v.shape) != tuple(np.shape(w)):
            raise ValueError(f"shape mismatch for '{k}': model {tuple(v.shape)} vs "
                             f"received {tuple(np.shape(w))}")
        new[k] = torch.as_tensor(np.asarray(w), dtype=v.dtype)
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


def make_batches(dataset, indices: np.ndarray, batch_size: int, seed: int,
                 device: Optional[torch.device] = None):
    """``batches(epoch)`` for :func:`fedrcl_flwr.training.train_local`: the shuffled,
    augmented batches of :func:`fedrcl_flwr.data.datasets.iterate_batches`, with a
    generator seeded with ``(seed, epoch)`` only (the permutation and the augmentation
    draws, on the host whatever ``device``), delivered on ``device`` (default: the CPU;
    a CUDA device gets pinned, non-blocking copies of the uint8 pixels, normalised and
    augmented there)."""
    from fedrcl_flwr.data.datasets import iterate_batches

    def batches(epoch: int):
        g = torch.Generator()
        g.manual_seed((seed + 1000003 * epoch) & ((1 << 63) - 1))
        return iterate_batches(dataset, indices, batch_size, generator=g, device=device)

    return batches
