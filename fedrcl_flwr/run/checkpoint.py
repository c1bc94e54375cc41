"""Atomic run checkpoints (write to a temporary file, then rename).

A checkpoint holds everything needed to continue a run: the round number, the strategy's
state (global model and server-optimizer buffers), the EMA accumulator and the elapsed
wall time. Per-client persistent state lives in the run directory already
(``client_state/``) and metrics up to the checkpoint round are kept in ``metrics.jsonl``.

No RNG state is saved: nothing a resumed run does depends on a process's RNG history.
Every random draw is seeded from the experiment seed and the run round: the sampled
partitions (``runtime.sample_partitions(seed, round)``), each client's local randomness
(``runtime.client_seed(seed, round, partition)``: batch order, augmentation, PGD starts),
the round-0 model (``seed``) and the robust evaluation's attack draws (``seed``). A
resumed run therefore trains exactly as the uninterrupted one would.

Checkpoints are read with ``torch.load(weights_only=True)``, so a crafted file cannot run
code: what is saved is only tensors, numbers, strings, ``None`` and lists/tuples/dicts of
them. NumPy arrays (model weights, optimizer buffers) are stored as
``{"__numpy__": tensor}`` and turned back into arrays on load (:func:`to_safe`,
:func:`from_safe`). A file that cannot be read this way is a
:class:`~fedrcl_flwr.errors.CheckpointError` (:func:`fedrcl_flwr.serialization.safe_load`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedrcl_flwr.errors import CheckpointError
from fedrcl_flwr.run.run_files import (  # noqa: F401 - guarded_write re-exported
    CHECKPOINT_FILE,
    atomic_write_bytes,
    guarded_write,
    new_file,
)
from fedrcl_flwr.serialization import safe_load


def to_safe(obj):
    """``obj`` with NumPy arrays/scalars replaced by tensors/Python numbers (for saving)."""
    if isinstance(obj, np.ndarray):
        return {"__numpy__": torch.from_numpy(np.array(obj, copy=True))}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: to_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_safe(v) for v in obj)
    return obj


def from_safe(obj):
    """Inverse of :func:`to_safe`."""
    if isinstance(obj, dict):
        if set(obj) == {"__numpy__"} and torch.is_tensor(obj["__numpy__"]):
            return obj["__numpy__"].numpy()
        return {k: from_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_safe(v) for v in obj)
    return obj


def write_torch_file(path: Path, obj) -> None:
    """``torch.save(obj)`` into ``path`` whole or not at all: serialised in memory first,
    then written by :func:`~fedrcl_flwr.run.run_files.atomic_write_bytes`. On a full disk
    the error is the file system's — a :class:`~fedrcl_flwr.run.run_files.RunFileError`
    naming ``path``, no ``.tmp`` left — where torch's own file writer would raise a
    ``RuntimeError`` ("file write failed") and leave its partial ``.tmp`` behind."""
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(Path(path), buffer.getbuffer())


def save_checkpoint(run_dir: Path, state: dict) -> Path:
    path = Path(run_dir) / CHECKPOINT_FILE
    write_torch_file(path, to_safe(state))
    return path


def load_checkpoint(run_dir: Path) -> dict:
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.exists():
        raise CheckpointError(
            f"no checkpoint in {run_dir} (was output.checkpoint_every "
            f"> 0 when the run was started?)"
        )
    state = from_safe(safe_load(path, "checkpoint"))
    if not isinstance(state, dict) or not {"round", "strategy"} <= set(state):
        raise CheckpointError(f"{path}: not a fedrcl-flwr checkpoint (no round/strategy)")
    return state
