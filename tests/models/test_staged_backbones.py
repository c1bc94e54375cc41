"""FedRCL Table C backbones (CIFAR-sized VGG-9, MobileNet-V2, ShuffleNet-V2, SqueezeNet):
level shapes, that the features are taps of the forward pass, gradient flow to every
level, and two FedRCL rounds with multi-level contrast from each Table C YAML."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.fedrcl import resolve_levels
from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.config import load_config
from fedrcl_flwr.models import MODELS, build_model
from fedrcl_flwr.run.results import read_metrics

ROOT = Path(__file__).resolve().parents[2]

# level -> (channels, spatial side of the tapped map) for a 32x32 input, from each
# architecture's paper with the CIFAR strides of its module docstring
EXPECTED = {
    "vgg9_gn": (
        {
            "layer0": (32, 32),
            "layer1": (64, 16),
            "layer2": (128, 16),
            "layer3": (128, 8),
            "layer4": (256, 8),
            "layer5": (256, 4),
        },
        512,
    ),
    "mobilenet_v2_gn": (
        {
            "layer0": (32, 32),
            "layer1": (16, 32),
            "layer2": (24, 32),
            "layer3": (32, 16),
            "layer4": (64, 8),
            "layer5": (96, 8),
            "layer6": (160, 4),
            "layer7": (320, 4),
        },
        1280,
    ),
    "shufflenet_v2_gn": (
        {"layer0": (24, 32), "layer1": (116, 16), "layer2": (232, 8), "layer3": (464, 4)},
        1024,
    ),
    "squeezenet_gn": (
        {
            "layer0": (96, 16),
            "layer1": (128, 16),
            "layer2": (128, 16),
            "layer3": (256, 8),
            "layer4": (256, 8),
            "layer5": (384, 8),
            "layer6": (384, 8),
            "layer7": (512, 4),
        },
        512,
    ),
}
NAMES = sorted(EXPECTED)


def _model(name, num_classes=7, in_channels=3, **params):
    torch.manual_seed(0)
    return build_model(
        name, num_classes=num_classes, in_channels=in_channels, image_size=32, params=params
    )


def _tap_modules(name, model):
    """The modules whose output is each level's map (SqueezeNet: before the bypass and
    pool that follow fire2..fire8), in level order, to hook."""
    if name == "vgg9_gn":
        mods = list(model.blocks)
    elif name in ("mobilenet_v2_gn", "shufflenet_v2_gn"):
        mods = [model.stem, *model.stages]
    else:  # squeezenet: stem, then fire2..fire8 with bypass / pool applied after the module
        mods = [model.stem, *list(model.fires)[:-1]]
    return mods


def test_models_are_registered_and_backbone_mlp_stays():
    assert set(NAMES) <= set(MODELS)
    assert "backbone_mlp" in MODELS and "resnet18_gn" in MODELS


@pytest.mark.parametrize("name", NAMES)
def test_level_shapes_and_logits(name):
    shapes, pen = EXPECTED[name]
    model = _model(name)
    assert tuple(model.levels) == tuple(shapes)
    assert model.feature_dim == pen and model.fc.in_features == pen
    x = torch.randn(3, 3, 32, 32)
    logits, feats = model(x, return_features=True)
    assert logits.shape == (3, 7)
    assert set(feats) == set(shapes) | {"penultimate"}
    for lv, (c, _) in shapes.items():
        assert feats[lv].shape == (3, c), lv
    assert feats["penultimate"].shape == (3, pen)
    # the plain call is the same function, and fc(penultimate) gives the logits
    torch.testing.assert_close(model(x), logits)
    torch.testing.assert_close(model.fc(feats["penultimate"]), logits)
    # GroupNorm everywhere, no BatchNorm (FedRCL's normalisation choice)
    kinds = {type(m).__name__ for m in model.modules()}
    assert "GroupNorm" in kinds and not any(k.startswith("BatchNorm") for k in kinds)


@pytest.mark.parametrize("name", NAMES)
def test_features_are_taps_of_the_forward_pass(name):
    shapes, _ = EXPECTED[name]
    model = _model(name)
    caught = []
    handles = [
        m.register_forward_hook(lambda mod, inp, out: caught.append((inp[0], out)))
        for m in _tap_modules(name, model)
    ]
    pen = []
    handles.append(model.fc.register_forward_pre_hook(lambda mod, inp: pen.append(inp[0])))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        _, feats = model(x, return_features=True)
    for h in handles:
        h.remove()
    assert len(caught) == len(shapes)
    for i, (lv, (c, side)) in enumerate(shapes.items()):
        inp, out = caught[i]
        if name == "squeezenet_gn" and i > 0:  # fire2..fire8: bypass and pool after
            from fedrcl_flwr.models.squeezenet import _FIRES

            _, _, bypass, pool = _FIRES[i - 1]
            out = out + inp if bypass else out
            out = F.max_pool2d(out, 2) if pool else out
        assert out.shape[1:] == (c, side, side), lv
        torch.testing.assert_close(feats[lv], out.mean((2, 3)), rtol=0, atol=0)
        # each tap feeds the next stage: the next hooked module's input is this map
        if i + 1 < len(caught) and not (name == "squeezenet_gn"):
            assert torch.equal(caught[i + 1][0], caught[i][1])
    torch.testing.assert_close(feats["penultimate"], pen[0], rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_flow_to_every_level(name):
    model = _model(name)
    x = torch.randn(4, 3, 16, 16)  # 16x16 keeps it quick; every stage still has a map
    first = next(p for n, p in model.named_parameters() if p.dim() == 4)
    _, feats = model(x, return_features=True)  # one forward; one backward per level
    for lv in model.levels:
        g_first, g_fc = torch.autograd.grad(
            feats[lv].pow(2).sum(), (first, model.fc.weight), retain_graph=True, allow_unused=True
        )
        assert g_first is not None and g_first.abs().sum() > 0, lv
        assert g_fc is None or g_fc.abs().sum() == 0  # a tap lies before the classifier
    # CE on the logits + every level: every parameter gets a non-zero gradient
    model.zero_grad()
    logits, feats = model(x, return_features=True)
    loss = F.cross_entropy(logits, torch.arange(4) % 7) + sum(
        feats[lv].pow(2).mean() for lv in model.levels
    )
    loss.backward()
    dead = [
        n
        for n, p in model.named_parameters()
        if p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0
    ]
    assert not dead, dead


@pytest.mark.parametrize("name", NAMES)
def test_fedmlb_blocks_compute_the_same_function(name):
    from clients.fedmlb import has_blocks

    model = _model(name)
    assert has_blocks(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits, feats = model(x, return_features=True)
        maps = model.block_forward(x)
        assert len(maps) == len(model.levels) + 1
        for lv, m in zip(model.levels, maps):  # the blocks end at the levels
            torch.testing.assert_close(m.mean((2, 3)), feats[lv], rtol=0, atol=0)
        torch.testing.assert_close(maps[-1], feats["penultimate"], rtol=0, atol=0)
        for k, h in enumerate(maps):  # resuming from any block gives the same logits
            torch.testing.assert_close(model.forward_from(k, h), logits)
    with pytest.raises(ValueError, match="out of range"):
        model.forward_from(len(maps), maps[-1])


@pytest.mark.parametrize("name", NAMES)
def test_one_channel_input_and_group_option(name):
    groups = {"vgg9_gn": 4, "mobilenet_v2_gn": 8, "shufflenet_v2_gn": 1, "squeezenet_gn": 4}[name]
    model = _model(name, in_channels=1, groups=groups)
    logits = model(torch.randn(2, 1, 32, 32))
    assert logits.shape == (2, 7)
    gn = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert gn and all(m.num_groups == groups for m in gn)


def test_bad_model_params_are_value_errors():
    with pytest.raises(ValueError, match="model 'vgg9_gn': bad model.params"):
        build_model("vgg9_gn", num_classes=3, in_channels=3, image_size=32, params={"depth": 11})
    with pytest.raises(ValueError, match="width"):
        build_model(
            "shufflenet_v2_gn", num_classes=3, in_channels=3, image_size=32, params={"width": 3.0}
        )
    with pytest.raises(ValueError, match="groups=4 must divide"):
        build_model(
            "shufflenet_v2_gn", num_classes=3, in_channels=3, image_size=32, params={"groups": 4}
        )


TABLE_C = sorted((ROOT / "experiments" / "fedrcl").glob("tableC_*.yaml"))


def test_table_c_files_use_the_cifar_backbones():
    models = {load_config(p).model.name for p in TABLE_C}
    assert models == set(NAMES)
    for p in TABLE_C:
        cfg = load_config(p)
        assert cfg.client.method == "fedrcl" and cfg.dataset.name == "cifar100"
        assert cfg.partition.alpha == 0.3
        # beta = 2 for MobileNet, 1 (the default) for the others (paper Supp. C)
        beta = cfg.client.params.get("beta", 1.0)
        assert beta == (2.0 if cfg.model.name == "mobilenet_v2_gn" else 1.0), p.name


def _tiny_overrides(tmp_path):
    return [
        # 16x16 so that it takes seconds (the 32x32 shapes are tested above)
        "dataset={name: synthetic, synthetic: {num_train: 48, num_test: 16, num_classes: 4, "
        "image_size: 16, channels: 3, subclusters: 2}}",
        "federation={num_clients: 4, rounds: 2, participation: null, clients_per_round: 2, "
        "eval_every: 1}",
        "client.local_epochs=1",
        "client.iterations_per_epoch=1",
        "client.device=cpu",
        "evaluation={ema: 0.9, target_rounds: [2], batch_size: 16}",
        f"output={{dir: {tmp_path / 'run'}, checkpoint_every: 0}}",
    ]


@pytest.mark.integration
@pytest.mark.parametrize("path", TABLE_C, ids=lambda p: p.stem)
def test_table_c_yaml_runs_fedrcl_two_rounds_multilevel(path, tmp_path):
    cfg = load_config(path, _tiny_overrides(tmp_path))
    model = build_model(
        cfg.model.name, num_classes=4, in_channels=3, image_size=16, params=cfg.model.params
    )
    levels = resolve_levels(cfg.client.params.get("levels", ["all"]), tuple(model.levels))
    assert len(levels) >= 4  # multi-level contrast
    st = run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == [1, 2]
    assert all(math.isfinite(r["train_loss_rcl"]) and r["train_loss_rcl"] > 0 for r in recs)
    assert all(math.isfinite(r["test_loss"]) for r in recs)
    assert all(np.all(np.isfinite(w)) for w in st.weights if w.dtype.kind == "f")


@pytest.mark.integration
def test_table_c_fedmlb_row_runs(tmp_path):
    """The FedMLB row of a Table C header (the models have FedMLB's block interface)."""
    path = ROOT / "experiments" / "fedrcl" / "tableC_cifar100_vgg9.yaml"
    cfg = load_config(
        path,
        _tiny_overrides(tmp_path)
        + ["client.method=fedmlb", "client.params={lam1: 1.0, lam2: 1.0}"],
    )
    run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == [1, 2]
    assert all(math.isfinite(r["train_loss_mlb_ce"]) and r["train_loss_mlb_ce"] > 0 for r in recs)
