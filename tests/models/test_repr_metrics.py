"""FedRCL representation metrics (fedrcl_flwr.metrics) on closed-form cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrcl_flwr.metrics import (
    class_covariance_traces,
    deviation_bound,
    effective_rank,
    effective_rank_of_matrix,
    representation_metrics,
    variability_collapse_index,
)

F64 = torch.float64
SQ2 = math.sqrt(2.0)


def exp_entropy(p):
    p = np.asarray(p, dtype=float)
    p = p / p.sum()
    return math.exp(-sum(q * math.log(q) for q in p if q > 0))


def rotation(d, seed=0):
    q, _ = torch.linalg.qr(
        torch.randn(d, d, dtype=F64, generator=torch.Generator().manual_seed(seed))
    )
    return q


# ---------------------------------------------------------------- effective rank (Def. 2)


@pytest.mark.parametrize("k", [1, 2, 5, 16])
def test_effective_rank_k_equal_singular_values(k):
    d = 32
    e = torch.zeros(k, d, dtype=F64)
    e[:, :k] = torch.eye(k, dtype=F64)
    z = torch.cat([e, -e]) @ rotation(d)  # centred, k equal singular values
    assert effective_rank(z) == pytest.approx(k, rel=1e-10)
    assert effective_rank(z, of="features") == pytest.approx(k, rel=1e-10)
    assert effective_rank(3.0 * z + 5.0) == pytest.approx(k, rel=1e-10)  # shift/scale


def test_effective_rank_known_spectrum_covariance_vs_features():
    # Centred rows with singular values (sqrt 3, 1) of the feature matrix.
    a, b = math.sqrt(1.5), math.sqrt(0.5)
    z = torch.tensor([[a, 0], [-a, 0], [0, b], [0, -b]], dtype=F64) @ rotation(2, 3)
    cov = exp_entropy([3.0, 1.0])  # eigenvalues of the covariance: s^2
    feat = exp_entropy([math.sqrt(3.0), 1.0])  # singular values of the features
    assert cov == pytest.approx(1.7548, abs=1e-4) and feat == pytest.approx(1.9286, abs=1e-4)
    assert effective_rank(z) == pytest.approx(cov, rel=1e-12)
    assert effective_rank(z, of="features") == pytest.approx(feat, rel=1e-12)


def test_effective_rank_of_matrix_definition():
    assert effective_rank_of_matrix(torch.diag(torch.tensor([3.0, 1.0]))) == pytest.approx(
        exp_entropy([3, 1]), rel=1e-12
    )
    assert effective_rank_of_matrix(np.eye(4)[:, :3]) == pytest.approx(3.0, rel=1e-12)
    assert effective_rank_of_matrix(np.outer([1, 2, 3], [4, 5])) == pytest.approx(1.0, abs=1e-9)
    assert effective_rank_of_matrix(np.zeros((3, 3))) == 0.0
    # Uncentred feature matrix of orthonormal rows.
    assert effective_rank(np.eye(6)[:4], of="features", center=False) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        effective_rank(np.eye(3), of="gram")


# ---------------------------------------------------------------- traces and VCI


def two_class_line(s):
    z = torch.tensor([[-1 - s, 0.0], [-1 + s, 0.0], [1 - s, 0.0], [1 + s, 0.0]], dtype=F64)
    return z, torch.tensor([0, 0, 1, 1])


@pytest.mark.parametrize("s", [0.0, 0.5, 2.0])
def test_traces_and_vci_two_classes_on_a_line(s):
    z, y = two_class_line(s)
    t = class_covariance_traces(z, y)
    assert t["trace_within"] == pytest.approx(s * s, abs=1e-14)
    assert t["trace_between"] == pytest.approx(1.0, rel=1e-14)
    assert t["trace_total"] == pytest.approx(1.0 + s * s, rel=1e-14)
    # Sigma_B = 1, Sigma_T = 1 + s^2 (along x): VCI = 1 - 1/(1 + s^2).
    assert variability_collapse_index(z, y) == pytest.approx(s * s / (1 + s * s), abs=1e-12)


def test_traces_unbalanced_frequency_vs_uniform_weighting():
    z = torch.tensor([[0.0], [2.0], [7.0]], dtype=F64)
    y = torch.tensor([0, 0, 1])
    t = class_covariance_traces(z, y)
    # class means 1 and 7, global mean 3
    assert t["trace_within"] == pytest.approx(2 / 3)
    assert t["trace_between"] == pytest.approx(2 / 3 * 4 + 1 / 3 * 16)  # = 8
    assert t["trace_total"] == pytest.approx(26 / 3)
    assert t["trace_total"] == pytest.approx(t["trace_within"] + t["trace_between"])
    u = class_covariance_traces(z, y, between="uniform")
    assert u["trace_within"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert u["trace_between"] == pytest.approx(9.0)  # means 1, 7 around 4
    assert variability_collapse_index(z, y) == pytest.approx(1 - 8 / (26 / 3))  # = 1/13


def test_vci_perfect_collapse_is_zero():
    means = torch.randn(3, 6, dtype=F64, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0] * 4 + [1] * 7 + [2] * 5)
    z = means[y]
    t = class_covariance_traces(z, y)
    assert t["trace_within"] == pytest.approx(0.0, abs=1e-20)
    assert variability_collapse_index(z, y) == pytest.approx(0.0, abs=1e-10)


def test_vci_zero_when_within_scatter_is_orthogonal_to_class_means():
    # Class means along e0/e1, within-class scatter along e2/e3 only.
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    means = torch.tensor([[2.0, 0, 0, 0], [0, 3.0, 0, 0], [-1.0, -1.0, 0, 0]], dtype=F64)
    noise = torch.tensor(
        [
            [0, 0, 1.0, 0],
            [0, 0, -1.0, 0],
            [0, 0, 0, 2.0],
            [0, 0, 0, -2.0],
            [0, 0, 0.5, 0.5],
            [0, 0, -0.5, -0.5],
        ],
        dtype=F64,
    )
    z = means[y] + noise
    assert class_covariance_traces(z, y)["trace_within"] > 0
    assert variability_collapse_index(z, y) == pytest.approx(0.0, abs=1e-10)


def test_vci_isotropic_within_class_closed_form():
    # Three classes in 2-D, each with 4 points mu_k +- a e1, mu_k +- a e2: Sigma_W = a^2/2 I,
    # so Sigma_T = Sigma_B + w I and Tr(Sigma_T^+ Sigma_B) = sum_i b_i / (b_i + w).
    a = 0.7
    means = torch.tensor([[0.0, 0.0], [3.0, 1.0], [1.0, 4.0]], dtype=F64)
    offs = torch.tensor([[a, 0], [-a, 0], [0, a], [0, -a]], dtype=F64)
    z = torch.cat([m + offs for m in means])
    y = torch.arange(3).repeat_interleave(4)
    mu = means.mean(0)
    sb = sum(torch.outer(m - mu, m - mu) for m in means) / 3
    b = torch.linalg.eigvalsh(sb)
    w = a * a / 2
    expected = 1 - float((b / (b + w)).sum()) / 2
    assert variability_collapse_index(z, y) == pytest.approx(expected, rel=1e-10)
    assert 0 < expected < 1


def test_vci_affine_invariant_and_degenerate():
    g = torch.Generator().manual_seed(7)
    z = torch.randn(60, 5, dtype=F64, generator=g)
    y = torch.randint(0, 4, (60,), generator=g)
    z = z + 2.0 * torch.nn.functional.one_hot(y, 5).to(F64)
    a = torch.randn(5, 5, dtype=F64, generator=g) + 3 * torch.eye(5, dtype=F64)
    v = variability_collapse_index(z, y)
    assert 0 < v < 1
    assert variability_collapse_index(z @ a + 4.0, y) == pytest.approx(v, rel=1e-9)
    # N <= D + 1 (rank Sigma_T = N - 1): whitening maps the N points onto a simplex, and
    # Tr(Sigma_T^+ Sigma_B) = sum_k (n_k/N)(N/n_k - 1) = K - 1 = rank Sigma_B, so VCI = 0
    # for ANY features -- the index is only informative for N >> D.
    zw = torch.randn(12, 40, dtype=F64, generator=g)
    yw = torch.arange(4).repeat(3)
    assert variability_collapse_index(zw, yw) == pytest.approx(0.0, abs=1e-10)
    # A single class has rank(Sigma_B) = 0.
    assert math.isnan(variability_collapse_index(z, torch.zeros(60, dtype=torch.long)))


# ---------------------------------------------------------------- deviation bound (Def. 1)


def tiny_case():
    z = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
    y = torch.tensor([0, 0, 1, 1])
    probs = torch.tensor([[0.8, 0.2], [0.6, 0.4], [0.1, 0.9], [0.3, 0.7]], dtype=F64)
    return z, y, probs


def test_deviation_bound_hand_computed():
    z, y, probs = tiny_case()
    # P^(0) = (0.7, 0.3), P^(1) = (0.2, 0.8); Phi_0 = 1.5, Phi_1 = (1 + sqrt2)/2; |O| = 2.
    phi0, phi1 = 1.5, (1 + SQ2) / 2
    # x1, x2 (class 0): cos to class 0 = 1, 1 -> S_0 = 1; to class 1 = 0, 1/sqrt2.
    d12 = (1 - 0.7) * phi0 * 2 * 1.0 / (0.2 * phi1 * 2 * (1 / SQ2) / 2)
    # x3 (class 1): orthogonal to class 0 -> S_0 = 0 -> denominator 0 -> +inf.
    # x4 (class 1): S_1 = (1/sqrt2 + 1)/2, S_0 = (1/sqrt2 + 1/sqrt2)/2.
    d4 = (1 - 0.8) * phi1 * 2 * (1 / SQ2 + 1) / 2 / (0.3 * phi0 * 2 * (1 / SQ2))
    d = deviation_bound(z, y, probs=probs)
    assert d[0].item() == pytest.approx(d12, rel=1e-12)
    assert d[1].item() == pytest.approx(d12, rel=1e-12)
    assert math.isinf(d[2].item()) and d[2].item() > 0
    assert d[3].item() == pytest.approx(d4, rel=1e-12)
    assert d12 == pytest.approx(5.2721, abs=1e-4) and d4 == pytest.approx(0.6476, abs=1e-4)
    # logits give the same as their softmax
    logits = torch.log(probs) + 1.3
    torch.testing.assert_close(deviation_bound(z, y, logits=logits), d)


def test_deviation_bound_uniform_predictions_fallback():
    z, y, _ = tiny_case()
    phi0, phi1 = 1.5, (1 + SQ2) / 2
    # P = 1/2 everywhere: D = (C-1) Phi_r|O_r| S_r / sum_{j!=r} Phi_j |O_j| S_j, C = 2
    d12 = phi0 * 2 * 1.0 / (phi1 * 2 * (1 / SQ2) / 2)
    d4 = phi1 * 2 * (1 / SQ2 + 1) / 2 / (phi0 * 2 * (1 / SQ2))
    d = deviation_bound(z, y)
    assert d[0].item() == pytest.approx(d12, rel=1e-12)
    assert d[3].item() == pytest.approx(d4, rel=1e-12)
    # num_classes=3: the absent class 2 adds no term, and (1 - 1/C) / (1/C) = C - 1 goes
    # from 1 to 2, so D doubles.
    d3 = deviation_bound(z, y, num_classes=3)
    assert d3[0].item() == pytest.approx(2 * d12, rel=1e-12)


def test_deviation_bound_dot_similarity():
    z, y, probs = tiny_case()
    # raw inner products: x1 with class 0 -> (1 + 2)/2, with class 1 -> (0 + 1)/2
    phi0, phi1 = 1.5, (1 + SQ2) / 2
    expected = 0.3 * phi0 * 2 * 1.5 / (0.2 * phi1 * 2 * 0.5)
    d = deviation_bound(z, y, probs=probs, similarity="dot")
    assert d[0].item() == pytest.approx(expected, rel=1e-12)


def test_representation_metrics_keys_and_values():
    z, y, probs = tiny_case()
    m = representation_metrics(z, y, probs=probs)
    expected_keys = {
        "effective_rank",
        "effective_rank_features",
        "trace_within",
        "trace_between",
        "trace_total",
        "vci",
        "deviation_mean",
        "deviation_median",
        "deviation_frac_below_1",
    }
    assert set(m) == expected_keys
    assert all(isinstance(v, float) for v in m.values())
    assert m["deviation_frac_below_1"] == pytest.approx(0.25)  # only x4; +inf is not < 1
    d = deviation_bound(z, y, probs=probs)
    assert m["deviation_mean"] == pytest.approx(float(d[[0, 1, 3]].mean()))
    # The call representation.py makes: float64 tensors (N, D) and labels (N,), no logits.
    g = torch.Generator().manual_seed(0)
    zz = torch.relu(torch.randn(200, 16, dtype=F64, generator=g))
    yy = torch.randint(0, 5, (200,), generator=g)
    r = representation_metrics(zz, yy)
    assert set(r) == expected_keys
    assert all(math.isfinite(v) for v in r.values())
    assert 1 <= r["effective_rank"] <= 16 and 0 <= r["vci"] <= 1
    assert r["trace_total"] == pytest.approx(r["trace_within"] + r["trace_between"])
    # NumPy inputs work too.
    assert representation_metrics(zz.numpy(), yy.numpy())["vci"] == pytest.approx(r["vci"])
