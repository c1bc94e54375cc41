"""Model registry: YAML's ``model.name`` selects a builder here.

Every model follows one interface: ``model(x)`` returns logits; ``model(x,
return_features=True)`` returns ``(logits, feats)`` where ``feats`` maps tap names to
pooled ``(B, C)`` tensors and always contains ``"penultimate"`` (the input of the final
linear classifier ``model.fc``). ``model.levels`` lists the taps in network order. The
interface is :class:`fedrcl_flwr.models.interface.FeatureModel` (and, for FedMLB,
``BlockModel``), checked by :func:`build_model` on every model it builds.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def _resnet18_gn(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.resnet import ResNet18GN

    return ResNet18GN(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params
    )


def _cnn4(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.cnn import CNN4

    return CNN4(num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params)


def _cnn5(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.cnn import CNN5

    return CNN5(num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params)


def _lightcnn(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.lightcnn import LightCNN

    return LightCNN(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params
    )


def _backbone_mlp(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.backbone import BackboneMLP

    return BackboneMLP(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params
    )


def _vgg9_gn(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.vgg import VGG9GN

    return VGG9GN(num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params)


def _mobilenet_v2_gn(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.mobilenet import MobileNetV2GN

    return MobileNetV2GN(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params
    )


def _shufflenet_v2_gn(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.shufflenet import ShuffleNetV2GN

    return ShuffleNetV2GN(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params
    )


def _squeezenet_gn(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.squeezenet import SqueezeNetGN

    return SqueezeNetGN(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params
    )


def _resnet10_bn(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.resnet10_bn import ResNet10BN

    return ResNet10BN(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params
    )


def _feduv_simplecnn(num_classes: int, in_channels: int, image_size: int, **params) -> nn.Module:
    from fedrcl_flwr.models.feduv_simplecnn import FedUVSimpleCNN

    return FedUVSimpleCNN(
        num_classes=num_classes, in_channels=in_channels, image_size=image_size, **params
    )


MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet18_gn": _resnet18_gn,
    "cnn4": _cnn4,
    "cnn5": _cnn5,
    "lightcnn": _lightcnn,
    "backbone_mlp": _backbone_mlp,
    # FedRCL Table C backbones, CIFAR-sized, from scratch, GroupNorm
    "vgg9_gn": _vgg9_gn,
    "mobilenet_v2_gn": _mobilenet_v2_gn,
    "shufflenet_v2_gn": _shufflenet_v2_gn,
    "squeezenet_gn": _squeezenet_gn,
    # FPL's (RethinkFL's) ResNet-10 with BatchNorm, the backbone of their Digits /
    # Office-Caltech protocol
    "resnet10_bn": _resnet10_bn,
    # FedUV's SimpleCNN: eight conv-BN layers and its own BatchNorm projector
    "feduv_simplecnn": _feduv_simplecnn,
}
MODEL_NAMES = frozenset(MODELS)


def register_model(name: str, builder: Callable[..., nn.Module]) -> None:
    """Add a model builder ``builder(num_classes, in_channels, image_size, **params)``."""
    MODELS[name] = builder
    global MODEL_NAMES
    MODEL_NAMES = frozenset(MODELS)


def build_model(
    name: str, *, num_classes: int, in_channels: int, image_size: int, params: dict | None = None
) -> nn.Module:
    """Build a registered model. ``params.projector: W`` (W > 0) inserts UniVarFL's
    two-layer projector of width W before a new classifier. The model is checked against
    the model interface (``fedrcl_flwr/models/interface.py``): a builder whose model
    lacks part of it is a ``ModelInterfaceError`` naming the model and the part."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}' (known: {', '.join(sorted(MODELS))})")
    params = dict(params or {})
    width = int(params.pop("projector", 0) or 0)
    try:
        model = MODELS[name](num_classes, in_channels, image_size, **params)
    except TypeError as exc:
        raise ValueError(f"model '{name}': bad model.params ({exc})") from None
    if width > 0:
        from fedrcl_flwr.models.projector import WithProjector

        model = WithProjector(model, num_classes, width)
    from fedrcl_flwr.models.interface import check_model_interface

    check_model_interface(model, name)
    return model


def reset_to_pytorch_default(model: nn.Module) -> nn.Module:
    """Re-initialise every sub-module with its own ``reset_parameters`` (PyTorch's default:
    Kaiming-uniform with a = √5 for conv/linear weights, ones/zeros for norms), replacing
    a model's own initialisation such as ResNet-18-GN's Kaiming-normal (fan_out) convs.
    The FedRCL authors' ResNet-18 (skynbe/FedRCL ``models/resnet.py``) has no custom
    initialisation, i.e. PyTorch's default (``model.init: pytorch``)."""
    for m in model.modules():
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            reset()
    return model
