"""FGSM / PGD in [0, 1] pixel space: ε, step and clamp in pixel units, normalisation inside
the attacked model — for the robust evaluation and FedCCL+ training. Checked on a linear
model whose input gradient sign is known in closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedrcl_flwr.losses.fedccl import PixelSpace, dataset_pixel_stats, fgsm_attack, pgd_attack

EPS, STEP = 8 / 255, 2 / 255
MEAN = torch.tensor([0.5, 0.2, 0.7])
STD = torch.tensor([0.25, 0.1, 0.3])


class Linear2(nn.Module):
    """logits = [w·x, 0] on the *normalised* input: for label 0, ∂CE/∂x = −(1 − σ)·w, so
    the FGSM direction in pixel space is −sign(w) (std > 0 keeps the sign)."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w.clone())

    def forward(self, x):
        s = (x * self.w).flatten(1).sum(1)
        return torch.stack([s, torch.zeros_like(s)], 1)


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    pix = torch.rand(4, 3, 5, 5, generator=g)
    pix[:, :, 0, 0] = 0.0  # at the borders: the clamp must bite
    pix[:, :, 0, 1] = 1.0
    pix[:, :, 0, 2] = 0.995
    w = 0.01 * torch.randn(3, 5, 5, generator=g)  # small logits: CE gradient not saturated
    x = (pix - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    y = torch.zeros(4, dtype=torch.long)
    expect = (pix - EPS * torch.sign(w)).clamp(0, 1)
    return pix, x, y, Linear2(w), expect


def _pixels(x):
    return x * STD.view(1, 3, 1, 1) + MEAN.view(1, 3, 1, 1)


def test_fgsm_pixel_space_closed_form():
    pix, x, y, model, expect = _setup()
    adv = fgsm_attack(model, x, y, eps=EPS, mean=MEAN, std=STD)
    p = _pixels(adv)
    assert torch.allclose(p, expect, atol=1e-6)
    assert (p - pix).abs().max() <= EPS + 1e-6
    assert p.min() >= -1e-7 and p.max() <= 1 + 1e-7
    # the budget is a pixel budget: in normalised units it is eps / std per channel
    d = (adv - x).abs().amax(dim=(0, 2, 3))
    assert torch.allclose(d, EPS / STD, atol=1e-5)
    assert model.w.grad is None


def test_pgd20_pixel_space_reaches_the_pixel_ball_boundary():
    pix, x, y, model, expect = _setup(1)
    torch.manual_seed(0)
    adv = pgd_attack(model, x, y, eps=EPS, step=STEP, steps=20, mean=MEAN, std=STD)
    p = _pixels(adv)
    # constant gradient sign: 20 steps of 2/255 from anywhere in the ball end on its face
    assert torch.allclose(p, expect, atol=1e-6)
    assert (p - pix).abs().max() <= EPS + 1e-6 and p.min() >= -1e-7 and p.max() <= 1 + 1e-7


def test_pgd_with_few_steps_stays_inside_budget():
    pix, x, y, model, _ = _setup(2)
    torch.manual_seed(1)
    adv = pgd_attack(model, x, y, eps=EPS, step=STEP, steps=2, mean=MEAN, std=STD)
    p = _pixels(adv)
    assert (p - pix).abs().max() <= EPS + 1e-6 and p.min() >= -1e-7 and p.max() <= 1 + 1e-7
    assert (p - pix).abs().max() > 0


def test_pixel_space_model_normalises_inside():
    pix, x, _, model, _ = _setup()
    wrapped = PixelSpace(model, MEAN.view(1, 3, 1, 1), STD.view(1, 3, 1, 1))
    assert torch.allclose(wrapped(pix), model(x), atol=1e-5)


def test_robust_accuracy_attacks_in_pixel_space():
    from fedrcl_flwr.data.datasets import ImageArrayDataset
    from fedrcl_flwr.evaluation import robust_accuracy

    rng = np.random.default_rng(0)
    imgs = torch.from_numpy(rng.integers(0, 256, (12, 3, 5, 5), dtype=np.uint8))
    ds = ImageArrayDataset(imgs, np.zeros(12, dtype=np.int64), MEAN.tolist(), STD.tolist(), None)
    assert all(torch.allclose(a.flatten(), b) for a, b in zip(dataset_pixel_stats(ds), (MEAN, STD)))
    seen = []

    class Spy(Linear2):
        def forward(self, x):
            seen.append(x.detach().clone())
            return super().forward(x)

    model = Spy(0.01 * torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(3)))
    out = robust_accuracy(
        model, ds, torch.device("cpu"), eps=EPS, step=STEP, steps=20, batch_size=12
    )
    clean_pix = imgs.float() / 255
    for x in seen:  # every input the model saw is within the pixel ball and in [0, 1]
        p = _pixels(x)
        assert p.min() >= -1e-6 and p.max() <= 1 + 1e-6
        assert (p - clean_pix).abs().max() <= EPS + 1e-5
    # FGSM on a linear model: the closed form's accuracy
    w = model.w.detach()
    adv_pix = (clean_pix - EPS * torch.sign(w)).clamp(0, 1)
    adv_x = (adv_pix - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    want = float(((adv_x * w).flatten(1).sum(1) > 0).float().mean())
    assert out["robust_fgsm_accuracy"] == pytest.approx(want)


def test_fedccl_plus_training_examples_respect_pixel_budget(tiny):
    from clients.fedccl import FedCCLClient
    from fedrcl_flwr.run.runtime import client_partitions, load_bundle

    cfg = tiny(client={"method": "fedccl", "params": {"adversarial": True}})
    client = FedCCLClient(cfg)
    client.data = client.local_data(0)
    transform = client.batch_transform()
    bundle = load_bundle(cfg)
    ds = bundle.train.plain() if hasattr(bundle.train, "plain") else bundle.train
    idx = client_partitions(cfg)[0][:8]
    x = torch.stack([ds[int(i)][0] for i in idx])
    y = torch.as_tensor([int(ds[int(i)][1]) for i in idx])
    model = client._model()
    x_adv, y2, extra = transform(x, y, model)
    mean, std = ds.mean.view(1, -1, 1, 1), ds.std.view(1, -1, 1, 1)
    p, p0 = x_adv * std + mean, x * std + mean
    assert torch.equal(y2, y) and extra == {}
    assert (p - p0).abs().max() <= 8 / 255 + 1e-5
    assert (p - p0).abs().max() > 4 / 255  # the attack did move the pixels
    assert p.min() >= -1e-5 and p.max() <= 1 + 1e-5
