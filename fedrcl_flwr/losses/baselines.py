"""Local loss terms of the baselines FedRCL, UniVarFL and FedCCL compare against.

Pure torch, one function per method; each docstring gives the equation, the paper and the
reference implementation whose conventions (reduction, normalisation, direction of the
KL) it follows. Where the paper and the released code differ, the code that produced the
compared numbers wins and the difference is stated. The client classes (``clients/``)
only wire these functions to the model outputs and to what the server sends.

Notation: ``z`` (B, d) features of the local model being trained, ``y`` (B,) labels,
``logits`` (B, C). "batchmean" means summed over classes and averaged over the batch.

Every function runs on the device without reading a value back to the host (these are
evaluated every local step): no ``bool(tensor)`` branch, no boolean-mask indexing (its
size is only known on the device). Selections are gathers or fixed-shape views, and a
mean over "the samples that have a prototype" is a sum with zeros in place of the others
divided by their count on the device. That sum is the same number up to the rounding
order of float addition when some samples are left out (bit-identical when none are).
The one exception is :func:`fpl_loss_official`, FPL's per-sample loop as released, which
reads the batch's labels once (as that loop does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F

__all__ = [
    "moon_contrastive_loss",
    "fedlc_loss",
    "kd_kl",
    "fedntd_loss",
    "feddecorr_loss",
    "fedmlb_branch_losses",
    "fitnet_hint_loss",
    "prototype_table",
    "fedproc_loss",
    "fedproto_loss",
    "fpl_loss",
    "fpl_loss_official",
    "fedpcl_loss",
    "feddyn_penalty",
]


# ------------------------------------------------------------------------------ MOON
def moon_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float = 0.5
) -> torch.Tensor:
    """MOON model-contrastive loss (Li, He & Song, CVPR 2021, "Model-Contrastive Federated
    Learning", model-contrastive loss ℓ_con):

        ℓ_con = −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) )

    with ``sim`` the cosine similarity, averaged over the batch (the official code: a
    2-way cross-entropy on ``[cos(z, z_glob), cos(z, z_prev)] / τ`` with target 0).
    ``z_glob`` / ``z_prev`` come from frozen models and carry no gradient."""
    pos = F.cosine_similarity(z, z_glob, dim=-1)
    neg = F.cosine_similarity(z, z_prev, dim=-1)
    logits = torch.stack([pos, neg], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


# ----------------------------------------------------------------------------- FedLC
def fedlc_loss(
    logits: torch.Tensor,
    y: torch.Tensor,
    class_counts: torch.Tensor,
    tau: float = 1.0,
    absent: str = "drop",
) -> torch.Tensor:
    """FedLC calibrated cross-entropy (Zhang et al., ICML 2022, "Federated Learning with
    Label Distribution Skew via Logits Calibration", calibrated loss):

        L_cal = −log( e^{f_y(x) − τ·n_y^{−1/4}} / Σ_c e^{f_c(x) − τ·n_c^{−1/4}} )

    ``n_c`` = the client's local count of class ``c``. The denominator runs over all
    classes, as in the code FedRCL's tables were produced with (the paper prints
    Σ_{c≠y}; that form is commented out in the released code). A class the client does
    not hold has ``n_c = 0``, i.e. an infinite offset: ``absent="drop"`` (default)
    removes it from the softmax — exactly what the released code does through
    ``exp(f − τ·0^{−1/4}) = exp(−inf) = 0``, here without producing inf/nan;
    ``absent="clamp"`` counts it as 1 (offset τ) instead."""
    counts = class_counts.to(device=logits.device, dtype=logits.dtype)
    if absent == "clamp":
        offset = tau * counts.clamp(min=1.0).pow(-0.25)
        cal = logits - offset
    elif absent == "drop":
        present = counts > 0
        offset = tau * counts.clamp(min=1.0).pow(-0.25)
        cal = (logits - offset).masked_fill(~present, float("-inf"))
    else:
        raise ValueError(f"absent must be 'drop' or 'clamp', got {absent!r}")
    return F.cross_entropy(cal, y)


# ---------------------------------------------------------------------------- FedNTD
def kd_kl(p_logits: torch.Tensor, q_logits: torch.Tensor, T: float = 1.0) -> torch.Tensor:
    """``KL(softmax(p/T) ‖ softmax(q/T))``, batchmean — the ``KD(input_p, input_q, T)``
    of the FedRCL/FedACG code base (used for FedNTD and FedMLB); gradients flow into
    whichever argument requires them."""
    p = F.softmax(p_logits / T, dim=1)
    return F.kl_div(F.log_softmax(q_logits / T, dim=1), p, reduction="batchmean")


def _not_true(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The (B, C − 1) logits without each row's true class, in class order (a gather)."""
    b, c = logits.shape
    cols = torch.arange(c - 1, device=logits.device).expand(b, c - 1)
    cols = cols + (cols >= y.view(-1, 1)).to(cols.dtype)  # skip column y of each row
    return logits.gather(1, cols)


def fedntd_loss(
    logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, T: float = 1.0
) -> torch.Tensor:
    """FedNTD not-true distillation (Lee et al., NeurIPS 2022, "Preservation of the Global
    Knowledge by Not-True Distillation in Federated Learning", not-true distillation loss):

        L_NTD = −Σ_{c≠y} q̃_g^τ(c)·log( q̃_l^τ(c) / q̃_g^τ(c) ) = KL(q̃_g^τ ‖ q̃_l^τ)

    where q̃^τ are softmaxes with temperature τ over the *not-true* classes only (the
    true-class logit removed), of the global (teacher, no gradient) and the local model.
    Batchmean, multiplied by τ² as the official FedNTD code (irrelevant at τ = 1)."""
    g = _not_true(global_logits.detach(), y)
    return (T**2) * kd_kl(g, _not_true(logits, y), T)


# ------------------------------------------------------------------------- FedDecorr
def feddecorr_loss(z: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """FedDecorr (Shi et al., ICLR 2023, "Towards Understanding and Mitigating Dimensional
    Collapse in Heterogeneous Federated Learning", the FedDecorr regulariser): penalise the
    off-diagonal of the correlation matrix of the batch representations. The paper writes
    ``L = (1/d²)·‖K‖_F²`` with K the correlation matrix of z-scored features; the official
    code (which FedRCL's code base copies), implemented here exactly, is

        ẑ = (z − mean) / sqrt(eps + var_unbiased),   M = ẑᵀẑ   (= (N−1)·K)
        L = mean_{i≠j}(M_ij²) / N

    i.e. the mean of the squared off-diagonal entries (the constant diagonal excluded),
    scaled by (N−1)²/N relative to K. Returns 0 for a batch of one."""
    n, d = z.shape
    if n < 2 or d < 2:
        return z.sum() * 0.0
    x = z - z.mean(dim=0, keepdim=True)
    x = x / torch.sqrt(eps + x.var(dim=0, keepdim=True))
    m = x.t() @ x
    # the off-diagonal entries in row-major order: drop m[0, 0], view the rest as
    # (d − 1) rows of d + 1 whose last entry is the next diagonal one, drop that column
    off = m.reshape(-1)[1:].view(d - 1, d + 1)[:, :-1].reshape(-1)
    return off.pow(2).mean() / n


# ---------------------------------------------------------------------------- FedMLB
def fedmlb_branch_losses(
    main_logits: torch.Tensor,
    hybrid_logits: Sequence[torch.Tensor],
    y: torch.Tensor,
    T: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedMLB hybrid-branch losses (Kim, Kim & Han, ICML 2022, "Multi-Level Branched
    Regularization for Federated Learning", the local objective):

        L = L_CE(q_main, y) + λ1·mean_i L_CE(q_i^hyb, y) + λ2·mean_i KL(q_i^hyb ‖ q_main)

    where branch i runs the *local* blocks 1..i and then the *frozen global* blocks
    i+1..M. Returns ``(mean_i CE_i, mean_i KL_i)``; the KL direction, batchmean reduction
    and temperature follow the official / FedRCL code (``KD(hybrid, main, T)``, gradients
    into both arguments)."""
    ces = [F.cross_entropy(h, y) for h in hybrid_logits]
    kls = [kd_kl(h, main_logits, T) for h in hybrid_logits]
    return torch.stack(ces).mean(), torch.stack(kls).mean()


# ---------------------------------------------------------------------------- FitNet
def fitnet_hint_loss(z: torch.Tensor, z_glob: torch.Tensor) -> torch.Tensor:
    """FitNet hint loss (Romero et al., ICLR 2015, "FitNets: Hints for Thin Deep Nets",
    the hint loss) with the frozen global model as the teacher, on the penultimate feature
    (same width, so no regressor is needed):  L_hint = mean((z − z_glob)²) (MSE, mean over
    batch and dimensions)."""
    return F.mse_loss(z, z_glob.detach())


# -------------------------------------------------------------- prototype methods
def prototype_table(
    vectors: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense (C, d) table of one prototype per class (the mean of a class's vectors when a
    class has several) and a (C,) mask of classes that have one."""
    d = vectors.shape[1]
    table = torch.zeros(num_classes, d, dtype=vectors.dtype, device=vectors.device)
    count = torch.zeros(num_classes, dtype=vectors.dtype, device=vectors.device)
    table.index_add_(0, labels, vectors)
    count.index_add_(0, labels, torch.ones_like(labels, dtype=vectors.dtype))
    has = count > 0
    table = table / count.clamp(min=1)[:, None]  # rows without a prototype stay 0
    return table, has


def _positives(proto_labels: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pos, valid)``: (B, K) which prototypes share each sample's class, and (B,) the
    samples that have one. A row without any is made all-true (``pos``), so that its
    positive log-sum-exp equals the full one (finite) instead of −inf: its value is
    discarded (:func:`_where_valid`) and its gradient is then an exact 0, never NaN."""
    pos = proto_labels[None, :] == y[:, None]
    valid = pos.any(dim=1)
    return pos | ~valid[:, None], valid


def _where_valid(valid: torch.Tensor, per: torch.Tensor) -> torch.Tensor:
    """``per`` with 0 for the samples that are not ``valid``."""
    return torch.where(valid, per, torch.zeros_like(per))


def _mean_valid(valid: torch.Tensor, per: torch.Tensor) -> torch.Tensor:
    """Mean of ``per`` over the ``valid`` samples (0 when there are none), on the device:
    a sum with zeros for the others over their count (:func:`torch.mean` is also sum / n,
    so with every sample valid the number is the same to the bit)."""
    return _where_valid(valid, per).sum() / valid.sum().clamp(min=1)


def fedproc_loss(
    z: torch.Tensor,
    y: torch.Tensor,
    protos: torch.Tensor,
    proto_labels: torch.Tensor,
    tau: float = 1.0,
) -> torch.Tensor:
    """FedProc global prototypical contrastive loss (Mu et al., FGCS 2023, "FedProc:
    Prototypical Contrastive Federated Learning on Non-IID Data", the global prototypical
    contrastive loss):

        L_GPCL(x) = −log( Σ_{c∈P_y} e^{cos(z, c)/τ} / Σ_{c} e^{cos(z, c)/τ} )

    over the global class prototypes (P_y: those of class y). Summed over the samples
    whose class has a prototype and divided by the *batch size*, as the reference code
    used by the FPL / FedCCL code base (which also has no temperature, τ = 1)."""
    sims = F.cosine_similarity(z[:, None, :], protos[None, :, :], dim=-1) / tau
    pos, valid = _positives(proto_labels, y)
    lse_all = torch.logsumexp(sims, dim=1)
    lse_pos = torch.logsumexp(sims.masked_fill(~pos, float("-inf")), dim=1)
    per = _where_valid(valid, lse_all - lse_pos)
    return per.sum() / z.shape[0]


def fedproto_loss(
    z: torch.Tensor,
    y: torch.Tensor,
    protos: torch.Tensor,
    proto_labels: torch.Tensor,
    num_classes: int,
) -> torch.Tensor:
    """FedProto prototype regulariser (Tan et al., AAAI 2022, "FedProto: Federated
    Prototype Learning across Heterogeneous Clients", the prototype regulariser
    of the local objective):

        L_R = Σ_j ‖f(x_j) − C̄^{(y_j)}‖²

    as the official code: ``MSELoss(proto_new, z)`` (mean over batch × dim) where
    ``proto_new`` holds the global prototype of each sample's class, and the sample's own
    (detached) feature when its class has none — i.e. such samples add zero."""
    table, has = prototype_table(protos, proto_labels, num_classes)
    target = torch.where(has[y][:, None], table[y], z.detach())
    return F.mse_loss(z, target)


def fpl_loss(
    z: torch.Tensor,
    y: torch.Tensor,
    cluster_protos: torch.Tensor,
    cluster_labels: torch.Tensor,
    num_classes: int,
    tau: float = 0.02,
    mean_over: str = "valid",
) -> torch.Tensor:
    """FPL (Huang et al., CVPR 2023, "Rethinking Federated Learning with Domain Shift: A
    Prototype View", the FPL local objective): cluster-prototype contrast plus the
    unbiased prototype:

        L_CPCL = −log( Σ_{c∈P_y} e^{cos(z, c)/τ} / Σ_{c∈P∪N} e^{cos(z, c)/τ} )
        L_UPCL = mean_dims (z − U_y)²,   U_y = mean of class y's cluster prototypes

    over the server's FINCH cluster prototypes (several per class). As the official code
    (WenkeHuang/RethinkFL @ 74201b3 ``models/fpl.py: hierarchical_info_loss``) the two are
    added per sample; ``mean_over`` ``valid`` averages them over the samples whose class
    has prototypes, ``batch`` (their ``_train_net``: ``loss_InfoNCE / i`` with ``i`` the
    batch size) sums them over those samples and divides by the batch size. The two agree
    once every class has prototypes (from the second round on, with all classes seen)."""
    sims = F.cosine_similarity(z[:, None, :], cluster_protos[None, :, :], dim=-1) / tau
    pos, valid = _positives(cluster_labels, y)
    info = torch.logsumexp(sims, dim=1) - torch.logsumexp(
        sims.masked_fill(~pos, float("-inf")), dim=1
    )
    table, _ = prototype_table(cluster_protos, cluster_labels, num_classes)
    mse = ((z - table[y]) ** 2).mean(dim=1)
    if mean_over == "batch":
        return _where_valid(valid, info + mse).sum() / z.shape[0]
    return _mean_valid(valid, info + mse)


def fpl_loss_official(
    z: torch.Tensor,
    y: torch.Tensor,
    cluster_protos: torch.Tensor,
    cluster_labels: torch.Tensor,
    tau: float = 0.02,
    mean_over: str = "batch",
) -> torch.Tensor:
    """:func:`fpl_loss`, the same formula, computed as the authors' official code computes
    it, operation for operation in float32 (WenkeHuang/RethinkFL @ 74201b3 ``models/fpl.py``:
    the per-sample loop of ``_train_net``, ``hierarchical_info_loss`` and
    ``calculate_infonce``), so that a run gives their numbers to the bit:

    * the classes are the distinct ``cluster_labels`` in order of first appearance (their
      ``global_protos`` dict, built in that order); a class's prototypes are its rows in
      the order given; its unbiased prototype is ``torch.mean`` of them over dim 0;
    * for each sample, in batch order, whose class has prototypes: the cosine similarity of
      ``z[i]`` to its class's prototypes followed by every other class's, classes in that
      order, divided by τ; ``exp``; the positives kept by a 0/1 mask product; ``−log`` of
      the ratio of the two sums (no log-sum-exp); plus the MSE to the unbiased prototype;
    * the per-sample terms summed in batch order, then divided by the batch size
      (``mean_over: batch``, their ``loss_InfoNCE / i``) or by the number of samples whose
      class has prototypes (``valid``).

    The float32 result differs from :func:`fpl_loss` only in rounding (about 1e-6
    relative); the order is what makes it theirs. Where theirs fails this one does not: a
    class with a single prototype (theirs keeps it 1-d and ``torch.cat`` raises) is one
    row here, and a batch without any sample of a known class (theirs divides ``None``)
    gives 0. Slower than :func:`fpl_loss` (a Python loop over the batch)."""
    classes: list[int] = list(dict.fromkeys(int(c) for c in cluster_labels.tolist()))
    protos = {c: cluster_protos[cluster_labels == c] for c in classes}
    means = {c: torch.mean(protos[c], dim=0).view(1, -1) for c in classes}
    ordered = {
        c: torch.cat([protos[c]] + [protos[o] for o in classes if o != c], dim=0) for c in classes
    }
    masks = {
        c: torch.tensor(
            [1.0] * protos[c].shape[0] + [0.0] * (ordered[c].shape[0] - protos[c].shape[0]),
            dtype=torch.float,
            device=z.device,
        ).view(1, -1)
        for c in classes
    }
    total: torch.Tensor | None = None
    used = 0
    for i, label in enumerate(y.tolist()):
        if label not in protos:
            continue
        f_now = z[i].unsqueeze(0)
        exp_l = torch.exp(torch.cosine_similarity(f_now, ordered[label], dim=1) / tau).view(1, -1)
        info = -torch.log((exp_l * masks[label]).sum(1) / exp_l.sum(1))
        term = info + F.mse_loss(f_now, means[label])
        total = term if total is None else total + term
        used += 1
    if total is None:
        return z.sum() * 0.0
    return (total / (z.shape[0] if mean_over == "batch" else used)).reshape(())


def fedpcl_loss(
    z: torch.Tensor,
    y: torch.Tensor,
    global_protos: torch.Tensor,
    global_labels: torch.Tensor,
    local_protos: torch.Tensor | None = None,
    local_labels: torch.Tensor | None = None,
    tau: float = 0.07,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedPCL prototype-wise contrastive losses (Tan et al., NeurIPS 2022, "Federated
    Learning from Pre-Trained Models: A Contrastive Learning Approach", the prototype-wise
    contrastive objective), with s(z, c) = ⟨z/‖z‖, c⟩ and prototypes = means of
    L2-normalised features:

        L_g = −log( e^{s(z, C̄_y)/τ} / Σ_c e^{s(z, C̄_c)/τ} )                (global)
        L_p = (1/m) Σ_i −log( e^{s(z, C_i^y)/τ} / Σ_c e^{s(z, C_i^c)/τ} )    (clients')

    The signal exchange relays the banked client prototypes *without* client identity, so
    L_p is computed per positive: each prototype of class y (one per client holding y)
    against all prototypes of the other classes, averaged over the positives — the
    per-client softmax of the paper with the negatives pooled over clients. Samples whose
    class has no prototype are left out. Returns ``(L_g, L_p)`` (L_p = 0 without local
    prototypes)."""
    zn = F.normalize(z, dim=1)
    zero = z.sum() * 0.0

    def global_term() -> torch.Tensor:
        s = zn @ global_protos.t() / tau
        pos, valid = _positives(global_labels, y)
        per = torch.logsumexp(s, dim=1) - torch.logsumexp(s.masked_fill(~pos, float("-inf")), dim=1)
        return _mean_valid(valid, per)

    def local_term() -> torch.Tensor:
        if local_protos is None or local_protos.shape[0] == 0:
            return zero
        assert local_labels is not None  # given with local_protos (the caller's contract)
        s = zn @ local_protos.t() / tau  # (B, K)
        pos = local_labels[None, :] == y[:, None]  # (B, K)
        valid = pos.any(dim=1)
        neg_lse = torch.logsumexp(s.masked_fill(pos, float("-inf")), dim=1)  # (B,)
        # −log(e^{s_p} / (e^{s_p} + Σ_n e^{s_n})) for every positive p
        per_pos = torch.logaddexp(s, neg_lse[:, None]) - s
        per = (per_pos * pos).sum(dim=1) / pos.sum(dim=1).clamp(min=1)
        return _mean_valid(valid, per)

    return global_term(), local_term()


# ---------------------------------------------------------------------------- FedDyn
def feddyn_penalty(
    params: Sequence[torch.Tensor],
    anchors: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor] | None,
    alpha: float,
) -> torch.Tensor:
    """FedDyn dynamic regulariser (Acar et al., ICLR 2021, "Federated Learning Based on
    Dynamic Regularization", Algorithm 1):

        R_k(θ) = −⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)·‖θ − θ^{t−1}‖²

    ``grads`` is the client's stored ∇L_k(θ_k^{t−1}) (``None`` = 0 at its first
    participation); ``anchors`` is the received server model θ^{t−1}."""
    prox = sum(((p - a) ** 2).sum() for p, a in zip(params, anchors))
    out = 0.5 * alpha * prox
    if grads is not None:
        out = out - sum((p * g).sum() for p, g in zip(params, grads))
    return cast(torch.Tensor, out)  # a tensor: a model has parameters (sum of tensors)
