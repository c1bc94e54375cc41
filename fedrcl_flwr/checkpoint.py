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
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CHECKPOINT_FILE = "checkpoint.pt"


def save_checkpoint(run_dir: Path, state: dict) -> Path:
    path = Path(run_dir) / CHECKPOINT_FILE
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: Path) -> dict:
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint in {run_dir} (was output.checkpoint_every "
                                f"> 0 when the run was started?)")
    return torch.load(path, map_location="cpu", weights_only=False)
