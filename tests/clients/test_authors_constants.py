"""The FedRCL authors' protocol constants, each a parameter checked by its
arithmetic: FedProx weight, FedNTD CE weight, FedAdam's τ² second moment, the rotation
augmentation, the in-round lr decay and the PyTorch-default initialisation."""

import math

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays
from helpers import FakeManager, fit_result

from clients import client_class
from fedrcl_flwr.augment import random_rotation, rotate
from fedrcl_flwr.training import Batch, LocalTrainSettings, LossTerm, train_local
from strategies import strategy_class


def _stub(method, params):
    cls = client_class(method)

    class Stub(cls):
        def __init__(self):  # only the loss-term wiring is checked
            self.p, self.device = dict(cls.defaults, **params), torch.device("cpu")
            self._received = None

    c = Stub()
    c.model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        c.model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        c.model.bias.fill_(3.0)
    c.global_weights = [np.zeros((1, 2), np.float32), np.ones(1, np.float32)]
    return c


@pytest.mark.parametrize(
    "params,weight",
    [
        ({}, 0.0005),
        ({"halve": True}, 0.0005),
        ({"halve": False}, 0.001),
        ({"mu": 0.01, "halve": False}, 0.01),
    ],
)
def test_fedprox_weight_halve_or_authors(params, weight):
    c = _stub("fedprox", params)
    ce, prox = c.loss_terms()
    assert prox.weight == pytest.approx(weight, rel=1e-12)
    b = Batch(x=None, y=None, logits=None, feats=None, model=c.model)
    # Σ‖w − w_g‖² = (1² + 2²) + (3 − 1)² = 9; the added loss is weight · 9
    assert prox.weight * float(prox.fn(b).detach()) == pytest.approx(9 * weight, rel=1e-6)


@pytest.mark.parametrize("ce_weight", [1.0, 0.7])
def test_fedntd_total_is_ce_weight_ce_plus_beta_ntd(ce_weight):
    from fedrcl_flwr.losses.baselines import fedntd_loss

    torch.manual_seed(0)
    c = _stub("fedntd", {"ce_weight": ce_weight, "beta": 0.3})
    glob = torch.nn.Linear(2, 3)
    c.frozen_model = lambda: glob
    local = torch.nn.Linear(2, 3)
    x, y = torch.randn(5, 2), torch.tensor([0, 1, 2, 0, 1])
    logits = local(x)
    b = Batch(x=x, y=y, logits=logits, feats=None, model=local)
    terms = c.loss_terms()
    total = sum(t.weight * t.fn(b) for t in terms)
    want = ce_weight * torch.nn.functional.cross_entropy(logits, y) + 0.3 * fedntd_loss(
        logits, glob(x), y, 1.0
    )
    assert [t.name for t in terms] == ["ce", "ntd"]
    assert float(total.detach()) == pytest.approx(float(want.detach()), rel=1e-6)


def _fedadam(**params):
    return strategy_class("fedadam")(
        initial_weights=[np.array([0.0])],
        trainable=[True],
        num_clients=4,
        clients_per_round=2,
        rounds=3,
        params=params,
    )


def _step(st, rnd, value):
    st.configure_fit(rnd, None, FakeManager(4))
    out, _ = st.aggregate_fit(rnd, [fit_result([np.array([value])])], [])
    return float(parameters_to_ndarrays(out)[0][0])


def test_fedadam_second_moment_starts_at_tau_squared():
    tau, lr = 0.1, 0.5  # a large τ makes the τ² start visible
    st = _fedadam(server_lr=lr, beta1=0.9, beta2=0.99, tau=tau)
    assert st.p["v_init_tau_sq"] is True
    np.testing.assert_allclose(st.v[0], [tau * tau])
    w1 = _step(st, 1, 1.0)
    m1, v1 = 0.1, 0.99 * tau**2 + 0.01
    assert w1 == pytest.approx(lr * m1 / (math.sqrt(v1) + tau), rel=1e-12)
    w2 = _step(st, 2, w1 + 1.0)
    m2, v2 = 0.9 * m1 + 0.1, 0.99 * v1 + 0.01
    assert w2 == pytest.approx(w1 + lr * m2 / (math.sqrt(v2) + tau), rel=1e-12)
    zero = _fedadam(server_lr=lr, beta1=0.9, beta2=0.99, tau=tau, v_init_tau_sq=False)
    assert _step(zero, 1, 1.0) == pytest.approx(lr * 0.1 / (0.1 + tau), rel=1e-12)
    from fedrcl_flwr.config import ConfigError

    with pytest.raises(ConfigError, match="v_init_tau_sq .* must be true or false"):
        _fedadam(v_init_tau_sq=1)


def test_rotate_by_90_is_rot90_and_zero_is_identity():
    x = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).view(2, 3, 6, 6)
    assert torch.equal(rotate(x, torch.zeros(2)), x)
    # counter-clockwise by 90° = torch.rot90 over (H, W)
    assert torch.equal(rotate(x, torch.full((2,), 90.0)), torch.rot90(x, 1, dims=(2, 3)))
    assert torch.equal(rotate(x, torch.tensor([90.0, 0.0]))[1], x[1])


def test_random_rotation_angles_bounded_and_corners_black():
    # a white square image rotated by θ: the zero-filled corner area is 1 − |overlap|; at
    # most 10° → at most 4·(s²/2)·tan(10°)/(1+tan(10°)) per corner triangle, not zero
    x = torch.ones(400, 1, 32, 32)
    g = torch.Generator().manual_seed(0)
    out = random_rotation(x, 10.0, generator=g)
    black = (out == 0).float().mean((1, 2, 3))
    assert black.max() < 2 * math.tan(math.radians(10)) / 4 + 0.03
    assert (black > 0).float().mean() > 0.8  # most samples are turned
    g2 = torch.Generator().manual_seed(0)
    angles = (torch.rand(400, generator=g2) * 2 - 1) * 10
    assert torch.equal(out, rotate(x, angles))
    assert angles.abs().max() <= 10 and angles.min() < -5 < 5 < angles.max()


def test_dataset_rotation_key_reaches_the_training_batches():
    from fedrcl_flwr.data.datasets import load_dataset

    syn = {"num_train": 64, "num_test": 16, "num_classes": 2, "image_size": 16}
    plain = load_dataset("synthetic", synthetic=syn, seed=0)
    rot = load_dataset("synthetic", synthetic=syn, seed=0, rotation=10.0)
    assert plain.train.augment.rotation == 0 and rot.train.augment.rotation == 10.0
    idx = np.arange(8)
    a, _ = plain.train.get_batch(idx, torch.Generator().manual_seed(1))
    b, _ = rot.train.get_batch(idx, torch.Generator().manual_seed(1))
    assert not torch.equal(a, b)
    # the same draws by hand: rotation (first draws) on [0, 1] pixels, normalise, crop/flip
    from fedrcl_flwr.augment import random_crop_flip

    g = torch.Generator().manual_seed(1)
    u = random_rotation(rot.train.images[:8].float() / 255.0, 10.0, generator=g)
    want = random_crop_flip(
        (u - rot.train.mean) / rot.train.std,
        pad=rot.train.augment.crop_pad,
        flip=rot.train.augment.flip,
        generator=g,
    )
    assert torch.allclose(b, want, atol=1e-6)
    # crop_pad overrides the dataset's padding (synthetic: 2); 0 = flip only
    assert load_dataset("synthetic", synthetic=syn, seed=0, crop_pad=4).train.augment.crop_pad == 4
    flip_only = load_dataset("synthetic", synthetic=syn, seed=0, crop_pad=0).train
    g = torch.Generator().manual_seed(3)
    c, _ = flip_only.get_batch(idx, g)
    do = torch.rand(8, generator=torch.Generator().manual_seed(3)) < 0.5
    x0 = flip_only.plain().get_batch(idx)[0]
    assert torch.equal(c, torch.where(do[:, None, None, None], x0.flip(3), x0))


def test_epoch_lr_decay_sets_lr_per_local_epoch():
    # one weight w, loss = w (gradient 1): plain SGD moves w by −lr_e per step
    w = torch.nn.Parameter(torch.tensor([0.0]))
    model = torch.nn.Module()
    model.w = w
    model.forward = lambda x: w.expand(x.shape[0], 1)
    term = LossTerm("lin", lambda b: b.model.w.sum(), 1.0)

    def batches(epoch):
        return [(torch.zeros(1, 1), torch.zeros(1, dtype=torch.long))] * 2

    s = LocalTrainSettings(lr=0.1, epochs=3, weight_decay=0.0, epoch_lr_decay=0.5)
    train_local(model, batches, [term], s, torch.device("cpu"))
    # 2 steps per epoch at 0.1, 0.05, 0.025
    assert float(w.detach()) == pytest.approx(-2 * (0.1 + 0.05 + 0.025), rel=1e-6)
    w.data.zero_()
    train_local(model, batches, [term], LocalTrainSettings(lr=0.1, epochs=3), torch.device("cpu"))
    assert float(w.detach()) == pytest.approx(-0.6, rel=1e-6)


@pytest.mark.integration
def test_client_passes_epoch_lr_decay(tiny, tmp_path, monkeypatch):
    import clients.local_round as local_round
    from fedrcl_flwr.app.inprocess import run_inprocess

    seen = []
    real = local_round.train_local

    def spy(model, batches, terms, settings, device, **kw):
        seen.append((settings.lr, settings.epoch_lr_decay))
        return real(model, batches, terms, settings, device, **kw)

    monkeypatch.setattr(local_round, "train_local", spy)
    cfg = tiny(federation={"rounds": 2}, client={"epoch_lr_decay": 0.9, "lr_decay": 0.5})
    run_inprocess(cfg, tmp_path / "run")
    # 2 clients per round; the round lr 0.05 · 0.5^(t−1), the in-round decay on top
    assert seen == [(0.05, 0.9)] * 2 + [(0.025, 0.9)] * 2


def test_model_init_pytorch_default_vs_kaiming(tiny):
    from fedrcl_flwr.run.runtime import initial_model, load_bundle

    own = tiny(model={"name": "resnet18_gn"})
    dflt = tiny(model={"name": "resnet18_gn", "init": "pytorch"})
    a, b = initial_model(own, load_bundle(own)), initial_model(dflt, load_bundle(dflt))
    wa, wb = a.layer3[0].conv1.weight, b.layer3[0].conv1.weight  # 256×128×3×3
    fan_in, fan_out = 128 * 9, 256 * 9
    # Kaiming normal, fan_out: std sqrt(2 / fan_out); PyTorch default: U(±1/sqrt(fan_in)),
    # std 1/sqrt(3·fan_in)
    assert float(wa.std()) == pytest.approx(math.sqrt(2 / fan_out), rel=0.02)
    assert float(wb.abs().max()) <= 1 / math.sqrt(fan_in)
    assert float(wb.std()) == pytest.approx(1 / math.sqrt(3 * fan_in), rel=0.02)
    # the classifier's bias: PyTorch default is non-zero U(±1/sqrt(512)) in both
    assert float(b.fc.bias.abs().max()) <= 1 / math.sqrt(512)


@pytest.mark.integration
def test_local_representation_metrics_on_the_trained_local_models(tiny, tmp_path, monkeypatch):
    import fedrcl_flwr.representation as rep
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.run.results import read_metrics
    from fedrcl_flwr.run.runtime import sample_partitions

    seen = []
    real = rep.representation_record

    def spy(model, dataset, device, **kw):
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return real(model, dataset, device, **kw)

    monkeypatch.setattr(rep, "representation_record", spy)
    cfg = tiny(
        federation={"rounds": 1},
        evaluation={"local_representation_every": 1, "representation_every": 0},
    )
    run_inprocess(cfg, tmp_path / "run")
    rec = read_metrics(tmp_path / "run")[-1]
    # two sampled clients measured their models; FedAvg (uniform) averages exactly those
    assert len(seen) == 2
    final = torch.load(tmp_path / "run" / "model.pt", map_location="cpu")
    final = final.get("model", final) if isinstance(final, dict) else final
    floats = [k for k, v in final.items() if v.is_floating_point()]
    assert len(floats) >= 4 and set(floats) <= set(seen[0])
    for k in floats:
        torch.testing.assert_close(final[k], (seen[0][k] + seen[1][k]) / 2, rtol=1e-5, atol=1e-6)
    per = rec["local_repr_effective_rank_per_client"]
    assert sorted(per) == [str(p) for p in sample_partitions(cfg.seed, 1, 8, 2)]
    assert rec["local_repr_effective_rank"] == pytest.approx(np.mean(list(per.values())))
    assert 1.0 <= rec["local_repr_effective_rank"] <= 512
    assert "local_repr_vci" in rec and "repr_effective_rank" not in rec
    off = tiny(federation={"rounds": 1})
    run_inprocess(off, tmp_path / "off")
    assert not any(k.startswith("local_repr") for k in read_metrics(tmp_path / "off")[-1])


def test_fedrcl_paper_yamls_use_the_authors_protocol():
    import glob
    import re
    from pathlib import Path

    from fedrcl_flwr.config import load_config

    root = Path(__file__).resolve().parents[2] / "experiments" / "fedrcl"
    files = sorted(glob.glob(str(root / "table[12345ACD]*.yaml")))
    assert len(files) == 49
    for f in files:
        cfg = load_config(f)
        assert cfg.dataset.rotation == 10 and cfg.dataset.augment, f
        # the authors' models/: PyTorch's default init, except VGG9_base's own conv init
        init = "model" if cfg.model.name == "vgg9_gn" else "pytorch"
        assert cfg.model.init == init and cfg.client.epoch_lr_decay == 0.998, f
        assert cfg.partition.seed == 0, f
        assert cfg.dataset.crop_pad == (4 if cfg.dataset.name == "tinyimagenet" else None), f
        if cfg.server.strategy == "fedadam":
            assert cfg.server.params["v_init_tau_sq"] is True, f
        text = Path(f).read_text()
        for line in re.findall(r"client.method=fedprox .*", text):
            assert "{mu: 0.001, halve: false}" in line, f
        for line in re.findall(r"client.method=fedntd .*", text):
            assert "{beta: 0.3, ce_weight: 0.7}" in line, f
