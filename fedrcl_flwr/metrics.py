"""Representation metrics of FedRCL (Seo et al., CVPR 2024), Sec. 4.1-4.2, Figures 2-3.

Pure torch (float64 internally); inputs may be torch tensors or NumPy arrays.

* :func:`effective_rank` — Definition 2 (Roy & Vetterli, 2007) applied, as in the paper, to
  "the covariance matrix of all feature embeddings" (Figure 2d/2e, 3).
* :func:`class_covariance_traces` — Tr(Σ_W) and Tr(Σ_B) (Figure 2b/2c).
* :func:`variability_collapse_index` — VCI = 1 − Tr(Σ_T⁺ Σ_B) / rank(Σ_B) (Xu & Liu,
  ICML 2023; Figure 2f). The paper prints "Tr[Σ_T^T Σ_B]"; the T superscript is the
  Moore-Penrose pseudo-inverse of the cited definition (a transpose would make the index
  scale-dependent and unbounded).
* :func:`deviation_bound` — the sample-wise deviation bound D(x) of Definition 1, Eq. (4)
  (Eq. (6) in the supplement).

Covariance conventions (documented once, used everywhere): with N samples, class counts
n_k, class means μ_k and global mean μ = (1/N) Σ_i z_i,

    Σ_T = (1/N) Σ_i (z_i − μ)(z_i − μ)ᵀ
    Σ_W = (1/N) Σ_i (z_i − μ_{y_i})(z_i − μ_{y_i})ᵀ
    Σ_B = Σ_k (n_k/N) (μ_k − μ)(μ_k − μ)ᵀ        ("frequency" weighting, default)

so that Σ_T = Σ_W + Σ_B exactly (population, 1/N, normalisation; the scale cancels in the
effective rank and VCI). ``between="uniform"`` instead uses Papyan et al.'s class-average
Σ_B = (1/K) Σ_k (μ_k − μ̄)(μ_k − μ̄)ᵀ with μ̄ the mean of the class means and
Σ_W = (1/K) Σ_k Σ_{W,k}; both coincide for balanced classes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = [
    "effective_rank_of_matrix",
    "effective_rank",
    "class_covariance_traces",
    "variability_collapse_index",
    "deviation_bound",
    "representation_metrics",
]


def _z(z) -> torch.Tensor:
    z = torch.as_tensor(np.asarray(z) if not isinstance(z, torch.Tensor) else z)
    z = z.detach().to(torch.float64).cpu()
    return z.reshape(z.shape[0], -1) if z.dim() != 2 else z


def _y(y) -> torch.Tensor:
    y = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
    return y.detach().cpu().long().reshape(-1)


def _entropy_exp(s: torch.Tensor) -> float:
    """exp(H(p)) with p_k = s_k / Σ|s_i| and 0·log 0 = 0."""
    s = s.abs()
    total = s.sum()
    if not torch.isfinite(total) or total <= 0:
        return 0.0
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def effective_rank_of_matrix(a) -> float:
    """Definition 2 for an arbitrary matrix A ∈ R^{m×n}: exp(H(p_1..p_Q)),
    p_k = σ_k / Σ_i |σ_i| over its Q = min(m, n) singular values (0 for A = 0)."""
    a = _z(a)
    return _entropy_exp(torch.linalg.svdvals(a))


def _centered(z: torch.Tensor) -> torch.Tensor:
    return z - z.mean(dim=0, keepdim=True)


def effective_rank(z, *, of: str = "covariance", center: bool = True) -> float:
    """Effective rank (Definition 2) of the feature embeddings z (N, D).

    ``of="covariance"`` (default, the paper's choice): Definition 2 applied to
    Σ_T = (1/N) Z_cᵀ Z_c. Its singular values are its eigenvalues λ_k = s_k²/N, where s_k
    are the singular values of the centred feature matrix Z_c, so p_k = s_k² / Σ s_i².
    ``of="features"``: Definition 2 applied to the feature matrix itself (centred unless
    ``center=False``), p_k = s_k / Σ s_i — a different number for the same data
    (e.g. spectrum s = (√3, 1): covariance → exp(H(3/4, 1/4)) ≈ 1.75, features →
    exp(H(0.634, 0.366)) ≈ 1.93); both equal k for k equal non-zero singular values.
    """
    z = _z(z)
    x = _centered(z) if center else z
    s = torch.linalg.svdvals(x)
    if of == "covariance":
        return _entropy_exp(s * s)
    if of == "features":
        return _entropy_exp(s)
    raise ValueError(f"of must be 'covariance' or 'features', got {of!r}")


def _class_stats(z: torch.Tensor, y: torch.Tensor, between: str):
    classes, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    k = classes.numel()
    onehot = torch.zeros(z.shape[0], k, dtype=z.dtype)
    onehot[torch.arange(z.shape[0]), inverse] = 1.0
    counts_f = counts.to(z.dtype)
    means = (onehot.t() @ z) / counts_f[:, None]  # (K, D)
    if between == "frequency":
        w = counts_f / counts_f.sum()
        center = z.mean(dim=0)
    elif between == "uniform":
        w = torch.full((k,), 1.0 / k, dtype=z.dtype)
        center = means.mean(dim=0)
    else:
        raise ValueError(f"between must be 'frequency' or 'uniform', got {between!r}")
    return classes, inverse, counts_f, means, w, center


def class_covariance_traces(z, y, *, between: str = "frequency") -> dict:
    """Traces of the within- and between-class covariance matrices (FedRCL Figure 2b/2c).

    Returns ``{"trace_within": Tr Σ_W, "trace_between": Tr Σ_B, "trace_total": Tr Σ_T}``
    with the module's conventions: Tr Σ_W is the (per-sample) mean squared distance to the
    own class mean, Tr Σ_B the class-frequency-weighted mean squared distance of the class
    means to the global mean, and Tr Σ_T = Tr Σ_W + Tr Σ_B (frequency weighting).
    """
    z, y = _z(z), _y(y)
    _, inverse, counts, means, w, center = _class_stats(z, y, between)
    sq = ((z - means[inverse]) ** 2).sum(dim=1)
    if between == "frequency":
        within = sq.mean()
    else:
        per_class = torch.zeros_like(counts).index_add_(0, inverse, sq) / counts
        within = per_class.mean()
    btw = (w * ((means - center) ** 2).sum(dim=1)).sum()
    total = ((_centered(z)) ** 2).sum(dim=1).mean()
    return {"trace_within": float(within), "trace_between": float(btw), "trace_total": float(total)}


def _rank_tol(s: torch.Tensor, shape, rtol: float | None) -> float:
    if s.numel() == 0:
        return 0.0
    r = rtol if rtol is not None else max(shape) * torch.finfo(torch.float64).eps
    return float(s.max()) * r


def variability_collapse_index(
    z, y, *, rtol: float | None = None, between: str = "frequency"
) -> float:
    """Variability collapse index VCI = 1 − Tr(Σ_T⁺ Σ_B) / rank(Σ_B) (FedRCL Sec. 4.2,
    Xu & Liu 2023). Lower = better linear transferability.

    Σ_T⁺ is the Moore-Penrose pseudo-inverse, computed from the SVD of the centred feature
    matrix Z_c = U S Vᵀ: Σ_T⁺ = V diag(N / s_k²) Vᵀ over s_k > tol. Ranks use the NumPy
    default tolerance s_max · max(rows, cols) · eps64 (``rtol`` overrides the factor).
    With frequency weighting Σ_B ⪯ Σ_T, so Tr(Σ_T⁺ Σ_B) ∈ [0, rank Σ_B] and VCI ∈ [0, 1]:
    0 when the within-class scatter has no component in the span of the class means
    (e.g. perfectly collapsed classes, Σ_W = 0), → 1 when it dominates. NaN when
    rank(Σ_B) = 0 (a single class, or all class means equal).

    Caveat: VCI is an in-sample (linear-probe) quantity. When N ≤ D + 1 (rank Σ_T = N − 1)
    whitening maps the samples onto a simplex and VCI = 0 for *any* features, so it is only
    informative for N ≫ D (e.g. 2000 test samples of 512-d ResNet-18 features).
    """
    z, y = _z(z), _y(y)
    n = z.shape[0]
    _, _, _, means, w, center = _class_stats(z, y, between)
    m = w.sqrt()[:, None] * (means - center)  # Σ_B = mᵀ m
    zc = _centered(z)
    _, s, vh = torch.linalg.svd(zc, full_matrices=False)
    keep = s > _rank_tol(s, zc.shape, rtol)
    # rank(Σ_B): singular values of m, measured against the feature scale (√ of the
    # largest eigenvalue of Σ_T) so that all-equal class means count as rank 0.
    sb = torch.linalg.svdvals(m)
    scale = torch.cat([sb, s[:1] / math.sqrt(n)])
    rank_b = int((sb > _rank_tol(scale, zc.shape, rtol)).sum())
    if rank_b == 0:
        return float("nan")
    proj = (m @ vh[keep].t()) * (math.sqrt(n) / s[keep])  # m V S⁻¹ √N
    trace = float((proj**2).sum())  # Tr(m Σ_T⁺ mᵀ)
    return 1.0 - trace / rank_b


def deviation_bound(
    z, y, *, probs=None, logits=None, num_classes: int | None = None, similarity: str = "cosine"
) -> torch.Tensor:
    """Sample-wise deviation bound D(x) of FedRCL Definition 1, Eq. (4), for every sample.

        D(x) = (1 − P_r^(r)) Φ_r |O_r| S_r(x) / Σ_{j≠r} P_r^(j) Φ_j |O_j| S_j(x),  x ∈ O_r

    * O_y: the samples of class y in (z, y); |O_y| its size.
    * P_z^(y) = mean over O_y of the predicted probability of class z (from ``probs``, or
      ``softmax(logits)``).
    * Φ_y = mean over O_y of ‖φ(x_i)‖₂ (raw feature norms).
    * S_y(x) = mean over O_y of ⟨φ(x), φ(x_i)⟩, the *cosine* similarity by default: the
      supplement's proof (Eq. (8)) factors the norms out as Φ_y, so the inner product in
      S_y is between normalised features (``similarity="dot"`` uses raw inner products).
      The average includes x itself (i ∈ O_r), as written.

    Classes without samples contribute nothing. Prop. 1: Δψ_r φ(x) ∝ D(x) − 1 (the
    supplement's Eq. (8) brace also contains the "− 1"), so D(x) < 1 marks an example whose
    classifier update deviates from the desirable direction.

    Without ``probs``/``logits`` the predictions are taken as uniform, P_z^(y) = 1/C
    (C = ``num_classes`` or max(y) + 1): then D(x) = (C − 1) Φ_r|O_r| S_r(x) /
    Σ_{j≠r} Φ_j|O_j| S_j(x), the feature-only part of the bound, and for balanced classes
    with equal norms D(x) ≥ 1 ⇔ S_r(x) ≥ mean_{j≠r} S_j(x) — the condition behind the
    paper's surrogate objective (supplement Eq. (13)).

    Returns a float64 tensor (N,): +inf where the denominator is 0 and the numerator
    positive, NaN for 0/0. (Most of this function is the definition above; its body is
    the equation, term by term.)
    """
    z, y = _z(z), _y(y)
    n = z.shape[0]
    probs, c = _predictions_and_classes(y, probs, logits, num_classes)
    onehot = torch.zeros(n, c, dtype=torch.float64)
    onehot[torch.arange(n), y] = 1.0
    counts = onehot.sum(dim=0)  # |O_y|
    present = counts > 0
    safe = counts.clamp_min(1.0)
    norms = z.norm(dim=1)
    phi = (onehot.t() @ norms) / safe  # Φ_y
    u = _similarity_features(z, norms, similarity)
    class_mean_u = (onehot.t() @ u) / safe[:, None]  # (C, D)
    s = u @ class_mean_u.t()  # S_y(x), (N, C)
    if probs is not None:
        p_mat = (onehot.t() @ probs) / safe[:, None]  # P[y, z] = P_z^(y)
    else:
        p_mat = torch.full((c, c), 1.0 / c, dtype=torch.float64)
    weight = phi * counts * present  # Φ_j |O_j|
    # term[x, j] = P_r^(j) Φ_j |O_j| S_j(x) with r = y_x
    pr = p_mat[:, y].t()  # (N, C): P_r^(j) = P[j, r]
    terms = pr * weight[None, :] * s
    own = terms.gather(1, y[:, None]).squeeze(1)
    denom = terms.sum(dim=1) - own
    p_rr = p_mat[y, y]
    numer = (1.0 - p_rr) * phi[y] * counts[y] * s.gather(1, y[:, None]).squeeze(1)
    return numer / denom


def _predictions_and_classes(
    y: torch.Tensor, probs: Any, logits: Any, num_classes: int | None
) -> tuple[torch.Tensor | None, int]:
    """:func:`deviation_bound`'s predicted probabilities (``probs``, else
    ``softmax(logits)``, else ``None``: uniform) and the number of classes C (their
    width, else ``num_classes``, else max(y) + 1); every label must lie in [0, C)."""
    if probs is None and logits is not None:
        probs = torch.softmax(_z(logits), dim=1)
    if probs is not None:
        probs = _z(probs)
        c = probs.shape[1]
    else:
        c = int(num_classes) if num_classes is not None else int(y.max()) + 1
    if int(y.max()) >= c or int(y.min()) < 0:
        raise ValueError("labels must lie in [0, num_classes)")
    return probs, c


def _similarity_features(z: torch.Tensor, norms: torch.Tensor, similarity: str) -> torch.Tensor:
    """The features whose inner products are S_y of :func:`deviation_bound`: normalised
    (``cosine``; a zero feature stays zero) or raw (``dot``)."""
    if similarity == "cosine":
        u = z / norms.clamp_min(torch.finfo(torch.float64).tiny)[:, None]
        return torch.where(norms[:, None] > 0, u, torch.zeros_like(u))
    if similarity == "dot":
        return z
    raise ValueError(f"similarity must be 'cosine' or 'dot', got {similarity!r}")


def representation_metrics(
    z, y, *, logits=None, probs=None, num_classes: int | None = None
) -> dict:
    """All FedRCL representation metrics of features z (N, D) with labels y (N,).

    Keys (plain floats): ``effective_rank`` (of the covariance, Definition 2),
    ``effective_rank_features`` (of the centred feature matrix), ``trace_within``,
    ``trace_between``, ``trace_total``, ``vci``, and, from D(x) of Definition 1,
    ``deviation_mean`` (over finite values), ``deviation_median`` and
    ``deviation_frac_below_1``. D(x) uses the model's predictions when ``logits`` or
    ``probs`` are given, otherwise uniform predictions (feature-only bound; see
    :func:`deviation_bound`).
    """
    z, y = _z(z), _y(y)
    out = {
        "effective_rank": effective_rank(z, of="covariance"),
        "effective_rank_features": effective_rank(z, of="features"),
    }
    out.update(class_covariance_traces(z, y))
    out["vci"] = variability_collapse_index(z, y)
    d = deviation_bound(z, y, logits=logits, probs=probs, num_classes=num_classes)
    valid = ~torch.isnan(d)
    finite = torch.isfinite(d)
    out["deviation_mean"] = float(d[finite].mean()) if finite.any() else float("nan")
    out["deviation_median"] = float(d[valid].median()) if valid.any() else float("nan")
    out["deviation_frac_below_1"] = (
        float((d[valid] < 1).double().mean()) if valid.any() else float("nan")
    )
    return out
