"""FedRCL's relaxed contrastive loss (fedrcl_flwr.losses.rcl).

``variant="official"`` is checked against values produced by the authors' released code
(tests/data/fedrcl/, see its README.md): 5 seeds x 5 hyper-parameter settings, totals and
per-anchor values to 1e-6 (float64), gradients to 1e-5. ``variant="paper"`` (Eq. 5 / Eq. 2)
is checked against a plain-math evaluation of the documented normalisation.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrcl_flwr.losses.rcl import rcl_loss, scl_loss

DATA = Path(__file__).resolve().parents[1] / "data" / "fedrcl"
LEVELS = 5
SETTINGS = {
    "S1_default": dict(tau=0.05, lam=0.7, beta=1.0, topk_pos=1, topk_neg=2),
    "S2_scl_only_beta0": dict(tau=0.05, lam=0.7, beta=0.0, topk_pos=1, topk_neg=2),
    "S3_tau0.1_lam0.5": dict(tau=0.1, lam=0.5, beta=1.0, topk_pos=1, topk_neg=2),
    "S4_tau0.2_lam0.8_beta0.5": dict(tau=0.2, lam=0.8, beta=0.5, topk_pos=1, topk_neg=2),
    "S5_kpos3_kneg16": dict(tau=0.05, lam=0.7, beta=1.0, topk_pos=3, topk_neg=16),
}
TOL = 1e-6
GRAD_TOL = 1e-5


def _case(seed: int):
    return np.load(DATA / f"rcl_case_seed{seed}.npz")


# ----------------------------------------------------------------------------- official


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_official_matches_reference(seed, setting):
    d = _case(seed)
    cfg = SETTINGS[setting]
    y = torch.from_numpy(d["labels"])
    feats = [torch.from_numpy(d[f"pooled64_layer{lvl}"]).requires_grad_() for lvl in range(LEVELS)]
    total, info = rcl_loss(feats, y, **cfg, return_per_anchor=True)
    assert total.dtype == torch.float64

    assert abs(total.item() - d[f"{setting}__rcl_total_f64"]) <= TOL
    assert abs(info["scl_mean"].item() - d[f"{setting}__scl_f64"]) <= TOL
    np.testing.assert_allclose(
        info["scl"].detach().numpy(), d[f"{setting}__scl_per_anchor_f64"], rtol=0, atol=TOL
    )
    if cfg["beta"] == 0:
        assert info["penalty"] is None and info["penalty_mean"] is None
    else:
        assert abs(info["penalty_mean"].item() - d[f"{setting}__pen_f64"]) <= TOL
        np.testing.assert_allclose(
            info["penalty"].detach().numpy(), d[f"{setting}__pen_per_anchor_f64"], rtol=0, atol=TOL
        )

    total.backward()
    for lvl in range(LEVELS):
        # d/d(4-D input) of a spatial mean spreads g/HW over HW positions, so its norm
        # is ||g_pooled|| / sqrt(HW).
        gnorm = feats[lvl].grad.norm().item() / math.sqrt(int(d[f"layer{lvl}_hw"]))
        assert abs(gnorm - d[f"{setting}__gradnorm_layer{lvl}_f32"]) <= GRAD_TOL


def test_official_full_gradient_through_pooling():
    """Seed 0, S1: raw 4-D stage tensors -> adaptive_avg_pool2d -> loss; full gradient."""
    d = _case(0)
    y = torch.from_numpy(d["labels"])
    maps = [torch.from_numpy(d[f"layer{lvl}"]).double().requires_grad_() for lvl in range(LEVELS)]
    feats = [F.adaptive_avg_pool2d(m, 1).flatten(1) for m in maps]
    total = rcl_loss(feats, y, **SETTINGS["S1_default"])
    assert abs(total.item() - d["S1_default__rcl_total_f64"]) <= TOL
    total.backward()
    for lvl in range(LEVELS):
        np.testing.assert_allclose(
            maps[lvl].grad.numpy(), d[f"S1_default__grad_layer{lvl}_f32"], rtol=0, atol=GRAD_TOL
        )


def test_official_float32_close_to_reference():
    d = _case(1)
    y = torch.from_numpy(d["labels"])
    feats = [torch.from_numpy(d[f"pooled64_layer{lvl}"]).float() for lvl in range(LEVELS)]
    total = rcl_loss(feats, y, **SETTINGS["S1_default"])
    assert total.dtype == torch.float32
    assert abs(total.item() - d["S1_default__rcl_total_f64"]) <= 1e-5


def test_scl_loss_official_is_rcl_without_penalty():
    d = _case(2)
    y = torch.from_numpy(d["labels"])
    feats = [torch.from_numpy(d[f"pooled64_layer{lvl}"]) for lvl in range(LEVELS)]
    s = scl_loss(feats, y, tau=0.05, topk_pos=1, topk_neg=2)
    assert abs(s.item() - d["S1_default__scl_f64"]) <= TOL
    r = rcl_loss(feats, y, tau=0.05, beta=0.0)
    assert s.item() == r.item()


# ------------------------------------------------------------------------------- paper


def _paper_reference(feats, labels, tau, lam, beta):
    """Plain-math Eq. 5 with the documented normalisation: mean over positives j≠i,
    P(i) = {k≠i : y_k = y_i, s_ik > λ}, mean over anchors that have a positive."""
    n = len(labels)
    unit = [[v / math.sqrt(sum(c * c for c in f)) for v in f] for f in feats]
    s = [[sum(a * b for a, b in zip(unit[i], unit[k])) for k in range(n)] for i in range(n)]
    per_anchor = []
    for i in range(n):
        pos = [j for j in range(n) if j != i and labels[j] == labels[i]]
        if not pos:
            continue
        denom = sum(math.exp(s[i][k] / tau) for k in range(n) if k != i)
        scl = sum(-math.log(math.exp(s[i][j] / tau) / denom) for j in pos) / len(pos)
        p_set = [k for k in pos if s[i][k] > lam]
        pen = math.log(sum(math.exp(s[i][k] / tau) for k in p_set) + math.exp(1 / tau))
        per_anchor.append(scl + beta * pen)
    return sum(per_anchor) / len(per_anchor) if per_anchor else 0.0


def test_paper_variant_three_samples_closed_form():
    a = 0.5
    feats = torch.tensor([[1.0, 0.0], [math.cos(a), math.sin(a)], [0.0, 2.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    tau, lam, beta = 0.5, 0.5, 1.0
    s01, s02, s12 = math.cos(a), 0.0, math.sin(a)
    # anchor 0: positive 1, others {1, 2}; P(0) = {1} because cos(0.5) = 0.878 > 0.5
    l0 = -math.log(
        math.exp(s01 / tau) / (math.exp(s01 / tau) + math.exp(s02 / tau))
    ) + beta * math.log(math.exp(s01 / tau) + math.exp(1 / tau))
    l1 = -math.log(
        math.exp(s01 / tau) / (math.exp(s01 / tau) + math.exp(s12 / tau))
    ) + beta * math.log(math.exp(s01 / tau) + math.exp(1 / tau))
    expected = (l0 + l1) / 2  # anchor 2 has no positive: excluded
    got, info = rcl_loss(
        feats, y, tau=tau, lam=lam, beta=beta, variant="paper", return_per_anchor=True
    )
    assert abs(got.item() - expected) < 1e-12
    assert info["valid"].tolist() == [True, True, False]
    assert info["scl"][0, 2].item() == 0.0 and info["penalty"][0, 2].item() == 0.0
    # λ above cos(a): P(i) empty, the penalty is the constant 1/τ
    got_hi = rcl_loss(feats, y, tau=tau, lam=0.95, beta=beta, variant="paper")
    expected_hi = expected - beta * (math.log(math.exp(s01 / tau) + math.exp(1 / tau)) - 1 / tau)
    assert abs(got_hi.item() - expected_hi) < 1e-12
    # Eq. 2 (scl_loss paper) drops the penalty
    s = scl_loss(feats, y, tau=tau, variant="paper")
    assert (
        abs(s.item() - (expected - beta * math.log(math.exp(s01 / tau) + math.exp(1 / tau))))
        < 1e-12
    )


@pytest.mark.parametrize("labels", [[0, 0, 0, 1], [0, 1, 0, 1], [2, 2, 2, 2]])
def test_paper_variant_four_samples_plain_math(labels):
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(4, 3, generator=g, dtype=torch.float64)
    for tau, lam, beta in [(0.5, 0.0, 1.0), (0.3, 0.4, 0.7), (1.0, -1.0, 2.0)]:
        got = rcl_loss(feats, torch.tensor(labels), tau=tau, lam=lam, beta=beta, variant="paper")
        want = _paper_reference(feats.tolist(), labels, tau, lam, beta)
        assert abs(got.item() - want) < 1e-10


def test_paper_variant_levels_and_gradcheck():
    g = torch.Generator().manual_seed(0)
    f1 = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    f2 = torch.randn(6, 7, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 0, 1, 1, 1, 2])
    kw = dict(tau=0.5, lam=0.2, beta=0.8, variant="paper")
    both = rcl_loss([f1, f2], y, **kw)
    want = (
        _paper_reference(f1.tolist(), y.tolist(), 0.5, 0.2, 0.8)
        + _paper_reference(f2.tolist(), y.tolist(), 0.5, 0.2, 0.8)
    ) / 2
    assert abs(both.item() - want) < 1e-10
    assert torch.autograd.gradcheck(lambda a, b: rcl_loss([a, b], y, **kw), (f1, f2))


# --------------------------------------------------------------------- shared behaviour


@pytest.mark.parametrize("variant", ["official", "paper"])
def test_list_of_levels_is_mean_of_levels(variant):
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 3, (12,), generator=g)
    levels = [torch.randn(12, d, generator=g, dtype=torch.float64) for d in (8, 16, 32)]
    kw = dict(tau=0.1, lam=0.3, beta=0.7, variant=variant, topk_pos=2, topk_neg=3)
    together = rcl_loss(levels, y, **kw)
    separate = sum(rcl_loss(f, y, **kw) for f in levels) / len(levels)
    assert abs(together.item() - separate.item()) < 1e-12
    assert abs(rcl_loss([levels[0]], y, **kw).item() - rcl_loss(levels[0], y, **kw).item()) < 1e-15


@pytest.mark.parametrize("variant", ["official", "paper"])
@pytest.mark.parametrize("labels", [[1] * 6, [0, 0, 0, 0, 0, 1], [0], [0, 1, 2, 3]])
@pytest.mark.parametrize("beta,kp,kn", [(1.0, 1, 2), (0.0, 1, 2), (1.0, 3, 16)])
def test_degenerate_batches_are_finite(variant, labels, beta, kp, kn):
    g = torch.Generator().manual_seed(2)
    n = len(labels)
    feats = [torch.randn(n, d, generator=g, requires_grad=True) for d in (5, 9)]
    loss = rcl_loss(
        feats,
        torch.tensor(labels),
        tau=0.05,
        lam=0.0,
        beta=beta,
        variant=variant,
        topk_pos=kp,
        topk_neg=kn,
    )
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    for f in feats:
        assert f.grad is not None and torch.isfinite(f.grad).all()


def test_official_gradcheck_and_identical_features():
    g = torch.Generator().manual_seed(4)
    f = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    for kp, kn in [(1, 2), (2, 3), (3, 16)]:
        assert torch.autograd.gradcheck(
            lambda a, kp=kp, kn=kn: rcl_loss(
                a, y, tau=0.3, lam=-0.5, beta=0.5, topk_pos=kp, topk_neg=kn
            ),
            (f,),
        )
    # a collapsed class (identical features) stays finite
    same = torch.ones(4, 3, requires_grad=True)
    loss = rcl_loss(same, torch.tensor([0, 0, 1, 1]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(same.grad).all()


def test_bad_arguments():
    f = torch.randn(4, 3)
    y = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError):
        rcl_loss(f, y, variant="nope")
    with pytest.raises(ValueError):
        rcl_loss(f, y, tau=0.0)
    with pytest.raises(ValueError):
        rcl_loss(f, torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        rcl_loss(torch.randn(4, 3, 2, 2), y)


def _their_term_transliterated(f, y, *, supervised, tau, lam, kp, kn):
    """One call of skynbe/FedRCL's ``CLLoss.forward`` (``utils/loss.py``) as
    ``RCLClient`` makes it, re-written from the released code with its in-place index
    assignments: ``supervised`` = the ``scl`` pair, otherwise the ``penalty`` pair
    (``loss_type: unsupervised``, ``neg_sample_type: intra_class_thresholding``)."""
    B = f.shape[0]
    feat = F.normalize(f.squeeze(-1).squeeze(-1), p=2, dim=1)
    sim = torch.mm(feat, feat.t())
    classwise = y.expand(B, B).eq(y.expand(B, B).T)
    pos_mask = classwise if supervised else torch.eye(B, dtype=torch.bool)
    sim_pos = sim.clone()
    sim_pos[pos_mask == 0] = np.inf
    sim_pos = torch.topk(sim_pos, kp, dim=1, largest=False)[0]
    sim_neg = sim.clone()
    if supervised:
        sim_neg[classwise == 1] = -np.inf
        sim_neg = torch.topk(sim_neg, min(kn, B), dim=1, largest=True)[0]
    else:
        sim_neg[~classwise] = np.inf
        sim_neg[torch.eye(B) == 1] = np.inf
        sim_neg = torch.topk(sim_neg, min(kp, B), dim=1, largest=False)[0]
        sim_neg[sim_neg < lam] = -1
        sim_neg[sim_neg == np.inf] = -1
    pair_all = torch.cat((sim_pos.unsqueeze(2), sim_neg.unsqueeze(1).repeat(1, kp, 1)), 2)
    targets = torch.zeros_like(pair_all)
    targets[:, :, 0] = 1
    inp = pair_all.reshape(-1, pair_all.size(2)) / tau
    inp[inp == np.inf] = -np.inf
    loss_ = -targets.reshape(-1, pair_all.size(2)) * F.log_softmax(inp, dim=1)
    loss_[loss_ == np.inf] = 0.0
    loss_[loss_ == -np.inf] = 0.0
    loss_[loss_.isnan()] = 0.0
    return loss_.sum(dim=1).reshape(B, -1).mean(1)


def test_official_float32_gradients_are_theirs_bit_for_bit():
    """In float32 the official loss and its gradient equal, bit for bit, a transliteration
    of the released code's operations (per level: the scl call, then the penalty call,
    each on the pooled (B, C, 1, 1) features; means over anchors, then over levels). A
    rounding difference there moves a FedRCL run (the hard mining flips), so this is
    what makes a run of ours repeat theirs."""
    g = torch.Generator().manual_seed(11)
    y = torch.tensor([3] * 24 + [5] * 12 + [7] * 3 + [1])[torch.randperm(40, generator=g)]
    centres = torch.randn(10, 48, generator=g)
    maps = [
        (centres[y] + s * torch.randn(40, 48, generator=g))[..., None, None]
        for s in (0.2, 0.5, 1.0, 2.0)
    ]
    kw = dict(tau=0.05, lam=0.7, kp=1, kn=2)
    theirs = [m.clone().requires_grad_() for m in maps]
    scl = torch.mean(
        torch.stack(
            [_their_term_transliterated(f, y, supervised=True, **kw).mean() for f in theirs]
        )
    )
    pen = torch.mean(
        torch.stack(
            [_their_term_transliterated(f, y, supervised=False, **kw).mean() for f in theirs]
        )
    )
    (scl + pen).backward()
    ours = [m.clone().requires_grad_() for m in maps]
    total, info = rcl_loss(
        [f.mean((2, 3)) for f in ours], y, tau=0.05, lam=0.7, return_per_anchor=True
    )
    total.backward()
    assert 0 < pen.item() and 0 < scl.item()  # both terms active on these features
    assert torch.equal(info["scl_mean"], scl) and torch.equal(info["penalty_mean"], pen)
    for a, b in zip(theirs, ours, strict=True):
        assert torch.equal(a.grad, b.grad)
