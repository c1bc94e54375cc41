"""backbone_mlp: a feature extractor + two-layer MLP head (FedCCL's inter-domain model).

Everything here uses randomly initialised backbones (no download); the timm ones (the
paper's 192-wide vit_tiny_patch16_224) need timm, which the ``test`` extra installs.
"""

import pytest
import torch

from fedrcl_flwr.models import MODEL_NAMES, build_model
from fedrcl_flwr.models.backbone import BackboneMLP


def _model(seed=0, **params):
    torch.manual_seed(seed)
    p = {"backbone": "resnet18", **params}
    return build_model("backbone_mlp", num_classes=10, in_channels=3, image_size=32, params=p)


def test_registered():
    assert "backbone_mlp" in MODEL_NAMES


def test_forward_shapes_and_interface():
    m = _model()
    x = torch.randn(4, 3, 32, 32)
    assert m(x).shape == (4, 10)
    logits, feats = m(x, return_features=True)
    assert logits.shape == (4, 10)
    assert tuple(m.levels) == ("backbone", "penultimate")
    assert set(m.levels) <= set(feats)
    assert feats["backbone"].shape == (4, 512)  # resnet18's pooled feature width
    assert feats["penultimate"].shape == (4, 128)
    assert feats["hidden"] is feats["penultimate"]  # the paper's decision-making layer
    assert m.feature_dim == 128 and m.fc.in_features == 128
    # exactly two linear layers after the backbone: 512 -> 128 -> 10
    head = [
        mod
        for n, mod in m.named_modules()
        if isinstance(mod, torch.nn.Linear) and not n.startswith("backbone")
    ]
    assert [(x.in_features, x.out_features) for x in head] == [(512, 128), (128, 10)]
    # penultimate is the input of fc and equals relu(mlp1(backbone))
    assert torch.allclose(m.fc(feats["penultimate"]), logits, atol=1e-6)
    assert torch.allclose(torch.relu(m.mlp1(feats["backbone"])), feats["penultimate"])


def test_hidden_width_and_other_torchvision_backbone():
    m = build_model(
        "backbone_mlp",
        num_classes=7,
        in_channels=3,
        image_size=32,
        params={"backbone": "mobilenet_v3_small", "hidden": 64},
    )
    logits, feats = m(torch.randn(2, 3, 32, 32), return_features=True)
    assert logits.shape == (2, 7) and feats["penultimate"].shape == (2, 64)


def test_single_channel_input():
    m = build_model(
        "backbone_mlp",
        num_classes=10,
        in_channels=1,
        image_size=32,
        params={"backbone": "resnet18"},
    )
    assert m(torch.randn(2, 1, 32, 32)).shape == (2, 10)


def test_frozen_backbone_has_no_grad_and_stays_eval():
    m = _model()
    assert all(not p.requires_grad for p in m.backbone.parameters())
    assert all(p.requires_grad for n, p in m.named_parameters() if not n.startswith("backbone."))
    m.train()
    assert m.training and not m.backbone.training
    before = {k: v.clone() for k, v in m.backbone.state_dict().items()}
    m(torch.randn(4, 3, 32, 32)).sum().backward()
    assert all(p.grad is None for p in m.backbone.parameters())
    assert m.fc.weight.grad is not None and m.mlp1.weight.grad is not None
    after = m.backbone.state_dict()  # BN running stats untouched in train mode
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_frozen_backbone_still_passes_input_gradients():
    m = _model()
    x = torch.randn(2, 3, 32, 32, requires_grad=True)
    m(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0  # PGD (FedCCL+) needs this


def test_unfrozen_backbone_trains():
    m = _model(freeze_backbone=False)
    assert all(p.requires_grad for p in m.backbone.parameters())
    m.train()
    assert m.backbone.training


def test_weights_loaded_from_state_dict(tmp_path):
    src = _model(seed=1)
    path = tmp_path / "backbone.pth"
    torch.save(src.backbone.state_dict(), path)
    plain = _model(seed=2)
    loaded = _model(seed=2, weights=str(path))
    saved = torch.load(path, weights_only=True)
    for k, v in loaded.backbone.state_dict().items():
        assert torch.equal(v, saved[k]), k
    x = torch.randn(3, 3, 32, 32)
    src.eval(), plain.eval(), loaded.eval()
    with torch.no_grad():
        f_src = src(x, return_features=True)[1]["backbone"]
        f_plain = plain(x, return_features=True)[1]["backbone"]
        f_loaded = loaded(x, return_features=True)[1]["backbone"]
        assert torch.allclose(f_loaded, f_src, atol=1e-6)
        assert not torch.allclose(f_loaded, f_plain, atol=1e-3)
        assert not torch.allclose(loaded(x), plain(x), atol=1e-4)  # weights change outputs


def test_full_classifier_checkpoint_ignores_its_head(tmp_path):
    import torchvision

    torch.manual_seed(3)
    full = torchvision.models.resnet18(weights=None)  # has fc.weight / fc.bias
    path = tmp_path / "resnet18_full.pt"
    torch.save({"state_dict": full.state_dict()}, path)
    m = _model(weights=str(path))
    assert torch.equal(m.backbone.conv1.weight, full.conv1.weight)


def test_missing_weights_file_is_one_clear_error(tmp_path):
    missing = tmp_path / "nope" / "tiny_vit.pth"
    with pytest.raises(ValueError, match="nope/tiny_vit.pth") as err:
        _model(weights=str(missing))
    # names what to fetch (torchvision's URL) and how to save it
    assert "download.pytorch.org/models/resnet18" in str(err.value)
    assert "torchvision.models.get_model('resnet18', weights='DEFAULT')" in str(err.value)


def test_vit_tiny_is_192_wide_with_the_paper_head():
    pytest.importorskip("timm")
    torch.manual_seed(0)
    m = build_model(
        "backbone_mlp",
        num_classes=10,
        in_channels=3,
        image_size=32,
        params={"backbone": "vit_tiny"},
    )
    logits, feats = m(torch.randn(2, 3, 32, 32), return_features=True)
    assert m.backbone_dim == 192 and feats["backbone"].shape == (2, 192)
    assert (m.mlp1.in_features, m.mlp1.out_features) == (192, 128)
    assert (m.fc.in_features, m.fc.out_features) == (128, 10)
    assert feats["penultimate"].shape == (2, 128) and logits.shape == (2, 10)
    # trainable: the head only (backbone frozen by default)
    n_train = sum(p.numel() for p in m.parameters() if p.requires_grad)
    assert n_train == 192 * 128 + 128 + 128 * 10 + 10


def test_vit_tiny_missing_weights_names_the_hub_file(tmp_path):
    pytest.importorskip("timm")
    with pytest.raises(ValueError) as err:
        build_model(
            "backbone_mlp",
            num_classes=10,
            in_channels=3,
            image_size=32,
            params={"backbone": "vit_tiny", "weights": str(tmp_path / "v.pth")},
        )
    msg = str(err.value)
    assert "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k" in msg
    assert "timm.create_model('vit_tiny_patch16_224', pretrained=True)" in msg
    assert "\n" not in msg


def test_vit_tiny_weights_round_trip(tmp_path):
    timm = pytest.importorskip("timm")
    torch.manual_seed(1)
    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=1000)
    path = tmp_path / "vit_tiny_patch16_224.pth"
    torch.save(src.state_dict(), path)  # a full 224-px classifier checkpoint
    m = build_model(
        "backbone_mlp",
        num_classes=10,
        in_channels=3,
        image_size=32,
        params={"backbone": "vit_tiny", "weights": str(path)},
    )
    assert torch.equal(m.backbone.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)
    assert m.backbone.pos_embed.shape[1] == 1 + (32 // 16) ** 2  # resampled grid


def test_mismatched_weights_are_an_error(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"foo.weight": torch.zeros(3)}, path)
    with pytest.raises(ValueError, match="does not match"):
        _model(weights=str(path))
    path2 = tmp_path / "notdict.pth"
    torch.save(torch.zeros(3), path2)
    with pytest.raises(ValueError, match="state_dict"):
        _model(weights=str(path2))


def test_unknown_backbone_and_params():
    with pytest.raises(ValueError, match="backbone"):
        _model(backbone="alexnet9000")
    with pytest.raises(ValueError, match="bad model.params"):
        _model(hiden=64)


def test_timm_backbone_without_timm_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_timm(name, *args, **kwargs):
        if name == "timm" or name.startswith("timm."):
            raise ImportError("No module named 'timm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_timm)
    with pytest.raises(ValueError, match="pip install timm"):
        BackboneMLP(num_classes=10, in_channels=3, image_size=32, backbone="tiny_vit_5m")
