"""The project's one ``torch.load`` (a leaf: torch and :mod:`fedrcl_flwr.errors` only, so
that the models' weight loader and the run records share it without the models importing
the run layer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedrcl_flwr.errors import CheckpointError


def safe_load(path: Path, what: str = "file") -> Any:
    """``torch.load(path, weights_only=True)``; any failure is a :class:`CheckpointError`
    naming the file. The project's one call of ``torch.load``: checkpoints, client state,
    backbone weights and the sweep's look at a checkpoint all read through it (a test
    scans the source for any other call and for ``weights_only=False``)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated, foreign or code-carrying files
        one = " ".join(str(exc).split())[:300]
        raise CheckpointError(
            f"{path}: not a readable {what} ({type(exc).__name__}: {one})"
        ) from None
