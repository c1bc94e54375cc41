"""Relaxed contrastive loss of FedRCL (Seo et al., CVPR 2024) and its SCL ablation.

Notation (paper Sec. 4): for an anchor ``i`` with label ``y_i`` and L2-normalised features
``φ``, ``s_ij = <φ(x_i), φ(x_j)>`` (cosine similarity) and ``τ`` is the temperature.

* Eq. 2 (supervised contrastive loss, SCL):
  ``L_SCL(i) = − Σ_{j≠i, y_j=y_i} log( e^{s_ij/τ} / Σ_{k≠i} e^{s_ik/τ} )``.
* Eq. 5 (relaxed contrastive loss, RCL): Eq. 2 plus, inside the same sum over positives,
  the divergence penalty ``β · log( Σ_{k∈P(i)} e^{s_ik/τ} + e^{1/τ} )`` with
  ``P(i) = {k : y_k = y_i, s_ik > λ}``.
* Sec. 4.4 / Algorithm 1, lines 9-10 (multi-level training): the loss is averaged over
  feature levels, ``L_RCL = (1/L) Σ_l L_RCL(·; φ_l)``, and the local objective is
  ``CE + L_RCL``. (The loss is motivated by the sample-wise deviation bound ``D(x)`` of
  Definition 1, Eq. 4 / appendix Eq. 6: SCL raises it; the penalty counters the
  representation collapse measured with the effective rank of Definition 2.)

Two variants are provided (``variant=``):

``"official"`` (default) -- what the authors' released code computes (skynbe/FedRCL,
``utils/loss.py: CLLoss`` as called by ``RCLClient``), which is what produced the paper's
numbers. It uses hard mining instead of full sums. Per anchor ``i`` and level:

* SCL: rows ``r = 1..k_p`` over the ``k_p`` (``topk_pos``) *least* similar same-class
  samples ``p`` (the anchor itself included, so a singleton anchor uses ``s_ii ≈ 1``);
  row loss ``−log( e^{s_ip/τ} / (e^{s_ip/τ} + Σ_n e^{s_in/τ}) )`` with ``n`` the
  ``k_n`` (``topk_neg``) *most* similar other-class samples (missing negatives drop out);
  rows for missing positives (fewer than ``k_p`` classmates) contribute 0, and
  ``scl_i = (1/k_p) Σ_r row_r``.
* penalty: ``o_1..o_{k_p}`` = the ``k_p`` least similar *other* classmates, each replaced
  by ``−1`` if missing or ``< λ``;
  ``pen_i = (1/k_p) · log(1 + Σ_j e^{(o_j − s_ii)/τ})``.
  (The released code uses the self-similarity as the penalty's "positive"; the 1/k_p
  factor arises because its other k_p−1 positive rows are empty.)
* mean over all anchors, mean over levels; ``total = SCL + β · penalty``.

``"paper"`` -- Eq. 5 (and Eq. 2 for :func:`scl_loss`) with full sums. The equation leaves
the normalisation open; this implementation chooses:

* the sum over positives ``j`` is a **mean** over positives (``1/|pos(i)|``, as in the
  supervised contrastive loss of Khosla et al. and the paper's own bound in Sec. 4.1,
  ``−1/(|O_r|−1) Σ``). Because the penalty does not depend on ``j``, it therefore appears
  once per anchor: ``rcl_i = mean_j[lse_{k≠i}(s_ik/τ) − s_ij/τ] + β·log(Σ_{k∈P(i)}
  e^{s_ik/τ} + e^{1/τ})``;
* ``P(i)`` excludes the anchor itself (the ``e^{1/τ}`` term already stands for it) and
  uses a strict ``s_ik > λ``;
* anchors without any positive (a singleton class in the batch) have an empty sum in
  Eq. 5 and are **excluded** from the mean; the loss is the mean over anchors that have
  at least one positive (0, still attached to the graph, if there are none);
* the penalty keeps Eq. 5's constant: it is ``≥ 1/τ`` per anchor (``= 1/τ`` when
  ``P(i)`` is empty), which shifts the value but not the gradient.

Features are L2-normalised inside. A (B, D) tensor or a list of them (one per level, same
batch) is accepted; a list gives the mean over levels. Everything is vectorised: one
similarity matmul per level, then all levels are stacked and masked / mined at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["rcl_loss", "scl_loss"]

Features = torch.Tensor | Sequence[torch.Tensor]

_VARIANTS = ("official", "paper")


def _similarities(features: Features) -> torch.Tensor:
    """Stack of cosine-similarity matrices, shape (L, B, B)."""
    if isinstance(features, torch.Tensor):
        features = [features]
    feats = list(features)
    if not feats:
        raise ValueError("rcl_loss: no feature levels given")
    sims = []
    for f in feats:
        if f.dim() != 2:
            raise ValueError(f"rcl_loss: features must be (B, D) tensors, got {tuple(f.shape)}")
        if f.shape[0] != feats[0].shape[0]:
            raise ValueError("rcl_loss: all levels must have the same batch size")
        z = F.normalize(f, p=2, dim=1)
        sims.append(z @ z.t())
    dtype = torch.promote_types(sims[0].dtype, torch.float32)
    for s in sims[1:]:
        dtype = torch.promote_types(dtype, s.dtype)
    return torch.stack([s.to(dtype) for s in sims])


def _label_masks(
    labels: torch.Tensor, batch: int, device: torch.device | str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    labels = labels.reshape(-1).to(device)
    if labels.shape[0] != batch:
        raise ValueError(f"rcl_loss: {labels.shape[0]} labels for a batch of {batch}")
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(batch, dtype=torch.bool, device=device)
    return same, eye


def _check(variant: str, tau: float) -> None:
    if variant not in _VARIANTS:
        raise ValueError(f"rcl_loss: variant must be one of {_VARIANTS}, got {variant!r}")
    if not tau > 0:
        raise ValueError(f"rcl_loss: tau must be > 0, got {tau}")


def _smallest(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k smallest entries of the last dim (min when k == 1, no sort)."""
    if k == 1:
        return x.amin(-1, keepdim=True)
    return torch.topk(x, k, dim=-1, largest=False, sorted=False).values


def _official(
    sim: torch.Tensor,
    same: torch.Tensor,
    eye: torch.Tensor,
    tau: float,
    lam: float,
    beta: float,
    kp: int,
    kn: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-anchor SCL and penalty of the released FedRCL code, shape (L, B) each.

    How many negatives a row keeps depends on the labels of the batch (``n_other``, the
    fewest negatives any anchor has): the ``kn`` hardest when every anchor has more than
    ``kn``, otherwise all of them (none for a single-class batch). That count is a device
    tensor here, never read on the host: both candidate rows are computed and
    ``torch.where`` keeps the right one (the same numbers as a branch on the host; the
    other candidate only adds exact zeros to the gradient)."""
    L, B, _ = sim.shape
    inv_t = 1.0 / tau
    inf = float("inf")

    # --- SCL: k_p hardest positives (self included) vs k_n hardest negatives ---
    kp_eff = min(kp, B)
    pos = _smallest(sim.masked_fill(~same, inf), kp_eff)  # (L, B, kp')
    n_other = B - same.sum(1).min()  # fewest negatives of a row
    keep_top = n_other > kn  # else: every negative kept
    negatives = sim.masked_fill(same, -inf)  # -inf: not a negative
    candidates = [negatives * inv_t]  # all: (L, B, B)
    if min(kn, B - 1) >= 1:  # (B = 1: never hard-mined)
        top = torch.topk(negatives, min(kn, B - 1), dim=-1, largest=True, sorted=False)
        candidates.append(top.values * inv_t)  # hardest: (L, B, kn)
    if kp_eff == 1:  # self is always a positive
        p = pos * inv_t  # (L, B, 1)
        # a single-class batch has no negative: lse([p, -inf, ...]) - p = 0, as p - p
        per_neg = [torch.logsumexp(torch.cat([p, neg], -1), -1) - p[..., 0] for neg in candidates]
        rows = per_neg[0] if len(per_neg) == 1 else torch.where(keep_top, per_neg[1], per_neg[0])
        scl = rows / kp
    else:
        valid = torch.isfinite(pos)
        p = torch.where(valid, pos, torch.zeros_like(pos)) * inv_t  # (L, B, kp')
        per_neg = []
        for neg in candidates:
            z = torch.cat(
                [p.unsqueeze(-1), neg.unsqueeze(-2).expand(L, B, kp_eff, neg.shape[-1])], -1
            )
            per_neg.append(torch.logsumexp(z, -1) - p)
        rows = per_neg[0] if len(per_neg) == 1 else torch.where(keep_top, per_neg[1], per_neg[0])
        scl = (rows * valid).sum(-1) / kp

    if beta == 0:
        return scl, None

    # --- divergence penalty: self vs the k_p least similar classmates kept if >= λ ---
    o = _smallest(sim.masked_fill(~same | eye, inf), kp_eff)
    keep = torch.isfinite(o) & (o >= lam)
    o = torch.where(keep, o, torch.full_like(o, -1.0)) * inv_t
    s_ii = torch.diagonal(sim, dim1=-2, dim2=-1).unsqueeze(-1) * inv_t  # (L, B, 1)
    pen = (torch.logsumexp(torch.cat([s_ii, o], -1), -1) - s_ii[..., 0]) / kp
    return scl, pen


def _paper(
    sim: torch.Tensor, same: torch.Tensor, eye: torch.Tensor, tau: float, lam: float, beta: float
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Per-anchor Eq. 2 / Eq. 5 terms (mean over positives), shape (L, B) each, and the
    (B,) mask of anchors that have at least one positive."""
    inv_t = 1.0 / tau
    pos_mask = same & ~eye
    n_pos = pos_mask.sum(1)  # (B,)
    valid = n_pos > 0
    if sim.shape[-1] < 2:  # no k != i at all
        zero = sim.sum((-2, -1), keepdim=False)[..., None] * 0.0
        return zero, (zero if beta != 0 else None), valid
    logits = sim * inv_t
    lse = torch.logsumexp(logits.masked_fill(eye, float("-inf")), -1)  # (L, B)
    pos_sum = (logits * pos_mask).sum(-1)  # Σ_j s_ij / τ
    scl = (lse - pos_sum / n_pos.clamp(min=1)) * valid
    if beta == 0:
        return scl, None, valid
    in_p = pos_mask & (sim > lam)  # P(i), self excluded
    z = torch.cat(
        [logits.masked_fill(~in_p, float("-inf")), torch.full_like(logits[..., :1], inv_t)], -1
    )
    pen = torch.logsumexp(z, -1) * valid
    return scl, pen, valid


def rcl_loss(
    features: Features,
    labels: torch.Tensor,
    *,
    tau: float = 0.05,
    lam: float = 0.7,
    beta: float = 1.0,
    variant: str = "official",
    topk_pos: int = 1,
    topk_neg: int = 2,
    return_per_anchor: bool = False,
) -> Any:
    """Relaxed contrastive loss (paper Eq. 5), averaged over levels (Sec. 4.4, Alg. 1).

    ``features``: a (B, D) tensor or a list of (B, D_l) tensors, one per level (result =
    mean over levels); ``labels``: (B,) integer labels. ``tau`` = τ, ``lam`` = λ,
    ``beta`` = β (penalty weight; 0 skips the penalty entirely). ``variant``:
    ``"official"`` (released code: hard mining with ``topk_pos`` / ``topk_neg``) or
    ``"paper"`` (Eq. 5 with full sums; see the module docstring for the normalisation).

    Returns the scalar loss ``SCL + β·penalty``. With ``return_per_anchor=True`` returns
    ``(loss, info)`` where ``info`` has ``"scl"`` and ``"penalty"`` (per-level, per-anchor
    (L, B) tensors; ``penalty`` is ``None`` when β = 0), their level/anchor means
    ``"scl_mean"`` / ``"penalty_mean"`` and ``"valid"`` (anchors that count in the mean).
    """
    _check(variant, tau)
    if topk_pos < 1 or topk_neg < 1:
        raise ValueError("rcl_loss: topk_pos and topk_neg must be >= 1")
    sim = _similarities(features)
    same, eye = _label_masks(labels, sim.shape[-1], sim.device)
    beta = float(beta)
    if variant == "official":
        scl, pen = _official(sim, same, eye, tau, lam, beta, int(topk_pos), int(topk_neg))
        valid = torch.ones(sim.shape[-1], dtype=torch.bool, device=sim.device)
        scl_mean = scl.mean()
        pen_mean = pen.mean() if pen is not None else None
    else:
        scl, pen, valid = _paper(sim, same, eye, tau, lam, beta)
        denom = (valid.sum() * sim.shape[0]).clamp(min=1)  # on the device
        scl_mean = scl.sum() / denom
        pen_mean = pen.sum() / denom if pen is not None else None
    total = scl_mean if pen_mean is None else scl_mean + beta * pen_mean
    if not return_per_anchor:
        return total
    return total, {
        "scl": scl,
        "penalty": pen,
        "scl_mean": scl_mean,
        "penalty_mean": pen_mean,
        "valid": valid,
    }


def scl_loss(
    features: Features,
    labels: torch.Tensor,
    *,
    tau: float = 0.05,
    variant: str = "official",
    topk_pos: int = 1,
    topk_neg: int = 2,
    return_per_anchor: bool = False,
) -> Any:
    """Supervised contrastive loss, averaged over levels (FedSCL ablation, Table 3).

    ``variant="paper"``: Eq. 2 (mean over positives, mean over anchors that have a
    positive); ``variant="official"``: the released code's hard-mined SCL, i.e.
    :func:`rcl_loss` with ``beta=0``.
    """
    return rcl_loss(
        features,
        labels,
        tau=tau,
        lam=1.0,
        beta=0.0,
        variant=variant,
        topk_pos=topk_pos,
        topk_neg=topk_neg,
        return_per_anchor=return_per_anchor,
    )
