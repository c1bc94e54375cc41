"""The GPU-ready hot loop: no per-step host synchronisation in any client
method, batches normalised / augmented where they are used, mixed precision, and — with
``client.amp: off`` on the CPU — exactly the numbers of the previous host-side loop.

The host-sync check is a counting shim: every tensor operation that makes the host wait
for the device (a value read back: ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` /
``if t``, ``.tolist()``, ``.cpu()``, ``.numpy()``, printing; or a result whose size only
the device knows: ``nonzero``, boolean-mask indexing, ``unique``, ``masked_select``,
``bincount``) is counted by call site during ``fit``. A run with twice as many local steps
must count exactly as many: whatever a method reads back per round (its weights, its
uploads, the one read-back of the loss sums) is fine, nothing may be read per step.
On the CPU these operations cost nothing, which is why the test counts them instead of
timing them.
"""

from __future__ import annotations

import collections
import copy
import math
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients import CLIENTS, client_class
from fedrcl_flwr import accel, cli
from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.run import runtime
from fedrcl_flwr.signals import SignalSet, encode_signals
from fedrcl_flwr.training import (
    LocalTrainSettings,
    LossTerm,
    cross_entropy_term,
    make_optimizer,
    train_local,
)

ROOT = Path(__file__).resolve().parents[2]
OUR_CODE = tuple(str(ROOT / d) for d in ("fedrcl_flwr", "clients", "strategies"))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------- the counting shim
# Call sites (file:line of our code) allowed to read a value back on every step, with the
# reason. No client method needs one; the augmentation reads its host-drawn rotation
# angles on the host (no device wait). (fp16 on CUDA without PyTorch's fused
# optimiser reads the loss scaler's inf flag per step inside torch.amp.GradScaler; the
# loop asks for the fused kernel, which does not. Not reachable on the CPU.)
def _line_of(fn, needle: str) -> str:
    import inspect

    lines, start = inspect.getsourcelines(fn)
    line = start + next(i for i, text in enumerate(lines) if needle in text)
    return f"{Path(inspect.getsourcefile(fn)).relative_to(ROOT)}:{line}"


def _host_angle_read() -> str:
    from fedrcl_flwr import augment

    return _line_of(augment._angles, "# host read")


PER_STEP_ALLOWED: dict[str, str] = {
    # rotation angles are drawn on the host (the client's CPU generator); reading that host
    # tensor to compute Pillow's coefficients in double precision waits for no device
    _host_angle_read(): "host tensor read on the host (augmentation angles)",
}

_VALUE_READS = (
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__format__",
    "__repr__",
    "__array__",
)
_SIZE_FROM_DEVICE = (
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "unique_consecutive",
    "bincount",
)


class SyncCounter:
    """Counts host-synchronising tensor operations by the innermost call site in the
    project's code (``fedrcl_flwr/``, ``clients/``, ``strategies/``)."""

    def __init__(self, monkeypatch):
        self.counts: collections.Counter = collections.Counter()
        self.active = False
        self._inside = False
        for name in _VALUE_READS:
            self._wrap(monkeypatch, torch.Tensor, name, name)
        for name in _SIZE_FROM_DEVICE:
            if hasattr(torch.Tensor, name):
                self._wrap(monkeypatch, torch.Tensor, name, name)
            if hasattr(torch, name):
                self._wrap(monkeypatch, torch, name, name)
        where = torch.where
        monkeypatch.setattr(
            torch,
            "where",
            self._counting(where, "where(cond)", when=lambda args, kw: len(args) + len(kw) == 1),
        )
        for name in ("__getitem__", "__setitem__"):
            self._wrap(
                monkeypatch,
                torch.Tensor,
                name,
                f"mask {name}",
                when=lambda args, kw: _has_bool_index(args[1]),
            )

    def _wrap(self, monkeypatch, owner, name, label, when=None):
        monkeypatch.setattr(owner, name, self._counting(getattr(owner, name), label, when))

    def _counting(self, original, label, when=None):
        counter = self

        def wrapper(*args, **kwargs):
            if counter.active and not counter._inside and (when is None or when(args, kwargs)):
                counter._record(label)
            was, counter._inside = counter._inside, True
            try:
                return original(*args, **kwargs)
            finally:
                counter._inside = was

        return wrapper

    def _record(self, label: str) -> None:
        site = "outside the project"
        for frame in reversed(traceback.extract_stack()[:-2]):  # less wrapper, _record
            if frame.filename.startswith(OUR_CODE):
                site = f"{Path(frame.filename).relative_to(ROOT)}:{frame.lineno}"
                break
        self.counts[f"{site} {label}"] += 1

    def count(self, fn):
        self.counts = collections.Counter()
        self.active = True
        try:
            fn()
        finally:
            self.active = False
        return self.counts


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


def _per_step_syncs(short: collections.Counter, long: collections.Counter) -> dict:
    """Call sites that counted more in the longer run (outside the allow-list)."""
    grew = {k: (short.get(k, 0), v) for k, v in long.items() if v > short.get(k, 0)}
    return {k: v for k, v in grew.items() if k.rsplit(" ", 1)[0] not in PER_STEP_ALLOWED}


# ------------------------------------------------------------------------ the methods
# variant -> (client.method, client.params, other config sections)
TWO = {"federation": {"num_clients": 2, "clients_per_round": 2}}
VARIANTS = {
    **{m: (m, {}, {}) for m in CLIENTS if m not in ("faulty", "feddyn", "moon")},
    "faulty": ("faulty", {"partitions": [7]}, {}),  # partition 0 behaves
    "moon": ("moon", {}, TWO),
    "feddyn": ("feddyn", {}, {**TWO, "server": {"strategy": "feddyn"}}),
    "fedrcl-paper": ("fedrcl", {"variant": "paper"}, {}),
    "fedrcl-topk": ("fedrcl", {"topk_pos": 2, "topk_neg": 3}, {}),
    "univarfl-feduv": ("univarfl", {"variant": "feduv"}, {}),
    "fedccl-adversarial": ("fedccl", {"adversarial": True, "steps": 2}, {}),
    "fedproc-alpha": ("fedproc", {"alpha": 0.5}, {}),
}


def _signals(dim: int) -> bytes:
    """Signals for classes 0-2 of 4 (class 3 has none: the 'no positive' path runs)."""
    g = np.random.default_rng(0)
    labels = np.array([0, 0, 1, 2, 2], np.int64)
    return encode_signals(
        SignalSet(g.normal(size=(5, dim)).astype(np.float32), labels, np.full(5, 10, np.int64))
    )


def _fit_config(run_round: int) -> dict:
    sig = _signals(128)  # cnn5's penultimate width
    return {
        "run_round": run_round,
        "partition_id": 0,
        "feddyn_alpha": 0.1,
        "signals_local": sig,
        "signals_global": sig,
    }


def _config(tiny, variant, steps_per_epoch, **extra):
    method, params, sections = VARIANTS[variant]
    over = copy.deepcopy(sections)
    over["client"] = {
        **over.get("client", {}),
        "method": method,
        "params": params,
        "local_epochs": 2,
        "iterations_per_epoch": steps_per_epoch,
        **extra.pop("client", {}),
    }
    over["dataset"] = {"rotation": 10.0}  # rotation + crop + flip on every batch
    return tiny(**over, **extra)


def _counted_fits(tiny, tmp_path, variant, counter, **extra):
    """Counts of a fit with N and with 2N local steps (2 epochs of 2 or 4 steps: the
    batches halve, the epochs stay), after a warm-up fit that gives MOON / FedDyn their
    state from a previous participation."""
    counts, steps = [], []
    state = str(tmp_path / "state")
    for per_epoch in (2, 4):
        cfg = _config(tiny, variant, per_epoch, **copy.deepcopy(extra))
        w0 = runtime.get_weights(runtime.initial_model(cfg, runtime.load_bundle(cfg)))
        if per_epoch == 2:
            client_class(cfg.client.method)(cfg, state_dir=state).fit(w0, _fit_config(1))
        client = client_class(cfg.client.method)(cfg, state_dir=state)
        out = {}
        counts.append(
            counter.count(
                lambda out=out, client=client, w0=w0: out.update(
                    m=client.fit(w0, _fit_config(2))[2]
                )
            )
        )
        steps.append(out["m"]["steps"])
    assert steps[1] == 2 * steps[0] > 0
    return counts, out["m"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_per_step_host_sync(tiny, tmp_path, monkeypatch, variant):
    counter = SyncCounter(monkeypatch)
    (short, long), metrics = _counted_fits(tiny, tmp_path, variant, counter)
    assert sum(long.values()) > 0  # the shim sees the round's read-backs (weights, ...)
    assert _per_step_syncs(short, long) == {}
    method = VARIANTS[variant][0]
    if method in ("fedproto", "fpl", "fedpcl", "fedproc", "fedccl"):
        assert any(k.startswith("loss_") and k != "loss_ce" for k in metrics), metrics


def test_no_per_step_host_sync_with_bf16(tiny, tmp_path, monkeypatch):
    counter = SyncCounter(monkeypatch)
    (short, long), metrics = _counted_fits(
        tiny, tmp_path, "fedrcl", counter, client={"amp": "bf16"}
    )
    assert _per_step_syncs(short, long) == {}
    assert math.isfinite(metrics["loss_rcl"])


def test_the_shim_catches_a_per_step_read(tiny, tmp_path, monkeypatch):
    """A loss term that reads its value back and masks with a boolean tensor every step
    is reported, by call site: the counter cannot pass by counting nothing."""
    counter = SyncCounter(monkeypatch)
    from clients import fedavg

    def leaky_terms(self):
        def fn(b):
            loss = F.cross_entropy(b.logits, b.y)
            _ = float(loss.detach()), b.logits[b.y == 0]
            return loss

        return [LossTerm("ce", fn)]

    monkeypatch.setattr(fedavg.FedAvgClient, "loss_terms", leaky_terms, raising=False)
    (short, long), _ = _counted_fits(tiny, tmp_path, "fedavg", counter)
    grew = _per_step_syncs(short, long)
    # reported at the project line that called the term (the test file is not project)
    import inspect

    from fedrcl_flwr import training

    src, first = inspect.getsourcelines(training.train_local)
    line = first + next(i for i, ln in enumerate(src) if "value = t.fn(batch)" in ln)
    assert grew == {
        f"fedrcl_flwr/training.py:{line} __float__": (4, 8),
        f"fedrcl_flwr/training.py:{line} mask __getitem__": (4, 8),
    }


# --------------------------------------------------- amp off: the previous loop's numbers
def _previous_batches(dataset, indices, batch_size, seed):
    """The previous host-side ``runtime.make_batches`` + ``get_batch`` (transliterated):
    normalise and augment on the host, draws from the same generator in the same order."""
    from fedrcl_flwr.augment import random_crop_flip, random_rotation

    def get_batch(idx, g):
        idx_t = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        aug = dataset.augment
        if aug is not None and aug.rotation > 0:
            x = random_rotation(
                dataset.images[idx_t].float().div_(255.0), aug.rotation, generator=g
            )
            x = (x - dataset.mean) / dataset.std
        else:
            x = (dataset.images[idx_t].float().div_(255.0) - dataset.mean) / dataset.std
        if aug is not None:
            if aug.crop_pad > 0:
                x = random_crop_flip(x, pad=aug.crop_pad, flip=aug.flip, generator=g)
            elif aug.flip:
                do = torch.rand(x.shape[0], generator=g) < 0.5
                x = torch.where(do[:, None, None, None], x.flip(3), x)
        return x, dataset._labels_t[idx_t]

    def batches(epoch):
        g = torch.Generator()
        g.manual_seed((seed + 1000003 * epoch) & ((1 << 63) - 1))
        idx = np.asarray(indices, np.int64)[torch.randperm(len(indices), generator=g).numpy()]
        for i in range(0, len(idx), batch_size):
            yield get_batch(idx[i : i + batch_size], g)

    return batches


def _previous_train_local(model, batches, terms, settings):
    """The previous ``train_local`` (transliterated): Python-float sums read every step."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, settings)
    model.train()
    loss, norm, sums, step = 0.0, 0.0, {t.name: 0.0 for t in terms}, 0
    for epoch in range(settings.epochs):
        for group in opt.param_groups:
            group["lr"] = settings.lr * settings.epoch_lr_decay**epoch
        for i, (x, y) in enumerate(batches(epoch)):
            if settings.iterations_per_epoch and i >= settings.iterations_per_epoch:
                break
            logits, feats = model(x, return_features=True)
            from fedrcl_flwr.training import Batch

            b = Batch(x=x, y=y, logits=logits, feats=feats, model=model)
            total = None
            for t in terms:
                value = t.fn(b)
                sums[t.name] += float(value.detach())
                total = t.weight * value if total is None else total + t.weight * value
            opt.zero_grad(set_to_none=True)
            total.backward()
            norm += float(torch.nn.utils.clip_grad_norm_(params, settings.grad_clip))
            opt.step()
            loss += float(total.detach())
            step += 1
    return loss / step, norm / step, {k: v / step for k, v in sums.items()}


def _rcl_terms(model):
    from fedrcl_flwr.losses.rcl import rcl_loss

    return [
        cross_entropy_term(),
        LossTerm(
            "rcl",
            lambda b: rcl_loss([b.feats[lv] for lv in model.levels], b.y),
            needs_features=True,
        ),
    ]


def test_amp_off_reproduces_the_previous_host_loop_exactly(tiny):
    cfg = tiny(dataset={"rotation": 10.0}, client={"method": "fedrcl"})
    bundle = runtime.load_bundle(cfg)
    assert bundle.train.augment.rotation > 0 and bundle.train.augment.crop_pad > 0
    idx = runtime.client_partitions(cfg)[3]
    settings = LocalTrainSettings(
        lr=0.05, epochs=2, grad_clip=1.0, weight_decay=1e-3, epoch_lr_decay=0.9
    )
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(runtime.new_model(cfg, bundle))
    torch.manual_seed(1)
    old = _previous_train_local(
        models[0], _previous_batches(bundle.train, idx, 32, 7), _rcl_terms(models[0]), settings
    )
    torch.manual_seed(1)
    new = train_local(
        models[1],
        runtime.make_batches(bundle.train, idx, 32, 7, device=torch.device("cpu")),
        _rcl_terms(models[1]),
        settings,
        torch.device("cpu"),
    )
    assert (new.loss, new.grad_norm, new.terms) == old  # the same floats, to the bit
    for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()):
        assert torch.equal(a, b)


def test_evaluation_numbers_are_unchanged(tiny):
    from fedrcl_flwr.evaluation import evaluate_model

    cfg = tiny()
    bundle = runtime.load_bundle(cfg)
    model = runtime.initial_model(cfg, bundle).eval()
    groups = np.arange(len(bundle.test)) % 3
    res = evaluate_model(
        model,
        bundle.test,
        torch.device("cpu"),
        batch_size=64,
        groups=groups,
        group_names=["a", "b", "c"],
    )
    loss, correct, hits = 0.0, 0, []
    with torch.no_grad():  # the previous loop: per-batch float / int reads
        for i in range(0, len(bundle.test), 64):
            x, y = bundle.test.get_batch(np.arange(i, min(i + 64, len(bundle.test))))
            logits = model(x)
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            hits.append((logits.argmax(1) == y).numpy())
    hit = np.concatenate(hits)
    assert res.loss == loss / len(bundle.test)
    assert res.accuracy == correct / len(bundle.test)
    assert res.per_group["b"] == float(hit[groups == 1].mean())


# -------------------------------------------------- losses rewritten without host reads
def _previous_official_scl(sim, same, kp, kn, tau):
    """The SCL part of the previous ``rcl._official``, which read ``n_other`` on the host
    and branched on it (transliterated)."""
    L, B, _ = sim.shape
    inv_t, inf = 1.0 / tau, float("inf")
    kp_eff = min(kp, B)
    pos = sim.masked_fill(~same, inf)
    pos = (
        pos.amin(-1, keepdim=True)
        if kp_eff == 1
        else torch.topk(pos, kp_eff, dim=-1, largest=False, sorted=False).values
    )
    n_other = B - int(same.sum(1).min())
    kn_eff = min(kn, n_other)
    if kn_eff > 0:
        neg_all = sim.masked_fill(same, -inf)
        neg = (
            torch.topk(neg_all, kn_eff, dim=-1, largest=True, sorted=False).values
            if kn_eff < n_other
            else neg_all
        )
        neg = neg * inv_t
    if kp_eff == 1:
        p = pos * inv_t
        rows = (
            torch.logsumexp(torch.cat([p, neg], -1), -1) - p[..., 0]
            if kn_eff > 0
            else (p - p)[..., 0]
        )
        return rows / kp
    valid = torch.isfinite(pos)
    p = torch.where(valid, pos, torch.zeros_like(pos)) * inv_t
    if kn_eff > 0:
        z = torch.cat([p.unsqueeze(-1), neg.unsqueeze(-2).expand(L, B, kp_eff, neg.shape[-1])], -1)
        rows = torch.logsumexp(z, -1) - p
    else:
        rows = p - p
    return (rows * valid).sum(-1) / kp


@pytest.mark.parametrize(
    "labels", [[0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 1], [3, 3, 3, 3], [0, 1, 2, 3, 4, 5], [1]]
)
@pytest.mark.parametrize("kp,kn", [(1, 1), (1, 2), (2, 3), (3, 9)])
def test_rcl_official_without_host_branch_matches_the_host_branch(labels, kp, kn):
    """The official SCL (no host read: only shapes decide sizes) against the version that
    branched on the labels on the host, in float64: equal to rounding, values and
    gradients, on degenerate batches too (one class, singletons, one sample)."""
    from fedrcl_flwr.losses.rcl import _label_masks, _similarities, rcl_loss

    y = torch.tensor(labels)
    g = torch.Generator().manual_seed(kp * kn)
    feats = torch.randn(2, len(labels), 5, generator=g, dtype=torch.float64)
    grads, values = [], []
    for fn in ("previous", "now"):
        f = feats.clone().requires_grad_(True)
        if fn == "previous":
            sim = _similarities(list(f))
            same, _ = _label_masks(y, sim.shape[-1], sim.device)
            scl = _previous_official_scl(sim, same, kp, kn, 0.1)
        else:
            kw = dict(tau=0.1, lam=0.5, beta=0.0, topk_pos=kp, topk_neg=kn)
            scl = rcl_loss(list(f), y, return_per_anchor=True, **kw)[1]["scl"]
        scl.sum().backward()
        values.append(scl.detach())
        grads.append(f.grad)
    assert torch.isfinite(grads[1]).all()
    assert torch.allclose(values[0], values[1], rtol=1e-12, atol=1e-12)
    assert torch.allclose(grads[0], grads[1], rtol=1e-10, atol=1e-12)


def test_selections_without_boolean_masks_are_bit_identical():
    from fedrcl_flwr.losses.baselines import _not_true, feddecorr_loss
    from fedrcl_flwr.losses.univarfl import _median_of_nonzero

    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(7, 5, generator=g), torch.tensor([0, 4, 2, 2, 1, 3, 4])
    keep = torch.ones_like(logits, dtype=torch.bool)
    keep[torch.arange(7), y] = False
    assert torch.equal(_not_true(logits, y), logits[keep].view(7, 4))
    # FedDecorr: the off-diagonal entries, as the boolean mask gave them
    z = torch.randn(9, 6, generator=g)
    x = z - z.mean(0, keepdim=True)
    x = x / torch.sqrt(1e-8 + x.var(0, keepdim=True))
    m = x.t() @ x
    assert feddecorr_loss(z) == m[~torch.eye(6, dtype=torch.bool)].pow(2).mean() / 9
    # FedUV's σ: the median of the non-zero distances, ties included (value and gradient)
    for d in ([0.0, 3.0, 0.0, 1.0, 2.0, 2.0], [5.0, 0.0], [4.0, 4.0, 1.0, 0.0, 0.0, 0.0, 9.0]):
        a = torch.tensor(d, requires_grad=True)
        b = torch.tensor(d, requires_grad=True)
        med, any_nonzero = _median_of_nonzero(a)
        med.backward()
        b[b != 0].median().backward()
        assert bool(any_nonzero) and med == b[b != 0].median() and torch.equal(a.grad, b.grad)
    assert not bool(_median_of_nonzero(torch.zeros(3))[1])


def test_prototype_means_are_device_side_and_exact_when_every_sample_counts():
    from fedrcl_flwr.losses import baselines as B

    g = torch.Generator().manual_seed(3)
    z, protos = torch.randn(6, 4, generator=g), torch.randn(5, 4, generator=g)
    plabels = torch.tensor([0, 0, 1, 2, 2])
    y_all = torch.tensor([0, 1, 2, 2, 1, 0])  # every sample has a prototype
    sims = F.cosine_similarity(z[:, None], protos[None], dim=-1) / 0.5
    pos = plabels[None] == y_all[:, None]
    per = torch.logsumexp(sims, 1) - torch.logsumexp(sims.masked_fill(~pos, -math.inf), 1)
    assert B.fedproc_loss(z, y_all, protos, plabels, 0.5) == per.sum() / 6  # bit-identical
    # some samples without a prototype: the same mean up to rounding order
    y_some = torch.tensor([0, 3, 2, 3, 1, 0])
    pos = plabels[None] == y_some[:, None]
    valid = pos.any(1)
    ref = (torch.logsumexp(sims, 1) - torch.logsumexp(sims.masked_fill(~pos, -math.inf), 1))[valid]
    assert float(B.fedproc_loss(z, y_some, protos, plabels, 0.5)) == pytest.approx(
        float(ref.sum() / 6), rel=1e-6
    )
    # none: 0, with a finite (zero) gradient, not the NaN of −inf − (−inf)
    zz = z.clone().requires_grad_(True)
    for loss in (
        B.fedproc_loss(zz, torch.full((6,), 4), protos, plabels, 0.5),
        B.fpl_loss(zz, torch.full((6,), 4), protos, plabels, 5, 0.5),
        sum(B.fedpcl_loss(zz, torch.full((6,), 4), protos, plabels, protos, plabels)),
    ):
        zz.grad = None
        loss.backward()
        assert float(loss.detach()) == 0.0 and torch.equal(zz.grad, torch.zeros_like(zz))


# ---------------------------------------------------------------------- mixed precision
def test_bf16_on_cpu_trains_with_float32_loss_terms(tiny):
    cfg = tiny(client={"method": "fedrcl"})
    bundle = runtime.load_bundle(cfg)
    torch.manual_seed(0)
    model = runtime.new_model(cfg, bundle)
    before = [p.detach().clone() for p in model.parameters()]
    seen = collections.defaultdict(set)

    def forward(m, x, need):
        logits, feats = m(x, return_features=need)
        seen["forward"].add((logits.dtype, torch.is_autocast_enabled("cpu")))
        return logits, feats

    def spy(b):
        seen["term"].add(
            (
                b.logits.dtype,
                *sorted({str(f.dtype) for f in b.feats.values()}),
                torch.is_autocast_enabled("cpu"),
            )
        )
        return F.cross_entropy(b.logits, b.y)

    terms = _rcl_terms(model) + [LossTerm("spy", spy, needs_features=True)]
    idx = runtime.client_partitions(cfg)[0]
    stats = train_local(
        model,
        runtime.make_batches(bundle.train, idx, 32, 3),
        terms,
        LocalTrainSettings(lr=0.05, epochs=1, grad_clip=10.0, amp="bf16"),
        torch.device("cpu"),
        forward=forward,
    )
    assert seen["forward"] == {(torch.bfloat16, True)}  # the forward ran in bf16
    assert seen["term"] == {(torch.float32, "torch.float32", False)}  # the losses did not
    assert all(math.isfinite(v) for v in (stats.loss, stats.grad_norm, *stats.terms.values()))
    assert stats.steps > 0 and stats.terms["rcl"] > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.fixture
def no_flower(monkeypatch):
    """Fail the test if the CLI gets as far as starting Flower."""
    import subprocess

    from fedrcl_flwr import runner

    def boom(*a, **k):
        raise AssertionError("a Flower process was about to start")

    monkeypatch.setattr(runner, "run_simulation_via_flower", boom)
    monkeypatch.setattr(subprocess, "Popen", boom)


def test_fp16_needs_cuda(tiny, tmp_path, capsys, monkeypatch, no_flower):
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        accel.amp_dtype("fp16", "cpu")
    assert accel.amp_dtype("fp16", "cuda") is torch.float16  # decided, not run
    assert accel.amp_dtype("off", "cpu") is None
    with pytest.raises(ConfigError, match="client.amp fp16 needs a CUDA device"):
        train_local(
            torch.nn.Linear(2, 2),
            lambda e: iter(()),
            [cross_entropy_term()],
            LocalTrainSettings(lr=0.1, amp="fp16"),
            torch.device("cpu"),
        )
    with pytest.raises(ConfigError, match="'client.amp' fp16 needs a CUDA device"):
        tiny(client={"amp": "fp16", "device": "cpu"})
    # device auto on a machine without CUDA: the CLI says so before any Flower process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "exp.yaml"
    path.write_text((ROOT / "experiments" / "quickstart.yaml").read_text())
    rc = cli.main(["run", str(path), "--set", "client.amp=fp16", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and str(path) in err and "client.amp" in err


@pytest.mark.parametrize(
    "key,bad", [("amp", "fp32"), ("amp", True), ("channels_last", "nhwc"), ("channels_last", 1)]
)
def test_bad_amp_and_channels_last_values_exit_2(tmp_path, capsys, no_flower, key, bad):
    path = tmp_path / "exp.yaml"
    path.write_text((ROOT / "experiments" / "quickstart.yaml").read_text())
    value = "true" if bad is True else bad
    rc = cli.main(
        ["run", str(path), "--set", f"client.{key}={value}", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"client.{key}" in err and str(path) in err
    assert not (tmp_path / "o").exists()


def test_yaml_off_means_off(tiny):
    assert tiny(client={"amp": False}).client.amp == "off"  # `amp: off` in YAML 1.1
    assert tiny().client.amp == "off" and tiny().client.channels_last == "auto"


# -------------------------------------------------------- transfers and memory format
def test_transfer_plan_pins_and_overlaps_only_for_cuda():
    assert accel.transfer_plan("cpu") == (False, False)
    assert accel.transfer_plan(None) == (False, False)
    assert accel.transfer_plan(torch.device("cuda")) == (True, True)
    assert accel.transfer_plan("cuda:1") == (True, True)
    src = torch.arange(24, dtype=torch.uint8).view(6, 4)
    idx = torch.tensor([4, 0, 4])
    assert torch.equal(accel.gather_rows(src, idx, pin=False), src[idx])
    if torch.cuda.is_available():  # pinned staging needs a CUDA runtime
        out = accel.gather_rows(src, idx, pin=True)
        assert out.is_pinned() and torch.equal(out, src[idx])


def test_batches_on_a_device_are_the_host_batches(tiny):
    from torch.utils.data import Subset

    from fedrcl_flwr.data.datasets import iterate_batches

    bundle = runtime.load_bundle(tiny(dataset={"rotation": 10.0}))
    idx = np.arange(40)
    a = list(iterate_batches(bundle.train, idx, 16, generator=torch.Generator().manual_seed(1)))
    b = list(
        iterate_batches(
            bundle.train,
            idx,
            16,
            generator=torch.Generator().manual_seed(1),
            device=torch.device("cpu"),
        )
    )
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    # a dataset without a device-aware get_batch still gets its batches moved
    plain = bundle.train.plain()
    c = list(
        iterate_batches(
            Subset(plain, list(range(20))), np.arange(20), 8, device=torch.device("cpu")
        )
    )
    assert torch.equal(torch.cat([x for x, _ in c]), plain.get_batch(np.arange(20))[0])
    assert not bundle.train.images.is_pinned()  # the source array is only read


def test_channels_last_auto_is_for_cuda_conv_models_whose_norms_keep_nhwc(tiny, monkeypatch):
    cfg = tiny(model={"name": "resnet18_gn"})
    conv = runtime.new_model(cfg, runtime.load_bundle(cfg))
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    assert accel.use_channels_last("auto", "cpu", conv) is False
    assert accel.use_channels_last(True, "cpu", conv) is True
    assert accel.use_channels_last(False, "cuda", conv) is False
    for keeps in (True, False):  # the per-process probe of the norm layers, faked
        monkeypatch.setattr(
            accel, "_norm_keeps_channels_last", lambda kind, dev, keeps=keeps: keeps
        )
        assert accel.use_channels_last("auto", "cuda", conv) is keeps
        assert accel.use_channels_last("auto", "cuda", mlp) is False
    with pytest.raises(ConfigError):
        accel.use_channels_last("yes", "cpu", conv)
    # the probe itself: a plain answer, and no draw from the generator (a client's
    # random stream must not depend on whether its process had probed already)
    monkeypatch.undo()
    state = torch.random.get_rng_state()
    accel._norm_keeps_channels_last.cache_clear()
    assert accel._norm_keeps_channels_last(torch.nn.GroupNorm, "cpu") in (True, False)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_channels_last_training_gives_the_same_model(tiny):
    cfg = tiny()
    bundle = runtime.load_bundle(cfg)
    idx = runtime.client_partitions(cfg)[1]
    out = []
    for cl in (False, True):
        torch.manual_seed(0)
        model = runtime.new_model(cfg, bundle)
        if cl:
            model.to(memory_format=torch.channels_last)
        torch.manual_seed(1)
        train_local(
            model,
            runtime.make_batches(bundle.train, idx, 32, 5),
            [cross_entropy_term()],
            LocalTrainSettings(lr=0.05, epochs=1, channels_last=cl),
            torch.device("cpu"),
        )
        out.append(runtime.get_weights(model))
    for a, b in zip(*out):  # NHWC changes the kernels' summation order, not the maths
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        assert a.flags["C_CONTIGUOUS"] and b.flags["C_CONTIGUOUS"]


def test_fit_returns_copies_and_the_runners_upload_the_same_weights_as_views(tiny, tmp_path):
    """``fit`` (Flower's NumPyClient API) returns arrays of its own: a later round of
    the same process (the same pooled model) leaves them as they were. The runners'
    ``WireClient`` writes ``upload()``'s read-only views of the model instead, with the
    same bytes."""
    from flwr.common import FitIns

    from fedrcl_flwr.app.wire import transport
    from fedrcl_flwr.codec import decode_arrays

    cfg = tiny()
    cls = client_class("fedavg")
    w0 = runtime.get_weights(runtime.initial_model(cfg, runtime.load_bundle(cfg)))
    first, _, _ = cls(cfg, state_dir=str(tmp_path)).fit(w0, _fit_config(1))
    kept = [a.copy() for a in first]
    client = cls(cfg, state_dir=str(tmp_path))
    res = client.to_client().fit(FitIns(transport.to_bytes(w0), _fit_config(1)))
    views = client.upload()
    assert all(not v.flags.writeable for v in views)
    assert all(
        a.tobytes() == b.tobytes() for a, b in zip(decode_arrays(res.parameters.tensors), first)
    )
    cls(cfg, state_dir=str(tmp_path)).fit(first, _fit_config(2))  # trains the pooled model again
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, kept))


def test_a_method_that_overrides_fit_is_refused_when_defined():
    from clients.base import FederatedClient

    with pytest.raises(TypeError, match="override train_round\\(\\) or upload\\(\\)"):

        class Bad(FederatedClient):  # noqa: F841 - defining it is the test
            def fit(self, parameters, config):
                return super().fit(parameters, config)
