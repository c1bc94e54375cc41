"""UniVarFL / FedUV losses against the reference vectors in tests/data/univarfl.

The vectors (copied from the project's shared reference folder; see README.json there) are
a float64 evaluation of the UniVarFL equations with every open convention enumerated
(``LV_*``, ``LHE_*``, ``canonical_*``) plus outputs of FedUV's ``UVReg`` (``FedUV_*``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrcl_flwr.losses import univarfl as U

DATA = Path(__file__).resolve().parents[1] / "data" / "univarfl"
CASES = sorted(p.name for p in DATA.glob("case*.npz"))
EPS_TAGS = {"1e-08": 1e-8, "1e-06": 1e-6, "1e-03": 1e-3}
DUP_CASE = "case3_uniform_logits_dupfeat.npz"


def load(name):
    ref = np.load(DATA / name)
    return (
        ref,
        torch.from_numpy(ref["logits"]),
        torch.from_numpy(ref["features"]),
        torch.from_numpy(ref["labels"]),
    )


def close(value, expected, *, rtol=1e-9, atol=1e-9):
    value = float(value)
    expected = float(expected)
    assert math.isfinite(value)
    assert abs(value - expected) <= atol + rtol * abs(expected), (value, expected)


def test_reference_data_present():
    assert len(CASES) == 6
    summary = json.loads((DATA / "_summary.json").read_text())
    assert sorted(c["file"] for c in summary) == CASES


# ---------------------------------------------------------------- L_V, Eqs. (1)-(2)


@pytest.mark.parametrize("unbiased,key", [(True, "c_unbiased"), (False, "c_biased")])
@pytest.mark.parametrize("name", CASES)
def test_variance_threshold(name, unbiased, key):
    ref, logits, _, _ = load(name)
    D = logits.shape[1]
    close(U.variance_threshold(D, unbiased=unbiased), ref[key], rtol=1e-12)
    closed = 1.0 / D if unbiased else (D - 1) / D**2
    close(U.variance_threshold(D, unbiased=unbiased), closed, rtol=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_softmax_batch_variance(name):
    ref, logits, _, _ = load(name)
    p = logits.softmax(1)
    np.testing.assert_allclose(
        p.var(0, correction=1).numpy(), ref["softmax_var_unbiased"], rtol=1e-10, atol=1e-14
    )
    np.testing.assert_allclose(
        p.var(0, correction=0).numpy(), ref["softmax_var_biased"], rtol=1e-10, atol=1e-14
    )


@pytest.mark.parametrize("var_conv", ["U", "B"])
@pytest.mark.parametrize("c_conv", ["U", "B"])
@pytest.mark.parametrize("name", CASES)
def test_classifier_variance_all_conventions(name, var_conv, c_conv):
    ref, logits, _, _ = load(name)
    value = U.classifier_variance_loss(
        logits, unbiased=(var_conv == "U"), threshold="unbiased" if c_conv == "U" else "biased"
    )
    close(value, ref[f"LV_var{var_conv}_c{c_conv}"])
    # The threshold may also be given as a number.
    c = ref["c_unbiased"] if c_conv == "U" else ref["c_biased"]
    close(
        U.classifier_variance_loss(logits, unbiased=(var_conv == "U"), threshold=float(c)),
        ref[f"LV_var{var_conv}_c{c_conv}"],
    )


@pytest.mark.parametrize("name", CASES)
def test_classifier_variance_defaults_are_canonical(name):
    ref, logits, _, _ = load(name)
    close(U.classifier_variance_loss(logits), ref["LV_varU_cU"])
    close(U.classifier_variance_loss(logits, unbiased=False), ref["LV_varB_cB"])
    close(
        U.classifier_variance_loss(logits, unbiased="biased", threshold="unbiased"),
        ref["LV_varB_cU"],
    )


@pytest.mark.parametrize("name", CASES)
def test_classifier_variance_gradient(name):
    ref, logits, _, _ = load(name)
    x = logits.clone().requires_grad_(True)
    U.classifier_variance_loss(x).backward()
    np.testing.assert_allclose(
        x.grad.numpy(), ref["grad_LV_wrt_logits_canonical"], rtol=1e-8, atol=1e-12
    )


def test_classifier_variance_closed_forms():
    # Uniform predictions: Var = 0 for every class, so L_V = c.
    for D in (2, 10, 100):
        z = torch.zeros(7, D, dtype=torch.float64)
        close(U.classifier_variance_loss(z), 1.0 / D, rtol=1e-12)
        close(U.classifier_variance_loss(z, unbiased=False), (D - 1) / D**2, rtol=1e-12)
    # (Near) one-hot predictions, two samples, D = 4: columns 0 and 1 have unbiased variance
    # 1/2 >= c = 1/4 (no penalty), columns 2 and 3 have variance 0 (penalty c each).
    logits = torch.tensor([[60.0, 0, 0, 0], [0, 60.0, 0, 0]], dtype=torch.float64)
    close(U.classifier_variance_loss(logits), (0 + 0 + 0.25 + 0.25) / 4, rtol=1e-12)
    # Each class predicted (one-hot) exactly once: Var_j = c exactly, L_V = 0.
    close(U.classifier_variance_loss(60.0 * torch.eye(10, dtype=torch.float64)), 0.0, atol=1e-15)
    # An explicit threshold below the variance gives 0.
    close(U.classifier_variance_loss(logits, threshold=0.0), 0.0, atol=0)


def test_classifier_variance_single_sample_batch_is_finite():
    x = torch.randn(1, 10, requires_grad=True)
    v = U.classifier_variance_loss(x)
    assert torch.isfinite(v) and abs(v.item() - 0.1) < 1e-7  # Var := 0 -> L_V = c
    v.backward()
    assert torch.isfinite(x.grad).all()


# ---------------------------------------------------------------- L_HE, Eq. (3)


def _he_rtol(name, diag, eps):
    # Diagonal terms are 1/(1 - z.z + eps) with 1 - z.z a float64 rounding residue, and
    # case 3 has cosine-identical pairs: those values are eps/rounding dominated.
    if diag or name == DUP_CASE:
        return 1e-6
    return 1e-9


@pytest.mark.parametrize("diag", ["diag", "nodiag"])
@pytest.mark.parametrize("norm", ["n2", "nn1"])
@pytest.mark.parametrize("eps_tag", sorted(EPS_TAGS))
@pytest.mark.parametrize("name", CASES)
def test_hyperspherical_energy_all_conventions(name, eps_tag, norm, diag):
    ref, _, feats, _ = load(name)
    value = U.hyperspherical_energy(
        feats, eps=EPS_TAGS[eps_tag], include_diagonal=(diag == "diag"), normalization=norm
    )
    close(
        value,
        ref[f"LHE_eps{eps_tag}_{diag}_{norm}"],
        rtol=_he_rtol(name, diag == "diag", EPS_TAGS[eps_tag]),
        atol=0,
    )


@pytest.mark.parametrize("name", CASES)
def test_hyperspherical_energy_default_is_eps_1e3_nodiag_n2(name):
    ref, _, feats, _ = load(name)
    assert U.DEFAULT_HE_EPS == 1e-3
    close(
        U.hyperspherical_energy(feats),
        ref["LHE_eps1e-03_nodiag_n2"],
        rtol=_he_rtol(name, False, 1e-3),
        atol=0,
    )


@pytest.mark.parametrize("name", [c for c in CASES if c != DUP_CASE])
def test_hyperspherical_energy_gradient(name):
    ref, _, feats, _ = load(name)
    x = feats.clone().requires_grad_(True)
    U.hyperspherical_energy(x, eps=1e-8).backward()
    g = ref["grad_LHE_wrt_features_canonical"]
    np.testing.assert_allclose(x.grad.numpy(), g, rtol=1e-7, atol=1e-9 * np.abs(g).max())


def test_hyperspherical_energy_gradient_duplicate_case():
    """Case 3: rows 3 == 1 and 5 == 2.5 * row 0 (cosine-identical pairs).

    Exactly, a duplicate pair contributes nothing to the gradient (cos is at its maximum),
    but with eps = 1e-8 autograd multiplies a ~1e-16 rounding residue by 1/eps^2 = 1e16,
    so the stored gradient rows of the duplicated samples are rounding noise. We check
    (a) rows 2 and 4 (not duplicated) against the reference and (b) all rows against the
    exact derivative, i.e. with the duplicate-pair terms removed.
    """
    ref, _, feats, _ = load(DUP_CASE)
    g = ref["grad_LHE_wrt_features_canonical"]
    x = feats.clone().requires_grad_(True)
    U.hyperspherical_energy(x, eps=1e-8).backward()
    np.testing.assert_allclose(x.grad.numpy()[[2, 4]], g[[2, 4]], rtol=1e-7, atol=1e-12)

    y = feats.clone().requires_grad_(True)
    z = F.normalize(y, dim=1)
    gap = 1 - z @ z.t()
    keep = ~torch.eye(6, dtype=torch.bool)
    for a, b in [(1, 3), (0, 5)]:
        keep[a, b] = keep[b, a] = False
    ((1 / (gap[keep] + 1e-8)).sum() / 36).backward()
    np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-7, atol=1e-12)


def test_hyperspherical_energy_closed_forms():
    eps = 1e-3
    e = torch.eye(4, dtype=torch.float64)[:2]  # two orthogonal unit vectors: cos = 0
    close(U.hyperspherical_energy(e, eps=eps), 2 / (4 * (1 + eps)), rtol=1e-14)
    close(U.hyperspherical_energy(e, eps=eps, normalization="nn1"), 1 / (1 + eps), rtol=1e-14)
    close(
        U.hyperspherical_energy(e, eps=eps, include_diagonal=True),
        (2 / (1 + eps) + 2 / eps) / 4,
        rtol=1e-12,
    )
    # Antipodal pair: cos = -1 -> pair energy 1/(2 + eps).
    a = torch.tensor([[1.0, 0.0], [-3.0, 0.0]], dtype=torch.float64)
    close(U.hyperspherical_energy(a, eps=eps), 2 / (4 * (2 + eps)), rtol=1e-14)
    # 60 degrees apart: 1 - cos = 1/2.
    b = torch.tensor([[1.0, 0.0], [0.5, math.sqrt(3) / 2]], dtype=torch.float64)
    close(U.hyperspherical_energy(b, eps=0.0), 2 * 2 / 4, rtol=1e-12)
    # Scale invariance (features are L2-normalised inside) and flattening of (n, c, h, w).
    x = torch.randn(5, 2, 3, 3, dtype=torch.float64)
    close(U.hyperspherical_energy(7.5 * x), U.hyperspherical_energy(x.flatten(1)), rtol=1e-12)
    # Single sample: no off-diagonal pair.
    assert U.hyperspherical_energy(torch.randn(1, 8)).item() == 0.0
    with pytest.raises(ValueError):
        U.hyperspherical_energy(x, normalization="mean")


def test_hyperspherical_energy_autograd_matches_finite_differences():
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: U.hyperspherical_energy(t), (x,))
    assert torch.autograd.gradcheck(lambda t: U.hyperspherical_energy(t, eps=1e-8), (x,))
    logits = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: U.classifier_variance_loss(t), (logits,))


def test_float32_diag_residues_motivate_the_default_eps():
    # The reference shows 1 - ||z||^2 in float32 is +-1e-7: below eps = 1e-8 (or 1e-6)
    # that makes 1/(1 - z.z + eps) meaningless, possibly negative or infinite.
    for name in CASES:
        res = np.load(DATA / name)["float32_diag_terms_1_minus_zizi"]
        assert np.abs(res).max() < 1e-6
        assert np.abs(res).max() > U.DEFAULT_HE_EPS * 1e-5  # residues are real, not zeros
    assert any((np.load(DATA / n)["float32_diag_terms_1_minus_zizi"] < 0).any() for n in CASES)


@pytest.mark.parametrize("eps", [None, 1e-6, 1e-8])
def test_float32_duplicate_features_are_finite(eps):
    kw = {} if eps is None else {"eps": eps}
    _, _, feats, _ = load(DUP_CASE)
    cases = [
        feats.float(),  # cosine-identical pairs
        torch.randn(1, 64).repeat(16, 1),  # every feature identical
        torch.relu(torch.randn(32, 512)).repeat(2, 1),
    ]  # every feature duplicated
    for f in cases:
        x = f.clone().requires_grad_(True)
        loss = U.hyperspherical_energy(x, **kw)
        assert loss.dtype == torch.float32
        assert torch.isfinite(loss)
        bound = 1.0 / (kw.get("eps", U.DEFAULT_HE_EPS))
        assert 0 < loss.item() <= bound * (1 + 1e-5)  # every pair energy <= 1/eps
        loss.backward()
        assert torch.isfinite(x.grad).all()
        # Through a linear "encoder" too (the gradient that reaches parameters).
        w = torch.randn(f.shape[1], 16, requires_grad=True)
        U.hyperspherical_energy(f @ w, **kw).backward()
        assert torch.isfinite(w.grad).all()


def test_default_eps_float32_agrees_with_float64():
    ref, _, feats, _ = load("case2_D100_d512.npz")
    v32 = U.hyperspherical_energy(feats.float())
    close(v32, ref["LHE_eps1e-03_nodiag_n2"], rtol=1e-5, atol=0)


def test_half_precision_inputs_are_evaluated_in_float32():
    f = torch.randn(16, 32).repeat(2, 1).bfloat16()
    v = U.hyperspherical_energy(f)
    assert v.dtype == torch.float32 and torch.isfinite(v)
    lv = U.classifier_variance_loss(torch.randn(8, 10).half())
    assert lv.dtype == torch.float32 and torch.isfinite(lv)


# ---------------------------------------------------------------- total, Eq. (4)


@pytest.mark.parametrize("name", CASES)
def test_univarfl_total_canonical(name):
    ref, logits, feats, labels = load(name)
    D = logits.shape[1]
    assert float(ref["canonical_lambda"]) == D / 4 and float(ref["canonical_mu"]) == 0.5
    total, terms = U.univarfl_loss(logits, labels, feats, eps=1e-8, return_terms=True)
    rtol = 1e-6 if name == DUP_CASE else 1e-9
    close(total, ref["canonical_total"], rtol=rtol, atol=1e-9)
    close(terms["ce"], ref["CE_mean"], rtol=1e-10, atol=1e-12)
    close(terms["var"], ref["LV_varU_cU"])
    # Explicit mu/lam reproduce the same number.
    close(
        U.univarfl_loss(logits, labels, feats, mu=0.5, lam=D / 4, eps=1e-8),
        total,
        rtol=1e-12,
        atol=0,
    )
    # Default eps (1e-3) total = CE + 0.5 * LHE_eps1e-03 + D/4 * LV.
    expected = ref["CE_mean"] + 0.5 * ref["LHE_eps1e-03_nodiag_n2"] + D / 4 * ref["LV_varU_cU"]
    close(U.univarfl_loss(logits, labels, feats), expected, rtol=rtol, atol=1e-9)


# ---------------------------------------------------------------- FedUV (UVReg)


@pytest.mark.parametrize("name", CASES)
def test_feduv_gamma(name):
    ref, logits, _, _ = load(name)
    D = logits.shape[1]
    close(U.feduv_gamma(D), ref["FedUV_f64_batch_gamma"], rtol=1e-12)
    close(U.feduv_gamma(D), 1 / math.sqrt(D), rtol=1e-12)


@pytest.mark.parametrize("prec", ["f64", "f32"])
@pytest.mark.parametrize("name", CASES)
def test_feduv_losses(name, prec):
    ref, logits, feats, _ = load(name)
    dtype, tol = (torch.float64, 1e-9) if prec == "f64" else (torch.float32, 1e-6)
    lg, ft = logits.to(dtype), feats.to(dtype)
    # FedUV logs unif_loss rounded to 10 decimals; 1e-9 covers that.
    close(U.feduv_std_loss(lg), ref[f"FedUV_{prec}_std_loss"], rtol=0, atol=tol)
    close(U.feduv_uniformity_loss(ft), ref[f"FedUV_{prec}_unif_loss"], rtol=0, atol=tol)
    close(
        U.feduv_reg_loss(lg, ft), ref[f"FedUV_{prec}_reg_loss_std2.5_unif0.5"], rtol=0, atol=2 * tol
    )


def test_feduv_closed_forms_and_degenerate_batches():
    # Uniform softmax: std = 0 -> std_loss = gamma = 1/sqrt(D).
    close(U.feduv_std_loss(torch.zeros(5, 16, dtype=torch.float64)), 0.25, rtol=1e-12)
    # Three points on a line at 0, 1, 2: squared distances 1, 4, 1 -> sigma (median) = 1.
    p = torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64)
    close(U.feduv_uniformity_loss(p), (2 * math.exp(-1) + math.exp(-4)) / 3, rtol=1e-12)
    # Even number of non-zero distances: torch.median takes the lower middle value.
    q = torch.tensor([[0.0], [1.0], [3.0], [3.0]], dtype=torch.float64)
    # d2: (0,1)=1 (0,2)=9 (0,3)=9 (1,2)=4 (1,3)=4 (2,3)=0 -> non-zero 1,4,4,9,9 -> sigma 4
    expected = (math.exp(-1 / 4) + 4 * 0 + 2 * math.exp(-9 / 4) + 2 * math.exp(-1) + 1) / 6
    close(U.feduv_uniformity_loss(q), expected, rtol=1e-12)
    # All identical: every exp(0) = 1, no NaN from an empty median; gradients finite.
    x = torch.ones(4, 3, requires_grad=True)
    v = U.feduv_uniformity_loss(x)
    assert v.item() == 1.0
    v.backward()
    assert torch.isfinite(x.grad).all()
    # Duplicate rows among distinct ones: finite gradient.
    y = torch.randn(6, 8).repeat(2, 1).requires_grad_(True)
    U.feduv_uniformity_loss(y).backward()
    assert torch.isfinite(y.grad).all()
    # Single-sample batches.
    assert torch.isfinite(U.feduv_std_loss(torch.randn(1, 10)))
    assert U.feduv_uniformity_loss(torch.randn(1, 10)).item() == 0.0


def test_client_call_signatures():
    """The calls clients/univarfl.py makes keep working."""
    logits, feats = torch.randn(8, 10), torch.randn(8, 32)
    for v in (
        U.classifier_variance_loss(logits),
        U.hyperspherical_energy(feats),
        U.hyperspherical_energy(feats, **{"eps": 1e-4}),
        U.feduv_std_loss(logits),
        U.feduv_uniformity_loss(feats),
    ):
        assert v.dim() == 0 and torch.isfinite(v)
