"""The round's received (global) weights on the client side: weights by reference
(:class:`~fedrcl_flwr.app.wire.transport.Received`, ``simulation.transport: shared``)
copied from the run's weight store straight into the model's tensors while they are hashed
(:func:`copy_into_model`), and the received values of the model's trainable parameters as
constant tensors (:func:`trainable_tensors`; FedProx, FedACG)."""

from __future__ import annotations

import numpy as np
import torch

from fedrcl_flwr.app.wire import transport
from fedrcl_flwr.run import runtime


def _writable_view(tensor: torch.Tensor) -> np.ndarray | None:
    """A NumPy view of ``tensor``'s memory that received weights can be copied into
    directly (a contiguous CPU tensor of a NumPy dtype), else ``None``."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return None
    try:
        return tensor.detach().numpy()
    except (TypeError, RuntimeError):  # bfloat16 and the like
        return None


def _check_shapes(state: dict, shapes: list[tuple]) -> None:
    """The received arrays' shapes against the model's (``runtime.set_weights``'s
    errors), before anything is copied into it."""
    if len(shapes) != len(state):
        raise ValueError(f"expected {len(state)} arrays for the model, got {len(shapes)}")
    for (k, v), shape in zip(state.items(), shapes):
        if tuple(v.shape) != tuple(shape):
            raise ValueError(
                f"shape mismatch for '{k}': model {tuple(v.shape)} vs received {tuple(shape)}"
            )


def _shares_memory(tensor: torch.Tensor, array: np.ndarray) -> bool:
    return (
        tensor.device.type == "cpu"
        and array.ctypes.data == tensor.data_ptr()
        and array.nbytes == tensor.numel() * tensor.element_size()
    )


def copy_into_model(model: torch.nn.Module, received: transport.Received) -> None:
    """The weights of ``received`` (by reference) copied into ``model``'s tensors in one
    pass while they are hashed; a tensor that cannot take them as they are (on a GPU, in
    another dtype or layout) through arrays of the client's own. Shapes are checked
    first, before anything is copied."""
    state = model.state_dict()
    _check_shapes(state, received.shapes())
    tensors = list(state.values())
    got = received.read_into([_writable_view(t) for t in tensors])
    with torch.no_grad():
        for tensor, array in zip(tensors, got):
            if not _shares_memory(tensor, array):
                tensor.copy_(runtime.constant_tensor(array))


def trainable_tensors(
    model: torch.nn.Module, received: list, device: torch.device
) -> list[torch.Tensor]:
    """The received values of ``model``'s trainable parameters, aligned with
    ``model.parameters()``, as constant tensors on ``device``."""
    keys = list(model.state_dict().keys())
    by_key = dict(zip(keys, received))
    return [
        runtime.constant_tensor(by_key[n], device=device)
        for n, p in model.named_parameters()
        if p.requires_grad
    ]
