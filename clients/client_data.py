"""Which data a client trains and evaluates on (:class:`LocalData`): in simulation the
partition the server assigned for the round (:func:`partition_of`), on a real device the
node's own data (node-config ``data-path``), minus the local test share while per-client
evaluation holds one out (:func:`without_local_test`, ``fedrcl_flwr/client_eval.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedrcl_flwr import client_eval
from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.run import runtime


@dataclass
class LocalData:
    """A client's view of its training data: the shared dataset plus its indices."""

    dataset: Any
    indices: np.ndarray
    labels: np.ndarray
    num_classes: int

    @property
    def size(self) -> int:
        return int(len(self.indices))

    def class_counts(self) -> np.ndarray:
        return np.bincount(self.labels[self.indices], minlength=self.num_classes)


def round_partition_id(
    fixed_data: LocalData | None, default_id: int | None, assigned: int | None
) -> int:
    """The partition id of a client's round: a real device (``fixed_data``) its own
    (``default_id``, else 0); in simulation the one the server ``assigned`` this round
    (else ``default_id``); -1 when there is none."""
    pid: int | None
    if fixed_data is not None:  # a real device: its own data, its own id
        pid = default_id if default_id is not None else 0
    else:  # simulation: the partition the server assigned this round
        pid = assigned if assigned is not None else default_id
    return int(pid) if pid is not None else -1


def partition_of(cfg: ExperimentConfig, partition_id: int) -> LocalData:
    """Partition ``partition_id`` of the experiment's training set (simulation)."""
    bundle = runtime.load_bundle(cfg)
    parts = runtime.client_partitions(cfg)
    if not 0 <= partition_id < len(parts):
        raise ValueError(f"partition id {partition_id} out of range (num_clients={len(parts)})")
    return LocalData(bundle.train, parts[partition_id], bundle.train_labels, bundle.num_classes)


def without_local_test(cfg: ExperimentConfig, data: LocalData, data_id: int) -> LocalData:
    """``data`` minus the local test share while per-client evaluation holds one out
    (seeded by ``data_id``)."""
    if client_eval.holds_out(cfg):
        data = dataclasses.replace(
            data, indices=client_eval.training_indices(cfg, data_id, data.indices)
        )
    return data


def model_shapes(cfg: ExperimentConfig, fixed_data: LocalData | None):
    """What a client's model is built for (classes, channels, image size): the dataset's
    bundle, or a real device's own data read from its first sample."""
    if fixed_data is None:
        return runtime.load_bundle(cfg)
    from types import SimpleNamespace

    x0, _ = fixed_data.dataset[int(fixed_data.indices[0])]
    return SimpleNamespace(
        num_classes=fixed_data.num_classes, in_channels=x0.shape[0], image_size=x0.shape[-1]
    )
