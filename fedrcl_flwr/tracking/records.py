"""The run's records as tracker values: a round's numeric entries under the names every
tracker shows (:func:`scalars`), ``summary.json`` as ``summary/<key>``
(:func:`summary_scalars`) and the resolved config as dotted parameters
(:func:`flat_params`). The tags are listed in :mod:`fedrcl_flwr.tracking`."""

from __future__ import annotations

import math
from typing import Any


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
    if key.startswith("dp_"):
        return f"privacy/{key}"
    if key.startswith("client_acc_"):  # per-client evaluation (client_eval.py)
        return f"client_accuracy/{key[len('client_acc_') :]}"
    return f"round/{key}"


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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


def summary_scalars(summary: dict) -> dict[str, float]:
    """Every finite number of ``summary.json`` as ``summary/<key>`` (nested mappings
    joined with ``/``: ``summary/accuracy_at/500``)."""
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif _num(value):
            out[prefix] = float(value)

    for key, value in summary.items():
        walk(f"summary/{key}", value)
    return out


def flat_params(config: dict, prefix: str = "") -> dict[str, Any]:
    """The resolved config as ``{dotted key: value}`` (lists and empty mappings kept as
    values)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flat_params(v, key))
        else:
            out[key] = v
    return out
