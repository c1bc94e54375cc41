"""TensorBoard event files per run (``output.tensorboard: true``), written from the same
round record that goes to ``metrics.jsonl`` (which stays the source of truth).

Files go to ``<run dir>/tensorboard/``, so ``tensorboard --logdir <sweep --out>`` compares
every run of a sweep. Tags (step = round):

* ``accuracy/test``, ``accuracy/ema``, ``accuracy/val``, ``loss/test``, ``loss/val``
* ``train/<name>``: the per-term training losses (``train_loss``, ``train_loss_rcl``, ...)
* ``domain_accuracy/<domain>``: per-domain test accuracy
* ``representation/<name>``: ``repr_*`` metrics (effective rank, VCI, ...)
* ``comm/<name>``: ``*_bytes_*`` (model and signal bytes per round)
* ``robust/<name>``: FGSM / PGD accuracy; ``round/<name>``: clients, failures, times
* text ``config``: the resolved experiment (YAML)

The writer is ``torch.utils.tensorboard.SummaryWriter``, which needs the ``tensorboard``
package (extra ``fedrcl-flwr[tensorboard]``); the config check refuses
``output.tensorboard: true`` without it (exit 2 at start-up).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

TB_DIR = "tensorboard"


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def _tag(key: str) -> str:
    if key in ("test_accuracy", "ema_accuracy", "val_accuracy"):
        return f"accuracy/{key.split('_')[0]}"
    if key in ("test_loss", "val_loss"):
        return f"loss/{key.split('_')[0]}"
    if key.startswith("train_"):
        return f"train/{key}"
    if key.startswith("repr_"):
        return f"representation/{key[5:]}"
    if "bytes" in key:
        return f"comm/{key}"
    if key.startswith(("fgsm", "pgd", "robust", "clean")):
        return f"robust/{key}"
    return f"round/{key}"


def scalars(record: dict) -> dict[str, float]:
    """The record's numeric entries as ``{tag: value}`` (round excluded, non-finite and
    non-numeric values left out); ``domain_accuracy`` is expanded per domain."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "round":
            continue
        if key == "domain_accuracy" and isinstance(value, dict):
            for dom, v in value.items():
                if _num(v):
                    out[f"domain_accuracy/{dom}"] = float(v)
        elif _num(value):
            out[_tag(key)] = float(value)
    return out


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class TensorBoardTracker:
    """One run's event writer; ``resume_after`` drops events of rounds after the
    checkpoint that a killed run had written (they are recomputed)."""

    def __init__(self, run_dir: Path, config_yaml: str, *, resume_after: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        from fedrcl_flwr.results import write_marker

        kwargs = {"purge_step": resume_after + 1} if resume_after else {}
        tb_dir = Path(run_dir) / TB_DIR
        created = not tb_dir.exists()
        self.writer = SummaryWriter(log_dir=str(tb_dir), **kwargs)
        if created:  # ours: `run --overwrite` may clear it
            tb_dir.mkdir(parents=True, exist_ok=True)
            write_marker(tb_dir, TB_DIR)
        if not resume_after:
            self.writer.add_text("config", "```yaml\n" + config_yaml + "```", 0)
        self.writer.flush()

    def log(self, record: dict) -> None:
        step = int(record["round"])
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
