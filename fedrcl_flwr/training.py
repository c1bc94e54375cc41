"""The one local training loop every client method uses.

A method does not copy this loop: it contributes *named, weighted loss terms*
(:class:`LossTerm`) and, when it must, a batch transform (e.g. adversarial examples or two
augmented views). The loop

* builds a fresh optimiser every round (:func:`make_optimizer`: SGD with optional
  momentum / Nesterov, Adam or AdamW; lr = base * decay^(round-1)),
* runs ``epochs`` passes (or ``iterations_per_epoch`` steps per epoch) over the client's
  data,
* asks the model for intermediate features only when a term needs them,
* skips terms whose weight is zero (no wasted forward passes),
* clips the gradient norm when configured, and
* returns per-term running means so the server can log them.

It is written for an accelerator (``fedrcl_flwr.accel``): batches arrive on the device
(gathered on the host, pinned, copied without blocking, normalised and augmented there,
``runtime.make_batches``); per-term losses, the total and the gradient norms are summed
on the device in float64 (the same sums, in the same order, as the Python floats they
replace) and read back once, at the end of :func:`train_local`, so a step never waits
for the device. ``client.amp`` (``LocalTrainSettings.amp``) runs the forward pass under
autocast with the loss terms in float32; ``channels_last`` feeds NHWC batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from fedrcl_flwr import accel

if TYPE_CHECKING:
    from fedrcl_flwr.config.schema import ClientConfig


@dataclass
class Batch:
    """Everything a loss term may look at for one mini-batch."""

    x: torch.Tensor
    y: torch.Tensor
    logits: torch.Tensor
    feats: dict | None
    model: nn.Module
    extra: dict = field(default_factory=dict)


@dataclass
class LossTerm:
    """A named loss term ``weight * fn(batch)``; ``needs_features`` asks for model taps."""

    name: str
    fn: Callable[[Batch], torch.Tensor]
    weight: float = 1.0
    needs_features: bool = False


def cross_entropy_term(weight: float = 1.0) -> LossTerm:
    return LossTerm("ce", lambda b: F.cross_entropy(b.logits, b.y), weight)


OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass
class LocalTrainSettings:
    lr: float
    epochs: int = 1
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float | None = None
    iterations_per_epoch: int | None = None
    optimizer: str = "sgd"  # sgd | adam | adamw (see make_optimizer)
    nesterov: bool = False  # sgd only, needs momentum > 0
    betas: tuple = (0.9, 0.999)  # adam / adamw
    eps: float = 1e-8  # adam / adamw
    # in-round decay: local epoch e (0-based) runs at lr * epoch_lr_decay**e (the FedRCL
    # authors' LambdaLR(local_lr_decay ** epoch), stepped once per local epoch)
    epoch_lr_decay: float = 1.0
    amp: str = "off"  # off | bf16 | fp16: autocast of the forward pass (accel.amp_dtype)
    channels_last: bool = False  # feed NHWC batches (the model is converted by the caller)


def make_optimizer(
    params, settings: LocalTrainSettings, fused: bool = False
) -> torch.optim.Optimizer:
    """A fresh optimiser (no state carried between rounds) for ``settings.optimizer``:

    * ``sgd`` — ``torch.optim.SGD(lr, momentum, nesterov, weight_decay)`` (L2 added to the
      gradient; Nesterov needs ``momentum > 0``);
    * ``adam`` — ``torch.optim.Adam(lr, betas, eps, weight_decay)`` (Kingma & Ba; weight
      decay as L2 added to the gradient, PyTorch's convention; FedCCL Sec. 5.1 trains its
      pre-trained-backbone models with Adam, lr 1e-3);
    * ``adamw`` — ``torch.optim.AdamW(lr, betas, eps, weight_decay)`` (decoupled decay,
      Loshchilov & Hutter).

    ``fused=True`` (fp16 on CUDA, see :func:`train_local`) asks for PyTorch's fused
    kernel, which also takes the loss scaler's inf check on the device.
    """
    name = settings.optimizer
    extra = {"fused": True} if fused else {}
    if name == "sgd":
        if settings.nesterov and settings.momentum <= 0:
            raise ValueError("client.nesterov needs client.momentum > 0")
        return torch.optim.SGD(
            params,
            lr=settings.lr,
            momentum=settings.momentum,
            nesterov=bool(settings.nesterov),
            weight_decay=settings.weight_decay,
            **extra,
        )
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        beta1, beta2 = settings.betas  # two values (rule client.betas)
        return cls(
            params,
            lr=settings.lr,
            betas=(float(beta1), float(beta2)),
            eps=settings.eps,
            weight_decay=settings.weight_decay,
            **extra,
        )
    raise ValueError(f"client.optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


@dataclass
class TrainStats:
    steps: int = 0
    loss: float = 0.0
    terms: dict = field(default_factory=dict)
    grad_norm: float = 0.0


def local_train_settings(
    client: ClientConfig, run_round: int, *, rounds: int, **override: Any
) -> LocalTrainSettings:
    """The one builder of :class:`LocalTrainSettings` from the ``client`` section: the
    round's learning rate (:func:`round_lr`, ``client.lr_schedule`` over the run's
    ``rounds``) and every optimiser and loop setting as the
    config gives it; ``override`` replaces fields for a loop that is not a local round
    (``client_eval``'s fine-tuning: one "epoch" of exactly its steps, no in-round decay)
    or that the caller decides (``channels_last`` for the device)."""
    settings = LocalTrainSettings(
        lr=round_lr(client.lr, client.lr_decay, run_round, client.lr_schedule, rounds),
        epochs=client.local_epochs,
        momentum=client.momentum,
        weight_decay=client.weight_decay,
        grad_clip=client.grad_clip,
        iterations_per_epoch=client.iterations_per_epoch,
        optimizer=client.optimizer,
        nesterov=client.nesterov,
        betas=tuple(client.betas),
        eps=client.eps,
        epoch_lr_decay=client.epoch_lr_decay,
        # a str once loaded: the schema maps YAML's bare `off` (False) to "off"
        amp=cast(str, client.amp),
    )
    return replace(settings, **override)


def round_lr(
    base_lr: float,
    decay: float,
    server_round: int,
    schedule: str = "exponential",
    rounds: int = 1,
) -> float:
    """Learning rate of round ``server_round`` (1-based): ``exponential``,
    base * decay^(round-1); ``cosine``, base * (1 + cos(π (round-1) / rounds)) / 2 — FedUV's
    (sonhamin/FedUV ``train_fl.py``: ``CosineAnnealingLR(T_max=comm_round)`` on a dummy
    optimiser, read with ``get_last_lr()`` before the round and stepped after it)."""
    t = max(server_round - 1, 0)
    if schedule == "cosine":
        return base_lr * (1.0 + math.cos(math.pi * t / max(rounds, 1))) / 2.0
    return base_lr * decay**t


def normalises_over_batch(model: nn.Module) -> bool:
    """Whether ``model`` has a BatchNorm layer (``nn.BatchNorm1d/2d/3d``, ``SyncBatchNorm``),
    which in training mode normalises over the batch: ``BatchNorm1d`` raises on a batch of
    one sample ("Expected more than 1 value per channel when training")."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def last_batch_rule(drop_last: bool, model: nn.Module) -> str:
    """What a local epoch does with its last, incomplete batch
    (:func:`fedrcl_flwr.data.datasets.batch_bounds`): ``drop`` it with
    ``client.drop_last`` (the authors' ``DataLoader(drop_last=True)``: FedUV's
    ``utils/dataloader.py``, sonhamin/FedUV @ dd2e3c5); otherwise ``fold`` for a model
    with BatchNorm (:func:`normalises_over_batch`: a last batch of one sample joins the
    batch before it, so no step normalises one sample; a client of a single sample takes
    no step), and ``keep`` it for any other model. Only a last batch of exactly one sample
    differs between ``fold`` and ``keep``: every other run trains on the same batches."""
    if drop_last:
        return "drop"
    return "fold" if normalises_over_batch(model) else "keep"


def steps_per_epoch(
    num_samples: int,
    batch_size: int,
    iterations_per_epoch: int | None = None,
    last_batch: str = "keep",
) -> int:
    """Optimisation steps of one local epoch of :func:`train_local` on ``num_samples``
    samples in batches of ``batch_size`` (:func:`batch_size_for`), the last incomplete
    batch treated by ``last_batch`` (:func:`last_batch_rule`; the batches of
    :func:`fedrcl_flwr.data.datasets.batch_bounds`), at most ``iterations_per_epoch``."""
    full, rest = divmod(max(int(num_samples), 0), int(batch_size))
    if last_batch == "drop":
        steps = full
    elif last_batch == "fold":  # a last batch of one joins the one before; alone: none
        steps = full + (rest > 1)
    elif last_batch == "keep":
        steps = full + (rest > 0)
    else:
        raise ValueError("last_batch must be one of keep, drop, fold")
    return min(steps, int(iterations_per_epoch)) if iterations_per_epoch else steps


def batch_size_for(num_samples: int, batch_size: int, iterations_per_epoch: int | None) -> int:
    """Batch size so an epoch is ``iterations_per_epoch`` steps (FedRCL: 10), if given."""
    if iterations_per_epoch:
        return max(1, math.ceil(num_samples / iterations_per_epoch))
    return batch_size


def train_local(
    model: nn.Module,
    batches: Callable[[int], Iterable],
    terms: list[LossTerm],
    settings: LocalTrainSettings,
    device: torch.device,
    *,
    transform: Callable[[torch.Tensor, torch.Tensor, nn.Module], tuple] | None = None,
    forward: Callable[[nn.Module, torch.Tensor, bool], tuple] | None = None,
    params: list | None = None,
) -> TrainStats:
    """Run local optimisation (``settings.optimizer``) on ``model`` in place.

    ``batches(epoch)`` yields ``(x, y)`` mini-batches for one epoch (moved to ``device``
    here if they are not there yet). ``transform(x, y, model)`` may replace a batch
    (returning ``(x, y, extra)``) before the forward pass; ``forward(model, x,
    need_features)`` replaces the forward pass itself (returning ``(logits, feats or
    None)``; default: ``model(x, return_features=need_features)``). ``params`` restricts
    the optimised parameters (default: all that require grad).

    No step reads a value back to the host: the statistics are float64 sums on the
    device, transferred once at the end. Mixed precision (``settings.amp``): the forward
    pass (``forward`` or the model) runs under autocast; the logits and features are then
    cast to float32 and every loss term runs with autocast disabled (so a term that runs a
    second model, e.g. MOON's or FedNTD's frozen global model, runs it in float32). With
    ``fp16`` the loss is scaled (``torch.amp.GradScaler``), gradients are unscaled before
    clipping, steps with inf/NaN gradients are skipped by the scaler, and the mean
    gradient norm is over the steps whose norm was finite. The optimiser is then PyTorch's
    fused kernel, which reads the scaler's inf flag on the device; where it is not
    available the scaler reads that flag on the host once per step (PyTorch's own
    ``GradScaler.step``).

    Steps per mini-batch (:func:`_scheduled_batches`): :func:`_forward_pass`, the loss
    terms (kept here: the one call site of every term, which
    ``tests/clients/test_training_loop.py`` names when a term reads back),
    :func:`_optimiser_step`; the sums stay on the device (:class:`_DeviceSums`).
    """
    active = _active_terms(terms)
    need_feats = any(t.needs_features for t in active)
    params = [p for p in model.parameters() if p.requires_grad] if params is None else params
    dev = torch.device(device)
    amp_dtype = accel.amp_dtype(settings.amp, dev)
    scaler = accel.grad_scaler(settings.amp, dev)
    opt = _optimizer_for(params, settings, fused=scaler is not None)
    model.train()
    sums = _DeviceSums(dev, [t.name for t in active])
    step = 0
    for x, y in _scheduled_batches(batches, settings, opt):
        batch = _forward_pass(model, x, y, settings, dev, amp_dtype, need_feats, transform, forward)
        total = None
        with accel.loss_precision(dev, amp_dtype):
            for t in active:
                value = t.fn(batch)
                sums.terms[t.name] += value.detach().double().reshape(())
                total = t.weight * value if total is None else total + t.weight * value
        assert total is not None  # active holds at least one term
        _optimiser_step(total, opt, scaler, params, settings.grad_clip, sums)
        sums.loss += total.detach().double().reshape(())
        step += 1
    return sums.stats(step, per_finite_norm=scaler is not None)


def _active_terms(terms: list[LossTerm]) -> list[LossTerm]:
    """The terms of weight other than 0 (at least one)."""
    active = [t for t in terms if t.weight != 0.0]
    if not active:
        raise ValueError("no active loss terms: every term has weight 0")
    return active


def _scheduled_batches(
    batches: Callable[[int], Iterable], settings: LocalTrainSettings, opt: torch.optim.Optimizer
) -> Iterator[tuple]:
    """Every epoch's mini-batches for :func:`train_local`, at most
    ``settings.iterations_per_epoch`` of each, the optimiser's learning rate set to
    ``lr * epoch_lr_decay**epoch`` before an epoch's first batch is read."""
    for epoch in range(settings.epochs):
        for group in opt.param_groups:
            group["lr"] = settings.lr * settings.epoch_lr_decay**epoch
        for i, (x, y) in enumerate(batches(epoch)):
            if settings.iterations_per_epoch and i >= settings.iterations_per_epoch:
                break
            yield x, y


class _DeviceSums:
    """The statistics of :func:`train_local` as float64 sums on the device (no step reads
    a value back), read back once by :meth:`stats`."""

    def __init__(self, dev: torch.device, term_names: list[str]):
        def zero() -> torch.Tensor:
            return torch.zeros((), dtype=torch.float64, device=dev)

        self.loss, self.norm, self.norm_count = zero(), zero(), zero()
        self.terms = {name: zero() for name in term_names}

    def stats(self, steps: int, per_finite_norm: bool) -> TrainStats:
        """Means per step (the gradient norm over the steps whose norm was finite when
        ``per_finite_norm``: an fp16 step skipped by the scaler has none)."""
        stats = TrainStats(steps=steps, terms={name: 0.0 for name in self.terms})
        if steps:
            # the one read-back of the call: every sum at once
            loss, norm, count, *term_values = torch.stack(
                [self.loss, self.norm, self.norm_count, *self.terms.values()]
            ).tolist()
            stats.loss = loss / steps
            stats.grad_norm = norm / (max(count, 1.0) if per_finite_norm else steps)
            stats.terms = {k: v / steps for k, v in zip(self.terms, term_values)}
        return stats


def _forward_pass(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: LocalTrainSettings,
    dev: torch.device,
    amp_dtype: torch.dtype | None,
    need_feats: bool,
    transform: Callable | None,
    forward: Callable | None,
) -> Batch:
    """One mini-batch on the device (channels-last when asked), through ``transform``
    and the forward pass (under autocast with ``amp_dtype``; logits and features back in
    float32): the :class:`Batch` the loss terms read."""
    x = accel.to_device(x, dev)
    y = accel.to_device(y, dev)
    if settings.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    extra: dict = {}
    if transform is not None:
        x, y, extra = transform(x, y, model)
    with accel.forward_precision(dev, amp_dtype):
        if forward is not None:
            logits, feats = forward(model, x, need_feats)
        elif need_feats:
            logits, feats = model(x, return_features=True)
        else:
            logits, feats = model(x), None
    if amp_dtype is not None:
        logits, feats = accel.as_float32(logits), accel.as_float32(feats)
    return Batch(x=x, y=y, logits=logits, feats=feats, model=model, extra=extra)


def _optimiser_step(
    total: torch.Tensor,
    opt: torch.optim.Optimizer,
    scaler: Any,
    params: list,
    grad_clip: float | None,
    sums: _DeviceSums,
) -> None:
    """Backward, gradient clipping (its norm added to ``sums``), optimiser step; with a
    loss ``scaler`` (fp16) scaled, unscaled before clipping, skipped on inf/NaN."""
    opt.zero_grad(set_to_none=True)
    if scaler is None:
        total.backward()
    else:
        scaler.scale(total).backward()
    if grad_clip:
        if scaler is not None:
            scaler.unscale_(opt)
        gn = torch.nn.utils.clip_grad_norm_(params, grad_clip).detach()
        if scaler is None:
            sums.norm += gn.double()
        else:  # an overflowing fp16 step (skipped by the scaler) has no norm
            finite = torch.isfinite(gn)
            sums.norm += torch.where(finite, gn, torch.zeros_like(gn)).double()
            sums.norm_count += finite.double()
    if scaler is None:
        opt.step()
    else:
        scaler.step(opt)
        scaler.update()


def _optimizer_for(params, settings: LocalTrainSettings, fused: bool):
    """:func:`make_optimizer`, fused when asked and this PyTorch has the fused kernel for
    the optimiser (otherwise the plain one: see :func:`train_local`)."""
    if fused:
        try:
            return make_optimizer(params, settings, fused=True)
        except (RuntimeError, TypeError, ValueError):
            pass
    return make_optimizer(params, settings)
