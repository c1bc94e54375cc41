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
batch) is accepted; a list gives the mean over levels. ``"paper"`` is vectorised (one
similarity matmul per level, then all levels stacked and masked at once). ``"official"``
repeats the released code's operations in their order, level by level and term by term
(:func:`_official_level`), so that its gradients equal theirs bit for bit in float32: on
this hard-mined loss a rounding difference alone moves a run (see there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["rcl_loss", "scl_loss"]

Features = torch.Tensor | Sequence[torch.Tensor]

_VARIANTS = ("official", "paper")


def _levels(features: Features) -> list[torch.Tensor]:
    """The feature levels, each checked to be (B, D) with one B."""
    if isinstance(features, torch.Tensor):
        features = [features]
    feats = list(features)
    if not feats:
        raise ValueError("rcl_loss: no feature levels given")
    for f in feats:
        if f.dim() != 2:
            raise ValueError(f"rcl_loss: features must be (B, D) tensors, got {tuple(f.shape)}")
        if f.shape[0] != feats[0].shape[0]:
            raise ValueError("rcl_loss: all levels must have the same batch size")
    return feats


def _similarities(features: Features) -> torch.Tensor:
    """Stack of cosine-similarity matrices, shape (L, B, B)."""
    sims = []
    for f in _levels(features):
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


def _row_loss(logits: torch.Tensor) -> torch.Tensor:
    """``−log softmax(row)[0]`` of each row of the last dim; a row whose value is not finite
    (a missing positive, ``−inf``) counts 0. Their ``MultiLabelCrossEntropyLoss`` with a
    one-hot target on column 0 (``utils/loss.py``), the same operations in the same order."""
    row = -F.log_softmax(logits, dim=-1)[..., 0]
    return torch.where(torch.isfinite(row), row, torch.zeros_like(row))


def _official_level(
    f: torch.Tensor,
    same: torch.Tensor,
    eye: torch.Tensor,
    tau: float,
    lam: float,
    beta: float,
    kp: int,
    kn: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-anchor SCL and penalty of the released FedRCL code at one level, shape (B,) each.

    The operations and their order are those of their ``CLLoss.forward`` (one call per
    term, as ``RCLClient._algorithm_rcl`` makes them): each term normalises the features
    and builds its own similarity matrix, takes the ``k_p`` least similar positives and
    its negatives with ``torch.topk`` (missing ones ``±inf``), concatenates them, divides
    by τ, and ``−log softmax`` keeps column 0; rows with a missing positive count 0, the
    anchor's rows are averaged. Computing both terms from one similarity matrix, scaling by
    ``1/τ`` or using ``logsumexp − p`` gives the same value up to float32 rounding, but on
    their hard-mined loss such rounding moves the whole run: after a few SGD steps of a
    ResNet-18 the weights differ by 1e-3 relative, while the same rounding in float64
    stays at 1e-15 (the ``topk`` / threshold selections flip). The same operations give
    their gradients bit for bit."""
    B = f.shape[0]
    inf = float("inf")
    kp_eff = min(kp, B)

    def similarity() -> torch.Tensor:
        x = f.reshape(B, -1)
        if x.dtype in (torch.float16, torch.bfloat16):  # (AMP) similarities in float32
            x = x.float()
        z = F.normalize(x, p=2, dim=1)
        return torch.mm(z, z.t())

    def rows(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        if kp_eff > 1:  # a missing positive: their inf -> -inf
            pos = pos.masked_fill(pos == inf, -inf)
        logits = torch.cat([pos.unsqueeze(2), neg.unsqueeze(1).expand(B, kp_eff, -1)], 2) / tau
        if kp_eff > 1:  # a row of -inf only (no positive, no negative) stays out of the graph
            empty = torch.isneginf(logits).all(-1, keepdim=True)
            logits = torch.where(empty, torch.zeros_like(logits), logits)
            return _row_loss(logits).masked_fill(empty[..., 0], 0.0).sum(1) / kp
        return _row_loss(logits).sum(1) / kp

    # --- SCL: k_p least similar classmates (self included) vs k_n most similar others ---
    sim = similarity()
    pos = torch.topk(sim.masked_fill(~same, inf), kp_eff, dim=1, largest=False)[0]
    neg = torch.topk(sim.masked_fill(same, -inf), min(kn, B), dim=1, largest=True)[0]
    scl = rows(pos, neg)
    if beta == 0:
        return scl, None

    # --- divergence penalty: self vs the k_p least similar classmates kept if >= λ ---
    sim = similarity()
    pos = torch.topk(sim.masked_fill(~eye, inf), kp_eff, dim=1, largest=False)[0]
    o = torch.topk(sim.masked_fill(~same | eye, inf), kp_eff, dim=1, largest=False)[0]
    o = torch.where(torch.isfinite(o) & (o >= lam), o, torch.full_like(o, -1.0))
    return scl, rows(pos, o)


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
    ``"scl_mean"`` / ``"penalty_mean"`` and ``"valid"`` (anchors that count in the mean)."""
    _check(variant, tau)
    if topk_pos < 1 or topk_neg < 1:
        raise ValueError("rcl_loss: topk_pos and topk_neg must be >= 1")
    beta = float(beta)
    if variant == "official":
        levels = _levels(features)
        same, eye = _label_masks(labels, levels[0].shape[0], levels[0].device)
        per_level = [
            _official_level(f, same, eye, tau, lam, beta, int(topk_pos), int(topk_neg))
            for f in levels
        ]
        # their order: the mean over anchors per level, then the mean over levels
        scl = torch.stack([s for s, _ in per_level])
        scl_mean = torch.mean(torch.stack([s.mean() for s, _ in per_level]))
        pen, pen_mean = None, None
        if beta != 0:
            pen = torch.stack([p for _, p in per_level])  # type: ignore[misc]
            pen_mean = torch.mean(torch.stack([p.mean() for _, p in per_level]))  # type: ignore[union-attr]
        valid = torch.ones(levels[0].shape[0], dtype=torch.bool, device=levels[0].device)
    else:
        sim = _similarities(features)
        same, eye = _label_masks(labels, sim.shape[-1], sim.device)
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
