"""FedCCL / FPL losses and the FedCCL+ attacks (fedrcl_flwr.losses.fedccl).

Reference vectors: tests/data/fedccl/fpl_fedccl_losses.npz (see README.json there), made by
running FPL's code (WenkeHuang/RethinkFL ``calculate_infonce`` / ``hierarchical_info_loss``)
unmodified in float32, on FINCH prototypes. The recorded per-sample values therefore carry
float32 rounding (up to ~1.7e-6 against an exact evaluation); the float64 comparisons use
|Δ| ≤ 1e-6 + 1e-6·|ref| per sample and 1e-6 on the batch losses.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from fedrcl_flwr.losses import fedccl as L

DATA = Path(__file__).resolve().parents[1] / "data" / "fedccl"
TAGS = ["first_ee0", "first_ee1", "last_ee0", "last_ee1"]


@pytest.fixture(scope="module")
def ref():
    return np.load(DATA / "fpl_fedccl_losses.npz")


def batch(ref, dtype=torch.float64):
    f = torch.from_numpy(ref["batch_features"]).to(dtype).requires_grad_(True)
    return f, torch.from_numpy(ref["batch_labels"])


def stacked(ref, key, classes=range(5)):
    parts = [np.atleast_2d(ref[key.format(c=c)]) for c in classes]
    vec = torch.from_numpy(np.concatenate(parts))
    lab = torch.cat([torch.full((len(p),), c, dtype=torch.long) for c, p in zip(classes, parts)])
    return vec, lab


def close_per_sample(value, expected, valid, atol=1e-6, rtol=1e-6):
    v = value.detach().double().numpy()
    assert np.all(np.isfinite(v))
    np.testing.assert_allclose(v[valid], expected[valid], atol=atol, rtol=rtol)


def test_reference_layout(ref):
    labels = ref["batch_labels"]
    assert labels.tolist()[-3:] == [5, 5, 6]  # classes without any prototype / signal
    for T in ("0.02", "0.07"):
        per = ref[f"fpl_T{T}_per_sample_[infonce,mse,sum]"]
        assert np.isnan(per[-3:]).all() and not np.isnan(per[:-3]).any()


# ------------------------------------------------------------------- FedCCL, Eqs. 16-17
@pytest.mark.parametrize("tag", TAGS)
def test_fedccl_local_and_global_match_reference(ref, tag):
    f, y = batch(ref)
    sv, sl = stacked(ref, f"fedccl_{tag}_local_signals_class{{c}}")
    gv = torch.stack(
        [torch.from_numpy(ref[f"fedccl_{tag}_global_signal_class{c}"]) for c in range(5)]
    )
    gl = torch.arange(5)
    per = ref[f"fedccl_{tag}_per_sample_[L_local,L_global,L_local_supcon_alt]_T0.07"]
    valid = ~np.isnan(per[:, 0])
    assert valid.sum() == 21

    local = L.local_cluster_contrast(f, y, sv, sl, tau=0.07, reduction="none")
    glob = L.global_cluster_contrast(f, y, gv, gl, tau=0.07, reduction="none")
    supcon = L.local_cluster_contrast(f, y, sv, sl, tau=0.07, reduction="none", form="supcon")
    close_per_sample(local, per[:, 0], valid)
    close_per_sample(glob, per[:, 1], valid)
    close_per_sample(supcon, per[:, 2], valid)
    assert torch.all(local[~torch.from_numpy(valid)] == 0)

    # default reduction = mean over the samples whose class has a signal
    for fn, key, args in [
        (L.local_cluster_contrast, "L_local", (sv, sl)),
        (L.global_cluster_contrast, "L_global", (gv, gl)),
    ]:
        mean = fn(f, y, *args, tau=0.07)
        assert abs(mean.item() - float(ref[f"fedccl_{tag}_{key}_mean_over_valid"])) < 1e-6
        by_b = fn(f, y, *args, tau=0.07, reduction="batch")
        assert abs(by_b.item() - float(ref[f"fedccl_{tag}_{key}_sum_div_B"])) < 1e-6
    alt = L.local_cluster_contrast(f, y, sv, sl, tau=0.07, form="supcon")
    assert abs(alt.item() - float(ref[f"fedccl_{tag}_L_local_supcon_alt_mean_over_valid"])) < 1e-6


def test_fedccl_float32_inputs_close(ref):
    f, y = batch(ref, torch.float32)
    sv, sl = stacked(ref, "fedccl_last_ee1_local_signals_class{c}")
    per = ref["fedccl_last_ee1_per_sample_[L_local,L_global,L_local_supcon_alt]_T0.07"]
    valid = ~np.isnan(per[:, 0])
    out = L.local_cluster_contrast(f, y, sv, sl, reduction="none")
    assert out.dtype == torch.float32
    close_per_sample(out, per[:, 0], valid, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ FPL
@pytest.mark.parametrize("T", [0.02, 0.07])
def test_fpl_prototype_loss_matches_reference(ref, T):
    f, y = batch(ref)
    pv, pl = stacked(ref, "fpl_global_cluster_protos_class{c}")
    assert pv.shape[0] == 13  # 3 clusters for classes 0-3, one for class 4
    per = ref[f"fpl_T{T}_per_sample_[infonce,mse,sum]"]
    valid = ~np.isnan(per[:, 2])
    info = L.cluster_contrast(f, y, pv, pl, tau=T, reduction="none")
    close_per_sample(info, per[:, 0], valid)
    total = L.fpl_prototype_loss(f, y, pv, pl, tau=T, reduction="none")
    close_per_sample(total, per[:, 2], valid)
    close_per_sample(total - info, per[:, 1], valid)  # the MSE part
    loss = L.fpl_prototype_loss(f, y, pv, pl, tau=T)  # FPL: sum over valid / B
    assert abs(loss.item() - float(ref[f"fpl_T{T}_batch_loss"])) < 1e-6
    loss.backward()
    assert torch.isfinite(f.grad).all() and f.grad[-3:].abs().sum() == 0


# ---------------------------------------------------------------- closed-form cases
def test_two_samples_two_signals_by_hand():
    tau = 0.5
    f = torch.tensor([[1.0, 0.0], [0.6, 0.8]], dtype=torch.float64)
    s = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)  # unnormalised
    sl = torch.tensor([0, 1])
    y = torch.tensor([0, 1])
    # sample 0: cos = (1, 0); sample 1: cos = (0.6, 0.8)
    l0 = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0 / tau)))
    l1 = -math.log(math.exp(0.8 / tau) / (math.exp(0.6 / tau) + math.exp(0.8 / tau)))
    per = L.local_cluster_contrast(f, y, s, sl, tau=tau, reduction="none")
    assert per.tolist() == pytest.approx([l0, l1], abs=1e-12)
    assert L.local_cluster_contrast(f, y, s, sl, tau=tau).item() == pytest.approx(
        (l0 + l1) / 2, abs=1e-12
    )
    assert L.global_cluster_contrast(f, y, s, sl, tau=tau).item() == pytest.approx(
        (l0 + l1) / 2, abs=1e-12
    )


def test_sum_reduction_is_the_printed_sum_over_samples():
    """Eqs. (16)-(17) as printed: Σ over the samples (those whose class has a signal),
    not their mean; the same hand values as above plus a sample without a signal."""
    tau = 0.5
    f = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], dtype=torch.float64)
    s = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    sl = torch.tensor([0, 1])
    y = torch.tensor([0, 1, 9])  # class 9: no signal, contributes nothing
    l0 = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0 / tau)))
    l1 = -math.log(math.exp(0.8 / tau) / (math.exp(0.6 / tau) + math.exp(0.8 / tau)))
    for fn in (L.local_cluster_contrast, L.global_cluster_contrast):
        assert fn(f, y, s, sl, tau=tau, reduction="sum").item() == pytest.approx(l0 + l1, abs=1e-12)
        assert fn(f, y, s, sl, tau=tau).item() == pytest.approx((l0 + l1) / 2, abs=1e-12)
        assert fn(f, y, s, sl, tau=tau, reduction="batch").item() == pytest.approx(
            (l0 + l1) / 3, abs=1e-12
        )


def test_several_positives_summed_by_hand():
    tau = 1.0
    f = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    sl = torch.tensor([3, 3, 4])
    y = torch.tensor([3])
    e = math.exp
    expect = -math.log((e(1) + e(0)) / (e(1) + e(0) + e(-1)))  # Eq. 16: Σ over P_j^L
    assert L.local_cluster_contrast(f, y, s, sl, tau=tau).item() == pytest.approx(expect)
    supcon = -0.5 * (
        math.log(e(1) / (e(1) + e(0) + e(-1))) + math.log(e(0) / (e(1) + e(0) + e(-1)))
    )
    assert L.local_cluster_contrast(f, y, s, sl, tau=tau, form="supcon").item() == pytest.approx(
        supcon
    )


def test_class_without_signal_is_excluded():
    tau = 0.5
    f = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    sl = torch.tensor([0, 1])
    y = torch.tensor([0, 1, 7])  # class 7 has no signal
    per = L.local_cluster_contrast(f, y, s, sl, tau=tau, reduction="none")
    assert per[2].item() == 0.0
    mean = L.local_cluster_contrast(f, y, s, sl, tau=tau)
    assert mean.item() == pytest.approx((per[0] + per[1]).item() / 2)
    mean.backward()
    assert torch.isfinite(f.grad).all()
    assert f.grad[2].abs().sum() == 0 and f.grad[:2].abs().sum() > 0


def test_no_sample_with_signal_gives_connected_zero():
    f = torch.randn(4, 3, requires_grad=True)
    s = torch.randn(2, 3)
    for loss in (
        L.local_cluster_contrast(f, torch.tensor([5, 5, 6, 6]), s, torch.tensor([0, 1])),
        L.global_cluster_contrast(
            f, torch.zeros(4, dtype=torch.long), s[:0], torch.zeros(0, dtype=torch.long)
        ),
        L.fpl_prototype_loss(f, torch.tensor([5, 5, 6, 6]), s, torch.tensor([0, 1])),
    ):
        assert loss.item() == 0.0
        assert loss.grad_fn is not None
        loss.backward()
        assert torch.all(f.grad == 0)


def test_gradients_finite_and_signals_get_no_grad():
    torch.manual_seed(0)
    f = torch.randn(16, 8, requires_grad=True)
    f.data[0] = 0  # a zero feature must not produce NaN
    s = torch.randn(6, 8)
    sl = torch.tensor([0, 0, 1, 1, 2, 3])
    y = torch.randint(0, 5, (16,))
    loss = L.local_cluster_contrast(f, y, s, sl) + L.global_cluster_contrast(
        f, y, s[[0, 2, 4, 5]], torch.tensor([0, 1, 2, 3])
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(f.grad).all()
    # tiny temperature: logsumexp keeps it finite
    loss = L.local_cluster_contrast(f, y, s, sl, tau=1e-3)
    assert torch.isfinite(loss)


def test_bad_arguments():
    f, s = torch.randn(2, 3), torch.randn(2, 3)
    with pytest.raises(ValueError):
        L.local_cluster_contrast(
            f, torch.tensor([0, 1]), s, torch.tensor([0, 1]), reduction="total"
        )
    with pytest.raises(ValueError):
        L.local_cluster_contrast(f, torch.tensor([0, 1]), s, torch.tensor([0, 1]), form="x")


# ------------------------------------------------------------------------- attacks
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3)
        )

    def forward(self, x):
        return self.body(x)


def test_fgsm_closed_form_linear():
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    x = torch.randn(8, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (8,))
    eps = 0.1
    # ∇_x CE = Wᵀ(softmax(Wx + b) − onehot(y))
    with torch.no_grad():
        p = torch.softmax(model(x), dim=1)
        g = (p - torch.nn.functional.one_hot(y, 3).double()) @ model.weight
    adv = L.fgsm_attack(model, x, y, eps=eps)
    assert torch.allclose(adv, x + eps * g.sign())
    adv = L.fgsm_attack(model, x, y, eps=eps, clamp=(-0.5, 0.5))
    assert torch.allclose(adv, (x + eps * g.sign()).clamp(-0.5, 0.5))
    assert all(prm.grad is None for prm in model.parameters())
    assert not adv.requires_grad


def test_pgd_stays_in_ball_increases_loss_and_restores_modes():
    torch.manual_seed(1)
    model = _Net()
    model.train()
    model.body[1].eval()  # a module deliberately in eval mode stays so
    x = torch.rand(64, 10)
    y = torch.randint(0, 3, (64,))
    eps, step = 0.1, 0.025
    with torch.no_grad():
        model.eval()
        clean = nn.functional.cross_entropy(model(x), y).item()
        model.train()
        model.body[1].eval()
    with torch.no_grad():  # the attack must work under no_grad too
        adv = L.pgd_attack(model, x, y, eps=eps, step=step, steps=10, clamp=(0.0, 1.0))
    assert (adv - x).abs().max() <= eps + 1e-6
    assert adv.min() >= 0 and adv.max() <= 1
    assert model.training and model.body[0].training and not model.body[1].training
    assert all(prm.grad is None for prm in model.parameters())
    with torch.no_grad():
        model.eval()
        attacked = nn.functional.cross_entropy(model(adv), y).item()
    assert attacked > clean
    fgsm = L.fgsm_attack(model, x, y, eps=eps)
    assert (fgsm - x).abs().max() <= eps + 1e-6
    with torch.no_grad():
        assert nn.functional.cross_entropy(model(fgsm), y).item() > clean


def test_pgd_without_random_start_is_deterministic():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x, y = torch.randn(10, 4), torch.randint(0, 2, (10,))
    a = L.pgd_attack(model, x, y, eps=0.2, step=0.05, steps=5, random_start=False)
    b = L.pgd_attack(model, x, y, eps=0.2, step=0.05, steps=5, random_start=False)
    assert torch.equal(a, b)
    one = L.pgd_attack(model, x, y, eps=0.2, step=0.2, steps=1, random_start=False)
    assert torch.allclose(one, L.fgsm_attack(model, x, y, eps=0.2))


def test_class_signals_mean_mode_is_the_count_weighted_class_mean():
    import sys

    from fedrcl_flwr.signals import class_cluster_signals

    f = np.array([[1.0, 0.0], [3.0, 2.0], [0.0, 5.0], [2.0, 2.0], [4.0, 4.0]], np.float32)
    y = np.array([2, 2, 0, 2, 0])
    had_finch = "fedrcl_flwr.clustering" in sys.modules
    s = class_cluster_signals(f, y, mode="mean")
    assert had_finch or "fedrcl_flwr.clustering" not in sys.modules  # FINCH not needed
    np.testing.assert_array_equal(s.labels, [0, 2])
    np.testing.assert_array_equal(s.counts, [2, 3])
    np.testing.assert_allclose(s.vectors, [[2.0, 4.5], [2.0, 4 / 3]], rtol=1e-6)
    assert s.vectors.dtype == np.float32
    with pytest.raises(ValueError, match="mode"):
        class_cluster_signals(f, y, mode="clusters")


def _unit(deg):
    return [math.cos(math.radians(deg)), math.sin(math.radians(deg))]


def test_class_signals_finch_early_exit_by_hand():
    """Four tight pairs of directions, two groups: (0°, 0.5°), (10°, 10.5°) and (60°, 60.5°),
    (70°, 70.5°). FINCH's first level is the four pairs (mutual first neighbours). The
    paper's recursion (no threshold) merges them on their means into the two groups; the
    reference's early exit drops every link longer than twice the pairs' own cosine
    distance (1 − cos 0.5°), so its coarsest level stays at the four pairs."""
    from fedrcl_flwr.signals import class_cluster_signals

    degs = [0, 0.5, 10, 10.5, 60, 60.5, 70, 70.5]
    f = np.array([_unit(d) for d in degs], np.float32)
    y = np.full(len(degs), 3)
    pairs = f.reshape(4, 2, 2).mean(1)
    groups = f.reshape(2, 4, 2).mean(1)

    early = class_cluster_signals(f, y, level="coarsest", early_exit=True)
    np.testing.assert_allclose(early.vectors, pairs, rtol=1e-6)
    np.testing.assert_array_equal(early.counts, [2, 2, 2, 2])
    plain = class_cluster_signals(f, y, level="coarsest", early_exit=False)
    np.testing.assert_allclose(plain.vectors, groups, rtol=1e-6)
    np.testing.assert_array_equal(plain.counts, [4, 4])
    np.testing.assert_array_equal(plain.labels, [3, 3])
    # the finest level is the pairs either way
    for ee in (True, False):
        fine = class_cluster_signals(f, y, level="finest", early_exit=ee)
        np.testing.assert_allclose(fine.vectors, pairs, rtol=1e-6)
