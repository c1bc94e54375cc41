"""Atomic run checkpoints (write to a temporary file, then rename).

A checkpoint holds everything needed to continue a run: the round number, the strategy's
state (global model and server-optimizer buffers), the EMA accumulator, the elapsed wall
time and the RNG states. Per-client persistent state lives in the run directory already
(``client_state/``) and metrics up to the checkpoint round are kept in ``metrics.jsonl``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

CHECKPOINT_FILE = "checkpoint.pt"


def rng_states() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


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
