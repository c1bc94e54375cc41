"""UniVarFL local regularisers (Gupta, Jangid & Sethi, 2025) and the FedUV forms they
derive from (Son et al., "FedUV", CVPR 2024). Pure torch, no Flower.

Equation numbers refer to the UniVarFL paper (arXiv 2506.08167):

* Eq. (1)  L_V  = (1/D) Σ_j max(0, c − Var_{x_i∈X}(f_θ(x_i)_j))      classifier variance
* Eq. (2)  c    = (1/D) Σ_j Var(A_j),  A = I_D                          variance floor
* Eq. (3)  L_HE = (1/n²) Σ_i Σ_j 1 / (1 − z_iᵀz_j + ε),  ‖z_i‖ = 1      hyperspherical energy
* Eq. (4)  L    = L_CE + μ·L_HE + λ·L_V,  μ = 0.5, λ = D/4 (Sec. 4)     local objective

The paper leaves three choices open; every one is a keyword here, and the defaults are the
"canonical" choice of the project's reference vectors (tests/data/univarfl):

* variance convention of Var in Eq. (1) and Eq. (2): unbiased (N − 1) by default
  (``unbiased``; the floor ``threshold`` follows the same convention unless given);
* the i = j terms of Eq. (3): excluded by default (``include_diagonal=False``). Read
  literally, Eq. (3) includes them, but each is 1/(1 − 1 + ε) = 1/ε — a constant with no
  gradient that, for small ε, swamps the loss (12.5e6 for n = 8, ε = 1e-8) and that float32
  cannot even evaluate reliably (1 − ‖z‖² is ±1e-7 there);
* the divisor of Eq. (3): n² as printed (``normalization="n2"``), or n(n − 1) ("nn1");
* ε of Eq. (3): see :data:`DEFAULT_HE_EPS`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "DEFAULT_HE_EPS",
    "variance_threshold",
    "classifier_variance_loss",
    "hyperspherical_energy",
    "univarfl_loss",
    "feduv_gamma",
    "feduv_std_loss",
    "feduv_uniformity_loss",
    "feduv_reg_loss",
]

#: Default ε of Eq. (3).
#:
#: The paper only says "a small constant added for numerical stability"; the canonical
#: reference vectors use 1e-8 in float64. That value is unusable for training in float32:
#: for two (near-)identical features, 1 − z_iᵀz_j is 0 or a rounding residue of order
#: ±1e-7 (negative as often as positive), so 1/(1 − z_iᵀz_j + 1e-8) is ~1e8, ±Inf or
#: negative, and the gradient (∝ 1/(·)²) overflows to Inf/NaN. We therefore
#:
#: 1. clamp 1 − z_iᵀz_j at 0 (it is ≥ 0 in exact arithmetic), so every denominator is ≥ ε
#:    and each pair energy is bounded by 1/ε, and
#: 2. default ε to 1e-3: four orders of magnitude above float32 rounding of 1 − zᵀz (so
#:    the rounding cannot move a pair energy by more than ~0.01 %), a bounded worst pair
#:    energy (1e3) and pair gradient (d/d cos ≤ 1e6, before the 1/n² factor), while for
#:    non-degenerate batches L_HE changes by only ~0.1 % versus ε = 1e-8 (e.g. 0.89744 vs
#:    0.89840 on the reference case 0). It is also one of the enumerated reference
#:    conventions (``LHE_eps1e-03_*``), so the default itself is pinned by a test.
#:
#: Pass ``eps=1e-8`` (in float64) to reproduce the canonical reference numbers.
DEFAULT_HE_EPS = 1e-3

_HALF = (torch.float16, torch.bfloat16)


def _promote(x: torch.Tensor) -> torch.Tensor:
    """Half-precision inputs (AMP) are evaluated in float32; others keep their dtype."""
    x = torch.as_tensor(x)
    if x.dtype in _HALF or not torch.is_floating_point(x):
        x = x.float()
    return x


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1) if x.dim() != 2 else x


def _convention(unbiased: bool | str) -> bool:
    if isinstance(unbiased, str):
        key = unbiased.lower()
        if key in ("unbiased", "u", "n-1", "sample"):
            return True
        if key in ("biased", "b", "n", "population"):
            return False
        raise ValueError(f"variance convention must be 'unbiased' or 'biased', got {unbiased!r}")
    return bool(unbiased)


def variance_threshold(
    num_classes: int,
    *,
    unbiased: bool | str = True,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Variance floor c of Eq. (2): mean over the columns A_j of I_D of Var(A_j).

    Each column holds one 1 and D − 1 zeros, so Σ(a − 1/D)² = (D − 1)/D and
    c = 1/D (unbiased, divisor D − 1) or (D − 1)/D² (biased, divisor D).
    Computed from the identity matrix itself, as the paper constructs it.
    """
    eye = torch.eye(num_classes, dtype=dtype, device=device)
    correction = 1 if (_convention(unbiased) and num_classes > 1) else 0
    return eye.var(dim=0, correction=correction).mean()


def classifier_variance_loss(
    logits: torch.Tensor, *, threshold: None | float | str = None, unbiased: bool | str = True
) -> torch.Tensor:
    """Classifier variance regulariser L_V, Eq. (1) of UniVarFL.

    L_V = (1/D) Σ_j max(0, c − Var_batch(softmax(logits)_{:, j})),

    i.e. a hinge pulling the batch variance of every class's predicted probability up to
    the floor c of Eq. (2).

    Args:
        logits: (n, D) classifier outputs (softmax is applied here).
        threshold: the floor c. ``None`` (default): Eq. (2) with the same variance
            convention as ``unbiased``; ``"unbiased"`` / ``"biased"``: Eq. (2) with that
            convention (c = 1/D or (D − 1)/D²); a number: used as is.
        unbiased: variance convention of the batch variance (and of the default floor):
            ``True``/"unbiased" → divisor n − 1 (canonical), ``False``/"biased" → n.

    A batch of a single sample has no unbiased variance; it is then taken as 0 (L_V = c,
    a constant without gradient) instead of NaN, so a trailing batch of one cannot poison
    training.
    """
    logits = _flat(_promote(logits))
    n, num_classes = logits.shape
    ub = _convention(unbiased)
    if threshold is None:
        c = variance_threshold(num_classes, unbiased=ub, dtype=logits.dtype, device=logits.device)
    elif isinstance(threshold, str):
        c = variance_threshold(
            num_classes, unbiased=threshold, dtype=logits.dtype, device=logits.device
        )
    else:
        c = torch.as_tensor(float(threshold), dtype=logits.dtype, device=logits.device)
    probs = logits.softmax(dim=1)
    correction = 1 if (ub and n > 1) else 0
    var = probs.var(dim=0, correction=correction)
    return F.relu(c - var).mean()


def hyperspherical_energy(
    features: torch.Tensor,
    *,
    eps: float = DEFAULT_HE_EPS,
    include_diagonal: bool = False,
    normalization: str = "n2",
    l2_normalize: bool = True,
    clamp: bool = True,
) -> torch.Tensor:
    """Hyperspherical energy L_HE, Eq. (3) of UniVarFL.

    L_HE = (1/n²) Σ_{i≠j} 1 / (1 − z_iᵀz_j + ε),  z_i = x_i / ‖x_i‖.

    Args:
        features: (n, d) encoder / projector outputs (flattened if more dims). They are
            L2-normalised here (``l2_normalize=False`` if they already are).
        eps: ε of Eq. (3). Default :data:`DEFAULT_HE_EPS` = 1e-3 (see its note: with the
            clamp below, every pair energy is ≤ 1/ε, so duplicate features give a finite
            loss and finite gradients in float32). The canonical reference uses 1e-8.
        include_diagonal: include the i = j terms (each ≈ 1/ε, constant). Default: no.
        normalization: ``"n2"`` divide by n² as printed in Eq. (3) (default), or ``"nn1"``
            divide by n(n − 1), the number of off-diagonal pairs.
        clamp: clamp 1 − z_iᵀz_j at 0 before adding ε (it is ≥ 0 in exact arithmetic;
            rounding can make it slightly negative, and 1e-7 < 0 with ε = 1e-8 would flip
            the sign of a pair energy or divide by zero).
    """
    x = _flat(_promote(features))
    n = x.shape[0]
    if normalization in ("n2", "n^2", "n**2"):
        denom = float(n * n)
    elif normalization in ("nn1", "n(n-1)", "n*(n-1)"):
        denom = float(n * (n - 1))
    else:
        raise ValueError(f"normalization must be 'n2' or 'nn1', got {normalization!r}")
    if n == 0 or denom == 0.0:
        return x.sum() * 0.0
    z = F.normalize(x, dim=1) if l2_normalize else x
    gap = 1.0 - z @ z.t()
    if clamp:
        gap = gap.clamp_min(0.0)
    if include_diagonal:
        energy = 1.0 / (gap + eps)
    else:
        eye = torch.eye(n, dtype=torch.bool, device=x.device)
        # Replace the diagonal *before* the reciprocal so no Inf/NaN can reach backward.
        gap = torch.where(eye, torch.ones_like(gap), gap)
        energy = torch.where(eye, torch.zeros_like(gap), 1.0 / (gap + eps))
    return energy.sum() / denom


def univarfl_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    features: torch.Tensor,
    *,
    mu: float = 0.5,
    lam: float | None = None,
    eps: float = DEFAULT_HE_EPS,
    include_diagonal: bool = False,
    normalization: str = "n2",
    unbiased: bool | str = True,
    threshold: None | float | str = None,
    return_terms: bool = False,
) -> Any:
    """UniVarFL local objective, Eq. (4): L = L_CE + μ·L_HE + λ·L_V.

    Defaults μ = 0.5 and λ = D/4 (D = number of classes, ``logits.shape[1]``) as in the
    paper's Sec. 4 (hyper-parameters). L_CE is the mean cross-entropy. The other keywords
    are forwarded to :func:`hyperspherical_energy` and :func:`classifier_variance_loss`.
    With ``return_terms=True`` returns ``(total, {"ce": ..., "he": ..., "var": ...})``.
    """
    logits = _promote(logits)
    num_classes = logits.shape[1]
    lam = num_classes / 4.0 if lam is None else float(lam)
    ce = F.cross_entropy(logits, labels)
    he = hyperspherical_energy(
        features, eps=eps, include_diagonal=include_diagonal, normalization=normalization
    )
    var = classifier_variance_loss(logits, threshold=threshold, unbiased=unbiased)
    total = ce + mu * he.to(ce.dtype) + lam * var
    if return_terms:
        return total, {"ce": ce, "he": he, "var": var}
    return total


# ---------------------------------------------------------------------------------------
# FedUV (Son et al., CVPR 2024): the form UniVarFL is derived from.
#
# FedUV's UVReg computes
#     std_loss  = mean_j relu(γ − std_unbiased_over_batch(softmax(logits))_j),
#                 γ = mean_j std_unbiased(I_D[:, j])  (= 1/√D),
#     unif_loss = mean_{i<j} exp(−‖p_i − p_j‖² / σ),
#                 σ = median of the non-zero ‖p_i − p_j‖² (lower median, torch.median),
# on the RAW (unnormalised) projector output p, and returns
#     std_coeff·std_loss + unif_coeff·unif_loss  (defaults 2.5 and 0.5; CE added outside).
# Differences from UniVarFL: a standard-deviation (not variance) hinge with γ = 1/√D, and
# a Gaussian-potential uniformity (no log, bandwidth from the batch median, no feature
# normalisation) instead of the Riesz energy of Eq. (3).
# ---------------------------------------------------------------------------------------


def feduv_gamma(
    num_classes: int,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """FedUV's γ: mean over the columns of I_D of their unbiased std (= 1/√D)."""
    eye = torch.eye(num_classes, dtype=dtype, device=device)
    correction = 1 if num_classes > 1 else 0
    return eye.std(dim=0, correction=correction).mean()


def feduv_std_loss(
    logits: torch.Tensor, *, gamma: float | None = None, unbiased: bool | str = True
) -> torch.Tensor:
    """FedUV std hinge: mean_j relu(γ − std_batch(softmax(logits))_j), as the FedUV
    authors' code computes it (``algs/feduv.py``, ``logsoft_out.std(dim=0)``).

    ``gamma=None`` uses :func:`feduv_gamma` evaluated in the logits' dtype (FedUV evaluates
    it in float32 via ``torch.eye(D).std(0).mean()``). Std is unbiased as in FedUV; a batch
    of one sample uses std = 0 instead of NaN.
    """
    logits = _flat(_promote(logits))
    n, num_classes = logits.shape
    if gamma is None:
        g = feduv_gamma(num_classes, dtype=logits.dtype, device=logits.device)
    else:
        g = torch.as_tensor(float(gamma), dtype=logits.dtype, device=logits.device)
    correction = 1 if (_convention(unbiased) and n > 1) else 0
    std = logits.softmax(dim=1).std(dim=0, correction=correction)
    return F.relu(g - std).mean()


def feduv_uniformity_loss(
    features: torch.Tensor, *, sigma: float | None = None, detach_sigma: bool = False
) -> torch.Tensor:
    """FedUV uniformity: mean over pairs i < j of exp(−‖p_i − p_j‖² / σ) on raw features, as
    the FedUV authors' code computes it (``algs/feduv.py``, ``unif_loss``).

    σ defaults to the median of the non-zero squared pairwise distances (``torch.median``,
    i.e. the lower middle value for an even count), kept in the graph as in FedUV
    (``detach_sigma=True`` treats it as a constant). Degenerate batches: fewer than two
    samples → 0; all distances zero (every feature identical) → 1 (= exp(0)) without a
    NaN from an empty median.

    The median of the non-zero distances is taken without reading their number on the
    host (:func:`_median_of_nonzero`).
    """
    p = _flat(_promote(features))
    if p.shape[0] < 2:
        return p.sum() * 0.0
    d2 = torch.pdist(p, p=2).pow(2)
    if sigma is None:
        s, any_nonzero = _median_of_nonzero(d2)
        # all distances zero: σ = 1 gives exp(−0/1) = 1 for every pair, the mean is 1
        s = torch.where(any_nonzero, s, torch.ones_like(s))
        if detach_sigma:
            s = s.detach()
    else:
        s = torch.as_tensor(float(sigma), dtype=p.dtype, device=p.device)
    # FedUV's order of operations (``pdist_x.mul(-1 / sigma_unif_x).exp().mean()``): the
    # same value as exp(-d2 / s) up to rounding, and FedUV's rounding
    return d2.mul(-1 / s).exp().mean()


def _median_of_nonzero(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(torch.median(d[d != 0]), any non-zero)`` for a 1-D ``d >= 0``, on the device.

    Boolean indexing would need the number of non-zero entries on the host. Instead the
    ``z`` zeros are replaced by −inf (the first ``a`` of them) and +inf (the rest), with
    ``a = (N − 1)//2 − (m − 1)//2`` for ``m = N − z`` non-zero entries, so that the lower
    median of all ``N`` entries, ``torch.median`` at sorted position ``(N − 1)//2``, is
    the one at position ``(m − 1)//2`` among the non-zero ones: the same value, and the
    same gradient (``torch.median`` shares it among the entries equal to the result,
    which are the same non-zero entries). Meaningless when every entry is zero."""
    n = d.numel()
    is_zero = d == 0
    m = n - is_zero.sum()
    below = (n - 1) // 2 - torch.div(m - 1, 2, rounding_mode="floor")
    zero_rank = torch.cumsum(is_zero.to(torch.int64), 0) - 1  # 0, 1, ... over the zeros
    fill = torch.where(
        zero_rank < below, torch.full_like(d, float("-inf")), torch.full_like(d, float("inf"))
    )
    return torch.where(is_zero, fill, d).median(), m > 0


def feduv_reg_loss(
    logits: torch.Tensor, features: torch.Tensor, *, std_coeff: float = 2.5, unif_coeff: float = 0.5
) -> torch.Tensor:
    """FedUV's UVReg output: std_coeff·std_loss + unif_coeff·unif_loss (CE excluded)."""
    return std_coeff * feduv_std_loss(logits) + unif_coeff * feduv_uniformity_loss(features)
