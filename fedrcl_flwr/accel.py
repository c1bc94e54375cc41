"""Running the hot loop on an accelerator: host-to-device transfers, mixed precision and
memory format, decided in one place (no Flower here).

* Transfers (:func:`transfer_plan`, :func:`gather_rows`, :func:`to_device`): a batch is
  gathered on the host from the ``uint8`` image array straight into page-locked ("pinned")
  memory when the target is a CUDA device, and copied with ``non_blocking=True``, so the
  copy overlaps the previous step's kernels and the host never waits for the device.
  Small host tensors (augmentation draws, normalisation statistics) are copied with
  ``non_blocking=True`` from ordinary memory: CUDA stages them at once, without waiting
  for the device. On the CPU every one of these is a no-op.
* Mixed precision (``client.amp``, :func:`amp_dtype`, :func:`forward_precision`,
  :func:`loss_precision`): ``bf16`` / ``fp16`` run the model's forward pass under
  ``torch.autocast``; the loss terms always run with autocast disabled on float32 copies
  of the model outputs (``training.train_local``), so the contrastive / RCL / UniVarFL /
  FedCCL losses (exponentials of similarities over a temperature, reciprocals of
  ``1 − cos``) are evaluated in float32. ``fp16`` needs a CUDA device (a loss scaler,
  ``torch.amp.GradScaler``, fresh every client round, guards its narrow exponent range:
  :func:`grad_scaler`); asking for it on a CPU is a
  :class:`~fedrcl_flwr.config.ConfigError`. ``off`` (default) changes nothing. The FedRCL
  authors train with ``use_amp: True`` = ``fp16`` here (their losses too run under the
  autocast; on a CPU their autocast and scaler do nothing, i.e. float32 as ``off``).
* Memory format (``client.channels_last``, :func:`use_channels_last`): NHWC
  (``torch.channels_last``) lets cuDNN pick its tensor-core convolution kernels. ``auto``
  turns it on only for a CUDA device, a model with 2-D convolutions, and normalisation
  layers that keep NHWC on this PyTorch build (probed once per process: PyTorch's CUDA
  GroupNorm long returned NCHW, which would make every GroupNorm layer of ResNet-18-GN
  convert the layout back and forth); ``true`` forces it, ``false`` never uses it.
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import Any

import torch
from torch import nn

from fedrcl_flwr.errors import ConfigError

AMP_MODES = ("off", "bf16", "fp16")
_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ----------------------------------------------------------------------------- transfers
def transfer_plan(device: str | torch.device | None) -> tuple[bool, bool]:
    """``(pin, non_blocking)`` for host tensors bound for ``device``: both true for a CUDA
    device (page-locked staging, asynchronous copy), both false otherwise (the CPU: the
    batch already is where it is used)."""
    dev = torch.device("cpu" if device is None else device)
    on_cuda = dev.type == "cuda"
    return on_cuda, on_cuda


def gather_rows(source: torch.Tensor, index: torch.Tensor, pin: bool) -> torch.Tensor:
    """``source[index]`` along the first dimension, written straight into page-locked
    memory when ``pin`` (one host copy, no separate ``pin_memory()`` pass). ``source`` is
    only read (it may be a read-only memory map)."""
    if not pin:
        return source[index]
    out = torch.empty((int(index.shape[0]), *source.shape[1:]), dtype=source.dtype, pin_memory=True)
    return torch.index_select(source, 0, index, out=out)


def to_device(t: torch.Tensor, device: str | torch.device | None) -> torch.Tensor:
    """``t`` on ``device`` without a host wait: ``non_blocking`` for a CUDA target
    (``t`` pinned or small), unchanged when it already is there."""
    if device is None:
        return t
    dev = torch.device(device)
    if t.device == dev:
        return t
    return t.to(dev, non_blocking=transfer_plan(dev)[1])


# ------------------------------------------------------------------------ mixed precision
def amp_dtype(mode: str, device: str | torch.device) -> torch.dtype | None:
    """The autocast dtype of ``client.amp`` ``mode`` on ``device`` (``None`` for ``off``).
    ``fp16`` on anything but CUDA is a :class:`ConfigError`."""
    if mode not in AMP_MODES:
        raise ConfigError(f"client.amp must be one of {', '.join(AMP_MODES)}, got {mode!r}")
    if mode == "off":
        return None
    dev = torch.device(device)
    if mode == "fp16" and dev.type != "cuda":
        raise ConfigError(
            f"client.amp fp16 needs a CUDA device (the client runs on "
            f"{dev.type}); use client.amp bf16 or off"
        )
    return _AMP_DTYPES[mode]


def forward_precision(device: str | torch.device, dtype: torch.dtype | None):
    """Context of the model's forward pass: autocast to ``dtype`` (nothing when ``None``)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def loss_precision(device: str | torch.device, dtype: torch.dtype | None):
    """Context of the loss terms: autocast disabled when the forward used it, so the losses
    run in float32 on the float32 copies :func:`as_float32` makes (nothing when ``None``)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, enabled=False)


def as_float32(obj: Any) -> Any:
    """Floating tensors in ``obj`` (a tensor, or lists / tuples / dicts of them, e.g. a
    model's feature taps) as float32; everything else unchanged."""
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.is_floating_point() and obj.dtype != torch.float32 else obj
    if isinstance(obj, dict):
        return {k: as_float32(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_float32(v) for v in obj)
    return obj


def grad_scaler(mode: str, device: str | torch.device):
    """A new ``torch.amp.GradScaler`` for ``fp16`` (``None`` otherwise: bf16 has float32's
    exponent range and needs no loss scaling). ``training.train_local`` asks for one per
    call, i.e. a fresh scaler every client round, with ``GradScaler()``'s constants (init
    scale 2^16, growth x2 every 2000 finite steps, backoff x0.5): the FedRCL authors'
    ``use_amp`` (skynbe/FedRCL ``clients/base_client.py: local_train``: ``scaler =
    GradScaler()`` per call, ``scale(loss).backward()``, ``unscale_``, clip 10, ``step``,
    ``update``). Difference: their loss terms run under the autocast too; ours in float32
    (:func:`loss_precision`)."""
    if mode != "fp16":
        return None
    return torch.amp.GradScaler(
        torch.device(device).type,
        init_scale=2.0**16,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2000,
    )


# --------------------------------------------------------------------------- memory format
CHANNELS_LAST_SETTINGS = ("auto", True, False)


def _has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


@cache
def _norm_keeps_channels_last(kind: type, device: str) -> bool:
    """Whether ``kind`` (a 2-D normalisation layer class) returns NHWC for NHWC input on
    ``device`` with this PyTorch build (a tiny probe, once per process)."""
    layer = (nn.GroupNorm(2, 4) if kind is nn.GroupNorm else kind(4)).to(device)
    # no random numbers: the probe must not move the device's generator
    x = torch.arange(72.0, device=device).view(2, 4, 3, 3).sin()
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        y = layer(x)
    return y.is_contiguous(memory_format=torch.channels_last)


_NORMS_2D = (nn.GroupNorm, nn.BatchNorm2d, nn.InstanceNorm2d)


def use_channels_last(setting: str | bool, device: str | torch.device, model: nn.Module) -> bool:
    """Whether to train ``model`` on ``device`` in ``torch.channels_last``
    (``client.channels_last``; see the module docstring for ``auto``)."""
    if setting is True or setting is False:
        return setting
    if setting != "auto":
        raise ConfigError(f"client.channels_last must be auto, true or false, got {setting!r}")
    dev = torch.device(device)
    if dev.type != "cuda" or not _has_conv2d(model):
        return False
    kinds = {k for m in model.modules() for k in _NORMS_2D if isinstance(m, k)}
    return all(_norm_keeps_channels_last(k, str(dev)) for k in kinds)
