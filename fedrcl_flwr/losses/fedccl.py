"""FedCCL cluster-signal contrasts (Qiao et al., 2024, "Federated Learning with Dual
Clustered Feature Contrast"), the FPL prototype loss they build on (Huang et al., CVPR 2023,
"Rethinking Federated Learning with Domain Shift: A Prototype View") and the L∞ attacks of
FedCCL+ (Appendix A). Pure torch, no Flower.

Equation numbers refer to the FedCCL paper:

* Eq. (16) L_local  = −Σ_i log( Σ_{z ∈ P_j^L} e^{sim(ξ_i, z)} / Σ_{z ∈ C_j} e^{sim(ξ_i, z)} ):
  each feature ξ_i against *all* local cluster signals relayed by the server; positives
  P_j^L are the signals of its class j.
* Eq. (17) L_global: the same form against the global signals U_j (Eq. 15: one averaged
  signal per class, so a single positive; several per class also work, summed as in Eq. 17).
* Eq. (18) L = L_CE + L_local + L_global;  Eqs. (22)-(24) (FedCCL+): the same terms on the
  features of PGD examples (Eq. 21), see :func:`pgd_attack`.

sim(a, b) = cos(a, b)/τ with τ = 0.07 (Sec. 5.1). −log(Σ_pos e^{s}/Σ_all e^{s}) is evaluated
as logsumexp(all) − logsumexp(pos). The paper sums over the client's data; per batch we
average over the samples that have at least one positive (a sample whose class has no
signal has an undefined term and is left out; no such sample -> a zero that is still
connected to the features). ``reduction="sum"`` keeps the printed Σ over the samples (per
batch: the batch's sum), which Eq. (18) adds to a cross-entropy that Eq. (2) averages:
read literally, each contrast term weighs ~B times the CE. The project's reference vectors (tests/data/fedccl, built from
FINCH and FPL's ``calculate_infonce``) pin this form to 1e-6; ``reduction="batch"`` gives
FPL's ``sum / B`` instead and ``form="supcon"`` the SupCon-style alternative
−(1/|P|) Σ_p log(e^{s_p}/Σ_all e^{s}) also recorded there.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "cluster_contrast",
    "local_cluster_contrast",
    "global_cluster_contrast",
    "fpl_prototype_loss",
    "fgsm_attack",
    "pgd_attack",
    "PixelSpace",
    "dataset_pixel_stats",
]

REDUCTIONS = ("mean", "sum", "batch", "none")


def _cosine_logits(features: torch.Tensor, signals: torch.Tensor, tau: float) -> torch.Tensor:
    signals = signals.to(device=features.device, dtype=features.dtype)
    return F.normalize(features, dim=1) @ F.normalize(signals, dim=1).t() / tau


def _reduce(
    per_sample: torch.Tensor, valid: torch.Tensor, features: torch.Tensor, reduction: str
) -> torch.Tensor:
    """Reduce per-sample losses (garbage where ``~valid``). On the device, no host read:
    with no valid sample the sum is 0 and the count is clamped to 1, so the result is 0
    (what the former early return gave)."""
    per_sample = torch.where(valid, per_sample, torch.zeros_like(per_sample))
    if reduction == "none":
        return per_sample
    if reduction == "mean":
        return per_sample.sum() / valid.sum().clamp(min=1)
    if reduction == "sum":  # Eqs. (16)-(17) as written: Σ over the samples
        return per_sample.sum()
    return per_sample.sum() / per_sample.shape[0]  # "batch": FPL's sum over valid / B


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def cluster_contrast(
    features: torch.Tensor,
    labels: torch.Tensor,
    signal_vectors: torch.Tensor,
    signal_labels: torch.Tensor,
    *,
    tau: float = 0.07,
    reduction: str = "mean",
    form: str = "sum",
) -> torch.Tensor:
    """−log(Σ_pos e^{cos/τ} / Σ_all e^{cos/τ}) of each feature against a set of labelled
    signal vectors (positives: signals with the feature's label). The common form of
    Eqs. (16), (17), (22), (23).

    ``features`` (B, D), ``labels`` (B,), ``signal_vectors`` (K, D), ``signal_labels`` (K,).
    ``reduction``: ``"mean"`` over the samples with ≥ 1 positive (default), ``"sum"``
    over them (Eqs. 16-17 as printed, Σ_{i ∈ D_i}), ``"batch"`` their sum divided by B
    (FPL), ``"none"`` the (B,) per-sample values (0 where a sample has no positive). ``form="supcon"``: −(1/|P|) Σ_{p∈P} log(e^{s_p} / Σ_all e^{s}).
    """
    _check_reduction(reduction)
    if form not in ("sum", "supcon"):
        raise ValueError(f"form must be 'sum' or 'supcon', got {form!r}")
    if features.ndim != 2:
        raise ValueError(f"features must be (B, D), got {tuple(features.shape)}")
    b = features.shape[0]
    if signal_vectors is None or signal_vectors.numel() == 0 or b == 0:
        per = features.new_zeros(b)
        return per + features.sum(1) * 0.0 if reduction == "none" else features.sum() * 0.0
    labels = labels.to(features.device).view(-1)
    signal_labels = signal_labels.to(features.device).view(-1)
    logits = _cosine_logits(features, signal_vectors, tau)  # (B, K)
    pos = labels[:, None] == signal_labels[None, :]
    valid = pos.any(dim=1)
    lse_all = torch.logsumexp(logits, dim=1)
    if form == "sum":
        neg_inf = torch.finfo(logits.dtype).min
        per = lse_all - torch.logsumexp(logits.masked_fill(~pos, neg_inf), dim=1)
    else:
        log_prob = logits - lse_all[:, None]
        n_pos = pos.sum(dim=1).clamp(min=1).to(logits.dtype)
        per = -(log_prob * pos.to(logits.dtype)).sum(dim=1) / n_pos
    return _reduce(per, valid, features, reduction)


def local_cluster_contrast(
    features: torch.Tensor,
    labels: torch.Tensor,
    signal_vectors: torch.Tensor,
    signal_labels: torch.Tensor,
    *,
    tau: float = 0.07,
    reduction: str = "mean",
    form: str = "sum",
) -> torch.Tensor:
    """FedCCL Eq. (16) (Eq. 22 on adversarial features): each feature against all local
    cluster signals of all clients; positives P_j^L = the signals of its class.

    Samples whose class has no signal are excluded from the mean (see
    :func:`cluster_contrast` for ``reduction`` / ``form``).
    """
    return cluster_contrast(
        features, labels, signal_vectors, signal_labels, tau=tau, reduction=reduction, form=form
    )


def global_cluster_contrast(
    features: torch.Tensor,
    labels: torch.Tensor,
    signal_vectors: torch.Tensor,
    signal_labels: torch.Tensor,
    *,
    tau: float = 0.07,
    reduction: str = "mean",
) -> torch.Tensor:
    """FedCCL Eq. (17) (Eq. 23 on adversarial features): each feature against the global
    signals U (Eq. 15: the mean of the FINCH cluster means of a class, one per class), so
    the positive is the single global signal of its class and the negatives are the other
    classes' global signals. Several signals per class are accepted (summed positives).
    """
    return cluster_contrast(
        features, labels, signal_vectors, signal_labels, tau=tau, reduction=reduction, form="sum"
    )


def fpl_prototype_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    proto_vectors: torch.Tensor,
    proto_labels: torch.Tensor,
    *,
    tau: float = 0.02,
    reduction: str = "batch",
) -> torch.Tensor:
    """FPL's hierarchical prototype loss (RethinkFL ``FPL.hierarchical_info_loss``).

    Per sample of class c with cluster prototypes: InfoNCE against all the global cluster
    prototypes (positives: those of class c; the server's FINCH cluster means), plus the
    MSE (mean over dimensions) between the feature and the unweighted mean of class c's
    cluster prototypes. FPL divides the sum over the samples that have prototypes by the
    batch size (``reduction="batch"``, default; ``"mean"`` and ``"none"`` as in
    :func:`cluster_contrast`). τ = 0.02 is FPL's default ``infoNCET``.

    Not on any client's per-step path (the FPL client uses ``baselines.fpl_loss``):
    ``torch.unique`` makes the host wait for the number of classes present.
    """
    _check_reduction(reduction)
    b = features.shape[0]
    if proto_vectors is None or proto_vectors.numel() == 0 or b == 0:
        return (
            features.new_zeros(b) + features.sum(1) * 0.0
            if reduction == "none"
            else features.sum() * 0.0
        )
    labels = labels.to(features.device).view(-1)
    proto_labels = proto_labels.to(features.device).view(-1)
    protos = proto_vectors.to(device=features.device, dtype=features.dtype)
    info = cluster_contrast(features, labels, protos, proto_labels, tau=tau, reduction="none")
    classes, inverse = torch.unique(proto_labels, return_inverse=True)
    sums = protos.new_zeros(len(classes), protos.shape[1]).index_add_(0, inverse, protos)
    counts = torch.bincount(inverse, minlength=len(classes)).to(protos.dtype)
    means = sums / counts[:, None]
    match = labels[:, None] == classes[None, :]
    valid = match.any(dim=1)
    target = means[match.to(torch.long).argmax(dim=1)]
    mse = ((features - target) ** 2).mean(dim=1)
    return _reduce(info + mse, valid, features, reduction)


# --------------------------------------------------------------------------- attacks
def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out[0] if isinstance(out, (tuple, list)) else out


class _EvalMode:
    """Put every module in eval mode and restore each module's own flag afterwards."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self) -> Any:
        self.flags = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        for m, flag in self.flags:
            m.training = flag
        return False


def _input_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_(True)
    loss = F.cross_entropy(_logits(model, x), y, reduction="sum")
    (grad,) = torch.autograd.grad(loss, [x])  # no .grad is written to the parameters
    return grad


def _clamp(x: torch.Tensor, clamp: tuple[float, float] | None) -> torch.Tensor:
    return x if clamp is None else x.clamp(float(clamp[0]), float(clamp[1]))


class PixelSpace(nn.Module):
    """``model`` seen from [0, 1] pixel space: ``model((p − mean) / std)``, so that an
    attack's ε, step and clamp are in pixel units while the model keeps its normalised
    input (the usual robust-evaluation convention: normalisation inside the attacked
    model)."""

    def __init__(self, model: nn.Module, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.model = model
        self.mean, self.std = mean, std

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        return self.model((p - self.mean) / self.std)


def _channel_stat(v: Any, x: torch.Tensor) -> torch.Tensor:
    """A per-channel (or scalar) statistic shaped to broadcast over ``x`` (B, C, ...)."""
    t = torch.as_tensor(v, dtype=x.dtype, device=x.device).flatten()
    return t.view(1, -1, *([1] * (x.dim() - 2)))


def _pixel_mode(model: nn.Module, x: torch.Tensor, mean: Any, std: Any) -> tuple:
    """(model on pixels, x in pixels, back-to-normalised) when mean/std are given."""
    if mean is None and std is None:
        return model, x, lambda a: a
    m = _channel_stat(0.0 if mean is None else mean, x)
    s = _channel_stat(1.0 if std is None else std, x)
    return PixelSpace(model, m, s), x.detach() * s + m, lambda a: (a - m) / s


def fgsm_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    eps: float,
    clamp: tuple[float, float] | None = None,
    mean: Any = None,
    std: Any = None,
) -> torch.Tensor:
    """FGSM (Goodfellow et al., 2015): x + ε·sign(∇_x CE(f(x), y)), optionally clamped to
    ``clamp = (lo, hi)``. The model runs in eval mode (each module's mode restored after);
    no gradient is left on its parameters. Returns a detached tensor (FedCCL Table 8).

    With ``mean``/``std`` (per channel; ``x`` normalised as ``(pixels − mean) / std``)
    the attack is in **pixel space**: ε and the clamp (default ``(0, 1)``) are in [0, 1]
    pixel units, the model is attacked through :class:`PixelSpace`, and the result is
    returned normalised again, ready for the model."""
    if mean is not None or std is not None:
        clamp = (0.0, 1.0) if clamp is None else clamp
    net, xp, back = _pixel_mode(model, x, mean, std)
    with torch.enable_grad(), _EvalMode(model):
        grad = _input_grad(net, xp, y)
    return back(_clamp(xp.detach() + eps * grad.sign(), clamp)).detach()


def pgd_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    eps: float,
    step: float,
    steps: int,
    clamp: tuple[float, float] | None = None,
    random_start: bool = True,
    mean: Any = None,
    std: Any = None,
) -> torch.Tensor:
    """L∞ PGD (Madry et al., 2018), the inner max of FedCCL Eq. (19) used for Eq. (21):
    from x (+ U(−ε, ε) noise if ``random_start``), ``steps`` times
    x ← Π_{‖x − x₀‖∞ ≤ ε}(x + step·sign(∇_x CE(f(x), y))), clamped to ``clamp`` if given.
    Eval mode during the attack (restored after), no gradient left on the parameters;
    returns a detached tensor. ``mean``/``std``: pixel space, as in :func:`fgsm_attack`
    (ε = 8/255, step = 2/255, 20 steps is the usual PGD-20 budget)."""
    if mean is not None or std is not None:
        clamp = (0.0, 1.0) if clamp is None else clamp
    net, x0, back = _pixel_mode(model, x, mean, std)
    x0 = x0.detach()
    lo, hi = x0 - eps, x0 + eps
    if random_start:
        adv = x0 + torch.empty_like(x0).uniform_(-eps, eps)
    else:
        adv = x0.clone()
    adv = _clamp(adv, clamp)
    with torch.enable_grad(), _EvalMode(model):
        for _ in range(int(steps)):
            grad = _input_grad(net, adv, y)
            adv = adv.detach() + step * grad.sign()
            adv = _clamp(torch.max(torch.min(adv, hi), lo), clamp)
    return back(adv).detach()


def dataset_pixel_stats(dataset: Any) -> tuple:
    """``(mean, std)`` with which ``dataset`` normalised its [0, 1] pixels
    (``ImageArrayDataset``); ``(0, 1)`` for a dataset that serves pixels as they are."""
    mean = getattr(dataset, "mean", None)
    std = getattr(dataset, "std", None)
    if mean is None or std is None:
        return torch.zeros(1), torch.ones(1)
    return torch.as_tensor(mean).flatten(), torch.as_tensor(std).flatten()
