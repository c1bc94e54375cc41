"""The model interface every method relies on, as ``typing.Protocol`` s, checked once where
a model is built (:func:`fedrcl_flwr.models.build_model`), not with ``hasattr`` where it
is used.

* :class:`FeatureModel` (every model): ``model(x)`` returns logits; ``model(x,
  return_features=True)`` returns ``(logits, feats)`` with ``feats`` mapping tap names to
  pooled ``(B, C)`` tensors, always with ``"penultimate"`` (the input of the final linear
  classifier ``model.fc``); ``model.levels`` lists the taps in network order (FedRCL's
  ``levels``, the ``feature`` parameters of the signal methods).
* :class:`BlockModel` (optional; FedMLB needs it): the same function split into blocks,
  ``model.block_forward(x)`` -> the block outputs up to the penultimate feature and
  ``model.forward_from(k, h, return_features=False)`` -> the logits (and taps) from block
  ``k``'s output ``h``.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class FeatureModel(Protocol):
    levels: tuple[str, ...]
    fc: nn.Module

    def forward(self, x: torch.Tensor, return_features: bool = False) -> Any: ...


@runtime_checkable
class BlockModel(FeatureModel, Protocol):
    def block_forward(self, x: torch.Tensor) -> list[torch.Tensor]: ...

    def forward_from(self, k: int, h: torch.Tensor, return_features: bool = False) -> Any: ...


class ModelInterfaceError(ValueError):
    """A built model that does not follow :class:`FeatureModel` (or half of
    :class:`BlockModel`)."""


def _has_parameters(fn: Any, names: tuple[str, ...]) -> bool:
    try:
        have = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(n in have for n in names)


def check_model_interface(model: nn.Module, name: str) -> None:
    """Raise :class:`ModelInterfaceError` naming model ``name`` and what it lacks."""
    where = f"model '{name}' ({type(model).__name__})"
    if not isinstance(model, nn.Module):
        raise ModelInterfaceError(f"{where} is not a torch.nn.Module")
    levels = getattr(model, "levels", None)
    if (
        not isinstance(levels, tuple)
        or not levels
        or not all(isinstance(lv, str) and lv for lv in levels)
    ):
        raise ModelInterfaceError(
            f"{where}: 'levels' must be a non-empty tuple of tap names, got {levels!r}"
        )
    if not isinstance(getattr(model, "fc", None), nn.Module):
        raise ModelInterfaceError(f"{where}: 'fc' (the final linear classifier) is missing")
    if not _has_parameters(model.forward, ("x", "return_features")):
        raise ModelInterfaceError(f"{where}: forward(x, return_features=False) is required")
    has = [m for m in ("block_forward", "forward_from") if callable(getattr(model, m, None))]
    if len(has) == 1:
        raise ModelInterfaceError(
            f"{where}: has {has[0]} but not the other half of the "
            "block interface (block_forward / forward_from)"
        )
    if has and not (
        _has_parameters(model.block_forward, ("x",))
        and _has_parameters(model.forward_from, ("k", "h", "return_features"))
    ):
        raise ModelInterfaceError(
            f"{where}: block_forward(x) / forward_from(k, h, "
            "return_features=False) have other parameters"
        )


def has_blocks(model: nn.Module) -> bool:
    """Does the (built, checked) model offer the block interface (:class:`BlockModel`)?"""
    return isinstance(model, BlockModel)
