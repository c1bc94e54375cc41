"""ResNet-18-GN (fedrcl_flwr.models.resnet) and the FedRCL end-to-end reference step.

The reference (tests/data/fedrcl/model_forward_step_seed1234.npz) was produced by the
authors' ResNet18_base + RCLClient: deterministic weights, one batch, CE + SCL + penalty,
one SGD step (clip 10, lr 0.1, momentum 0, wd 1e-3). Our model + our loss + the project's
training loop (``train_local``) must reproduce it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrcl_flwr.losses.rcl import rcl_loss, scl_loss
from fedrcl_flwr.models import build_model
from fedrcl_flwr.models.resnet import ResNet18GN
from fedrcl_flwr.training import (
    LocalTrainSettings,
    LossTerm,
    cross_entropy_term,
    train_local,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "fedrcl"
LEVELS = ("layer0", "layer1", "layer2", "layer3", "layer4")


def _reference_state_dict() -> dict:
    """The reference's deterministic weights: for the k-th state_dict entry,
    i = arange(numel), base = sin(0.7 i + 1.3 (i mod 7) + 0.1 k); conv / linear weights
    base * sqrt(4 / fan_in) (fan_in = numel / shape[0]); GroupNorm weights 1 + 0.1 base;
    biases 0.05 base; computed in float64, cast to float32, C-order reshape."""
    order = json.loads((DATA / "param_order.json").read_text())
    out = {}
    for k, (name, shape) in enumerate(order):
        n = int(np.prod(shape))
        i = np.arange(n, dtype=np.float64)
        base = np.sin(0.7 * i + 1.3 * (i % 7) + 0.1 * k)
        if name.endswith("weight") and len(shape) > 1:
            v = base * np.sqrt(4.0 / (n / shape[0]))
        elif name.endswith("weight"):
            v = 1.0 + 0.1 * base
        else:
            v = 0.05 * base
        out[name] = torch.from_numpy(v.astype(np.float32).reshape(shape))
    return out


@pytest.fixture(scope="module")
def ref():
    return np.load(DATA / "model_forward_step_seed1234.npz")


def _make_ref_model():
    model = ResNet18GN(num_classes=10)
    model.load_state_dict(_reference_state_dict())
    return model


@pytest.fixture
def ref_model():
    return _make_ref_model()


@pytest.fixture(scope="module")
def ref_forward(ref):
    """(model, logits, feats) of the reference weights on the reference batch."""
    model = _make_ref_model()
    with torch.no_grad():
        logits, feats = model(torch.from_numpy(ref["images"]), return_features=True)
    return model, logits, feats


def test_state_dict_matches_reference_layout():
    order = json.loads((DATA / "param_order.json").read_text())
    sd = ResNet18GN(num_classes=10).state_dict()
    assert [[k, list(v.shape)] for k, v in sd.items()] == [[n, s] for n, s in order]


def test_forward_matches_reference(ref, ref_forward):
    _, logits, feats = ref_forward
    np.testing.assert_allclose(logits.numpy(), ref["logits"], rtol=0, atol=1e-5)
    for lv in range(5):
        np.testing.assert_allclose(
            feats[f"layer{lv}"].numpy(), ref[f"pooled_layer{lv}"], rtol=0, atol=1e-5
        )


def _ref_terms():
    """CE + SCL + penalty as three named terms (default RCL settings, 5 levels)."""
    kw = dict(tau=0.05, lam=0.7, topk_pos=1, topk_neg=2)

    def feats(b):
        return [b.feats[lv] for lv in LEVELS]

    def penalty(b):
        _, info = rcl_loss(feats(b), b.y, beta=1.0, return_per_anchor=True, **kw)
        return info["penalty_mean"]

    return [
        cross_entropy_term(),
        LossTerm(
            "scl",
            lambda b: scl_loss(feats(b), b.y, tau=0.05, topk_pos=1, topk_neg=2),
            needs_features=True,
        ),
        LossTerm("penalty", penalty, needs_features=True),
    ]


def test_one_training_step_matches_reference(ref, ref_model):
    x = torch.from_numpy(ref["images"])
    y = torch.from_numpy(ref["labels"])
    settings = LocalTrainSettings(lr=0.1, epochs=1, momentum=0.0, weight_decay=1e-3, grad_clip=10.0)
    stats = train_local(
        ref_model, lambda epoch: [(x, y)], _ref_terms(), settings, torch.device("cpu")
    )
    assert stats.steps == 1
    rel = 1e-5
    assert stats.terms["ce"] == pytest.approx(float(ref["loss_cls"]), rel=rel)
    assert stats.terms["scl"] == pytest.approx(float(ref["loss_scl"]), rel=rel)
    assert stats.terms["penalty"] == pytest.approx(float(ref["loss_penalty"]), rel=rel)
    assert stats.loss == pytest.approx(float(ref["loss_total"]), rel=rel)
    # clip_grad_norm_ returns the pre-clip norm (34.4 > 10, so the step was clipped)
    assert stats.grad_norm == pytest.approx(float(ref["grad_total_norm_preclip"]), rel=rel)
    np.testing.assert_allclose(
        ref_model.fc.bias.detach().numpy(), ref["fc_bias_after_1_step"], rtol=0, atol=1e-6
    )
    with torch.no_grad():
        logits, f = ref_model(x, return_features=True)
        after = F.cross_entropy(logits, y) + rcl_loss([f[lv] for lv in LEVELS], y)
    assert after.item() == pytest.approx(float(ref["loss_total_after_1_step"]), rel=1e-5)


def test_fedrcl_client_terms_give_reference_total(ref, ref_forward):
    """The FedRCL client's own loss terms (CE + rcl over model.levels) on the batch."""
    from clients.fedrcl import FedRCLClient
    from fedrcl_flwr.training import Batch

    model, logits, feats = ref_forward
    stub = SimpleNamespace(p=dict(FedRCLClient.defaults), model=model)
    stub.contrast_fn = lambda: FedRCLClient.contrast_fn(stub)
    terms = FedRCLClient.loss_terms(stub)
    x = torch.from_numpy(ref["images"])
    y = torch.from_numpy(ref["labels"])
    batch = Batch(x=x, y=y, logits=logits, feats=feats, model=model)
    total = sum(t.weight * t.fn(batch) for t in terms)
    assert total.item() == pytest.approx(float(ref["loss_total"]), rel=1e-5)


@pytest.mark.parametrize("in_channels,size", [(3, 32), (3, 16), (1, 28)])
def test_shapes_and_taps(in_channels, size):
    model = ResNet18GN(num_classes=7, in_channels=in_channels, image_size=size)
    assert model.levels == LEVELS
    assert model.feature_dim == 512
    assert isinstance(model.fc, torch.nn.Linear) and model.fc.in_features == 512
    x = torch.randn(2, in_channels, size, size)
    logits, feats = model(x, return_features=True)
    assert logits.shape == (2, 7)
    assert set(feats) == set(LEVELS) | {"penultimate"}
    for name, width in zip(LEVELS, (64, 64, 128, 256, 512)):
        assert feats[name].shape == (2, width)
    assert feats["penultimate"].shape == (2, 512)
    assert (feats["penultimate"] >= 0).all()  # post-ReLU
    torch.testing.assert_close(model.fc(feats["penultimate"]), logits)
    torch.testing.assert_close(model(x), logits)


def test_params_registry_and_large_stem():
    model = build_model(
        "resnet18_gn", num_classes=5, in_channels=3, image_size=32, params={"groups": 4}
    )
    assert model.bn1.num_groups == 4 and model.layer4[1].bn2.num_groups == 4
    with pytest.raises(TypeError):
        ResNet18GN(num_classes=5, bogus=1)
    with pytest.raises(ValueError, match="bad model.params"):
        build_model("resnet18_gn", num_classes=5, in_channels=3, image_size=32, params={"bogus": 1})
    big = ResNet18GN(num_classes=5, image_size=96)  # 7x7/2 stem + max-pool
    assert big.stem == "imagenet" and big.conv1.kernel_size == (7, 7)
    logits, feats = big(torch.randn(2, 3, 96, 96), return_features=True)
    assert logits.shape == (2, 5) and feats["layer4"].shape == (2, 512)
    assert ResNet18GN(image_size=64).stem == "cifar"


def test_block_interface_matches_forward():
    """FedMLB's view of the network (clients/fedmlb.py): 5 block outputs, the last being
    the penultimate feature; resuming from any block reproduces the logits."""
    model = ResNet18GN(num_classes=4, image_size=16)
    x = torch.randn(2, 3, 16, 16)
    logits, feats = model(x, return_features=True)
    maps = model.block_forward(x)
    assert [tuple(m.shape[1:2]) for m in maps] == [(64,), (64,), (128,), (256,), (512,)]
    assert torch.equal(maps[-1], feats["penultimate"])
    for k, h in enumerate(maps):
        out, f = model.forward_from(k, h, return_features=True)
        torch.testing.assert_close(out, logits)
        torch.testing.assert_close(f["penultimate"], feats["penultimate"])
    with pytest.raises(ValueError):
        model.forward_from(5, maps[-1])
