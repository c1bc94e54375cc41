"""The model interface (fedrcl_flwr/models/interface.py) is checked where models are built:
a model lacking part of it is one error naming the model and the part."""

import pytest
import torch
from torch import nn

from fedrcl_flwr.models import MODELS, build_model
from fedrcl_flwr.models.interface import (
    BlockModel,
    FeatureModel,
    ModelInterfaceError,
    has_blocks,
)


@pytest.mark.parametrize(
    "name,blocks",
    [
        ("cnn4", True),
        ("cnn5", True),
        ("lightcnn", False),
        ("resnet18_gn", True),
        ("squeezenet_gn", True),
    ],
)
def test_registered_models_follow_the_interface(name, blocks):
    m = build_model(name, num_classes=3, in_channels=3, image_size=16)
    assert isinstance(m, FeatureModel) and has_blocks(m) is blocks
    proj = build_model(name, num_classes=3, in_channels=3, image_size=16, params={"projector": 8})
    assert isinstance(proj, FeatureModel) and not isinstance(proj, BlockModel)


class _Net(nn.Module):
    levels = ("penultimate",)

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x, return_features=False):
        z = x.flatten(1)[:, :4]
        return (self.fc(z), {"penultimate": z}) if return_features else self.fc(z)


class _NoLevels(_Net):
    levels = ()


class _NoFeatures(_Net):
    def forward(self, x):
        return self.fc(x.flatten(1)[:, :4])


class _HalfBlocks(_Net):
    def block_forward(self, x):
        return [x]


@pytest.mark.parametrize(
    "cls,message",
    [
        (_NoLevels, "'levels' must be a non-empty tuple"),
        (_NoFeatures, r"forward\(x, return_features=False\) is required"),
        (_HalfBlocks, "has block_forward but not the other half"),
    ],
)
def test_a_model_lacking_part_of_the_interface_is_named(monkeypatch, cls, message):
    monkeypatch.setitem(MODELS, "custom", lambda *a, **k: cls())
    with pytest.raises(
        ModelInterfaceError, match=f"model 'custom' \\({cls.__name__}\\): {message}"
    ):
        build_model("custom", num_classes=2, in_channels=1, image_size=2)
    monkeypatch.setitem(MODELS, "custom", lambda *a, **k: _Net())
    m = build_model("custom", num_classes=2, in_channels=1, image_size=2)
    assert m(torch.zeros(1, 1, 2, 2)).shape == (1, 2) and not has_blocks(m)
