"""Their side of the lockstep harness for the code family of skynbe/FedRCL and
geehokim/FedACG (FedRCL is built on FedACG's code: the same ``trainers/base_trainer.py``
round loop, ``servers/base.py``, ``datasets/build.py``, ``utils/data.py``; ``lockstep.py``'s
modules ``lockstep_fedrcl`` and ``lockstep_fedacg`` differ only in their config groups).

:func:`run_trainer` runs what their ``federated_train.main`` runs — ``initalize_random_seed``,
``build_encoder``, ``get_client_type``, ``build_server``, ``build_datasets``,
``get_evaler_type``, their ``Trainer`` and ``trainer.train()`` — on the CPU (or ``--device
cuda``), with hydra's composition of their ``configs/`` done by :func:`compose`, and these
shims, each of which hands their unchanged code a value the plan fixed or reads what it
computed:

1. **Initial model.** Their model class, built by their ``build_encoder`` where ``main``
   builds it, then loaded with the plan's initial weights (``load_state_dict``, strict)
   before their trainer copies it into its clients. A value their code would have drawn,
   replaced by ours; nothing computed differs.
2. **Clients of a round** (:class:`PlannedNumpy`). Their ``Trainer.train`` draws
   ``np.random.choice(range(N), M, replace=False)`` from the NumPy name of
   ``trainers/base_trainer.py``; that name is given an object which answers this one call
   (checked: the same ``range(N)``, ``M`` and ``replace=False``) with the plan's clients of
   the round, in the plan's order, and passes every other attribute to NumPy. Their loop
   then trains and averages those clients in that order. NumPy's generator is used by
   nothing else in their run, so skipping the draw changes no other number.
3. **Batch order** (:class:`PlannedBatches`, :class:`PlannedSamples`). Their
   ``Client.setup`` runs unchanged (weights, ``DataLoader``, SGD, ``LambdaLR``); then the
   client's ``loader`` is replaced by a ``DataLoader`` over the same ``local_dataset``
   (their ``DatasetSplitSubset``), ``num_workers=0``, whose batch sampler yields, at its
   k-th iteration, the plan's batches of local epoch k (the plan's global indices turned
   into positions of their subset; the batch contents and the cut are the plan's).
   Their original loader (``shuffle=True``, ``drop_last`` false) draws the order from
   torch's global generator, which nothing else draws from after this point; the images
   and labels are still read by their dataset and collated by PyTorch's default collate,
   as before.
4. **Augmentation draws** (:class:`PlannedTransforms`). Their training transform stays
   ``RandomRotation(10) -> RandomCrop(32, padding=4) -> RandomHorizontalFlip ->
   ToTensor -> Normalize`` (torchvision's objects, their ``forward``); while a planned
   sample is read, ``RandomRotation.get_params`` and ``RandomCrop.get_params`` (the two
   draws their ``forward`` makes) return the plan's angle and offsets, and the flip's
   draw (``torch.rand(1) < p``, inside its ``forward``) is the plan's flip (its two lines
   re-done: ``F.hflip(img)`` if flipped). Pillow applies the rotation, torchvision the pad,
   crop and flip, exactly as their pipeline does for a drawn value. Outside a planned
   read (their split, their per-round label counts in ``DatasetSplitSubset``) the
   transforms draw as theirs do, from torch's global generator, which decides nothing
   else there. ``--augment off``: identity draws (angle 0: Pillow returns a copy; crop at
   the padding's offset; no flip), so their images are the un-augmented ones.
5. **Observation.** ``trainer.evaluate`` (called by their loop after each round's
   aggregation) is wrapped: their evaluation runs, then the global weights are copied and
   a copy of the model predicts the test set (their test loader, ``torch.max`` of the
   logits as their evaler) outside the timed span. Nothing is written back.
6. **Environment.** hydra is not used (:func:`compose`, as ``benchmarks/fidelity/
   fedacg.py``, whose composition was checked against hydra's); modules their path does
   not use on this protocol are stubbed when absent (``omegaconf`` type hints, ``netcal``
   of an unused ECE, ``umap`` of an unused plot, ``imageio``, ``tabulate``,
   ``torchmetrics``, ``torchinfo``); torchvision's CIFAR MD5s accept the digits files;
   ``dataset.client_path`` is an empty folder (their trainer draws the split; it is
   checked equal to ours, client for client); ``use_amp: False`` (on a CPU their
   ``GradScaler`` / ``autocast`` are disabled anyway).

Their split is checked, not shimmed: :func:`check_split` fails the run unless their
trainer's client index sets equal the plan's.
"""

from __future__ import annotations

import copy
import importlib.machinery
import re
import sys
import types
from pathlib import Path

import numpy as np

STUBS = {
    "omegaconf": {"DictConfig": dict, "OmegaConf": object},
    "netcal": {},
    "netcal.metrics": {"ECE": object},
    "umap": {},
    "umap.umap_": {},
    "imageio": {},
    "tabulate": {"tabulate": lambda *x, **k: ""},
    "torchmetrics": {},
    "torchinfo": {},
}


def install_stubs() -> list[str]:
    """Stub modules for the imports of :data:`STUBS` that are not installed; returns
    their names."""
    made = []
    for name, attrs in STUBS.items():
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            continue
        except ImportError:
            pass
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        if name == "torchmetrics":
            import torch.nn as nn

            attrs = {"Metric": nn.Module}
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)
        made.append(name)
    return made


# ------------------------------------------------------------------------ config


class Cfg(dict):
    """Attribute access and ``.get`` over nested dicts and lists of dicts (what their
    code asks of hydra's ``DictConfig`` / ``ListConfig``)."""

    def __init__(self, d=None):
        super().__init__()
        for k, v in (d or {}).items():
            self[k] = _wrap(v)

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None

    def __setattr__(self, k, v):
        self[k] = v


def _wrap(v):
    if isinstance(v, dict):
        return Cfg(v)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


def _floats(d):
    """``1e-3`` is a float to hydra's YAML loader (OmegaConf) and a string to PyYAML's."""
    if isinstance(d, dict):
        return {k: _floats(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_floats(v) for v in d]
    if isinstance(d, str) and re.fullmatch(r"[-+]?[0-9.]+[eE][-+]?[0-9]+", d.strip()):
        return float(d)
    return d


def compose(code: Path, groups: dict, sets: dict) -> Cfg:
    """Their ``configs/config.yaml`` with the groups ``groups`` (group -> file name, as
    hydra's defaults list and command-line group choices select them) and the dotted
    overrides ``sets``."""
    from fedrcl_flwr.config.loading import parse_yaml  # the hardened reader

    def load(rel: str) -> dict:
        path = code / "configs" / rel
        return parse_yaml(path.read_text(), str(path)) or {}

    cfg = _floats(load("config.yaml"))
    cfg.pop("defaults", None)
    for group, name in groups.items():
        cfg[group] = _floats(load(f"{group}/{name}.yaml"))
    for key, v in sets.items():
        d = cfg
        *path, last = key.split(".")
        for p in path:
            d = d.setdefault(p, {})
        d[last] = v
    return Cfg(cfg)


# ------------------------------------------------------------------------ shims


class PlannedNumpy:
    """Shim 2: NumPy for ``trainers/base_trainer.py``, whose ``random.choice(range(N), M,
    replace=False)`` returns the plan's clients of the next round."""

    def __init__(self, numpy_module, plan, num_clients: int):
        self._np = numpy_module
        self.random = _PlannedRandom(numpy_module.random, plan, num_clients)

    def __getattr__(self, name):
        return getattr(self._np, name)


class _PlannedRandom:
    def __init__(self, random_module, plan, num_clients: int):
        self._random = random_module
        self._plan = plan
        self._n = num_clients
        self.calls = 0

    def choice(self, a, size=None, replace=True, p=None):
        rnd = self.calls + 1
        if list(a) != list(range(self._n)) or replace or p is not None:
            raise RuntimeError(
                f"lockstep: their client sampler was called as choice({a!r}, {size}, "
                f"replace={replace}) in round {rnd}: not their trainer's call"
            )
        clients = self._plan.clients(rnd)
        if size != len(clients):
            raise RuntimeError(
                f"lockstep: round {rnd}: their trainer samples {size} clients, the plan "
                f"{len(clients)} (ours rounds participation x clients, theirs floors it)"
            )
        self.calls += 1
        return np.asarray(clients)

    def __getattr__(self, name):
        return getattr(self._random, name)


class PlannedTransforms:
    """Shim 4: the plan's draws for their torchvision transform chain (see the module
    docstring). :meth:`use` makes the next image read use ``draws`` (``{"angle", "top",
    "left", "flip"}``, ``None`` = our pipeline makes no such draw: the identity) and
    checks that every planned draw was taken once."""

    def __init__(self, compose_transform):
        import torchvision.transforms as T

        ts = getattr(compose_transform, "transforms", [])
        self.rotation = next((t for t in ts if isinstance(t, T.RandomRotation)), None)
        self.crop = next((t for t in ts if isinstance(t, T.RandomCrop)), None)
        self.flip = next((t for t in ts if isinstance(t, T.RandomHorizontalFlip)), None)
        self.pending: dict | None = None
        self.taken: set = set()
        if self.rotation is not None:
            self.rotation.get_params = self._angle
        if self.crop is not None:
            self.crop.get_params = self._offsets
        if self.flip is not None:
            self.flip.forward = self._flip

    @property
    def crop_pad(self) -> int:
        if self.crop is None:
            return 0
        pad = self.crop.padding
        if isinstance(pad, (list, tuple)):
            if len(set(pad)) != 1:
                raise RuntimeError(f"lockstep: their RandomCrop pads unevenly ({pad})")
            pad = pad[0]
        return int(pad or 0)

    def _angle(self, degrees):
        import torchvision.transforms as T

        if self.pending is None:
            return T.RandomRotation.get_params(degrees)
        self.taken.add("angle")
        angle = self.pending["angle"]
        return 0.0 if angle is None else float(angle)

    def _offsets(self, img, output_size):
        import torchvision.transforms as T

        if self.pending is None:
            return T.RandomCrop.get_params(img, output_size)
        self.taken.add("crop")
        top, left = self.pending["top"], self.pending["left"]
        if top is None or left is None:
            top = left = self.crop_pad
        h, w = output_size
        return int(top), int(left), h, w

    def _flip(self, img):
        import torchvision.transforms as T
        import torchvision.transforms.functional as F

        if self.pending is None:
            return T.RandomHorizontalFlip.forward(self.flip, img)
        self.taken.add("flip")
        return F.hflip(img) if self.pending["flip"] else img

    def use(self, draws: dict):
        return _Using(self, draws)


class _Using:
    def __init__(self, pt: PlannedTransforms, draws: dict):
        self.pt, self.draws = pt, draws

    def __enter__(self):
        pt, d = self.pt, self.draws
        missing = [
            k
            for k, present, identity in (
                ("angle", pt.rotation is not None, d.get("angle") in (None, 0.0)),
                ("crop", pt.crop is not None, d.get("top") is None),
                ("flip", pt.flip is not None, not d.get("flip")),
            )
            if not present and not identity
        ]
        if missing:
            raise RuntimeError(f"lockstep: the plan draws {missing} their pipeline does not make")
        pt.pending, pt.taken = d, set()
        return self

    def __exit__(self, *exc):
        pt = self.pt
        want = {
            name
            for name, t in (("angle", pt.rotation), ("crop", pt.crop), ("flip", pt.flip))
            if t is not None
        }
        pt.pending = None
        if exc[0] is None and pt.taken != want:
            raise RuntimeError(
                f"lockstep: a planned image read took the draws {sorted(pt.taken)}, "
                f"their pipeline makes {sorted(want)}"
            )
        return False


class PlannedSamples:
    """Shim 3: their ``local_dataset`` read at ``(position, draws)`` keys: the sample at
    that position of their subset, under the plan's draws. Exposes what their client reads
    of its loader's dataset (``dataset``, ``indices``, ``class_dict``)."""

    def __init__(self, local_dataset, transforms: PlannedTransforms):
        self.subset = local_dataset
        self.transforms = transforms
        self.dataset = local_dataset.dataset
        self.indices = local_dataset.indices
        self.class_dict = local_dataset.class_dict

    def __len__(self):
        return len(self.subset)

    def __getitem__(self, key):
        pos, draws = key
        with self.transforms.use(draws):
            return self.subset[pos]


class PlannedBatches:
    """Shim 3: the batch sampler of a client's round: iteration k yields the plan's
    batches of local epoch k as ``(position, draws)`` keys of :class:`PlannedSamples`."""

    def __init__(self, epochs, positions: dict, crop_pad: int, augment: bool):
        self.epochs = epochs
        self.positions = positions
        self.crop_pad = crop_pad
        self.augment = augment
        self.iterations = 0

    def __len__(self):
        return len(self.epochs[0].bounds) - 1

    def __iter__(self):
        from lockstep import identity_draw

        k = self.iterations
        if k >= len(self.epochs):
            raise RuntimeError(
                f"lockstep: their client ran a local epoch {k + 1}, the plan has {len(self.epochs)}"
            )
        self.iterations += 1
        ep = self.epochs[k]
        j = 0
        for batch in ep.batches():
            keys = []
            for g in batch:
                d = ep.draws(j) if self.augment else identity_draw(self.crop_pad)
                keys.append((self.positions[int(g)], d))
                j += 1
            yield keys


def check_split(their_split: dict, plan) -> None:
    """Their trainer's client index sets equal the plan's (ours), client for client."""
    n = len(plan.partitions)
    if len(their_split) != n:
        raise RuntimeError(f"lockstep: their split has {len(their_split)} clients, ours {n}")
    for c in range(n):
        theirs = sorted(int(i) for i in their_split[c])
        ours = sorted(int(i) for i in plan.partition(c))
        if theirs != ours:
            raise RuntimeError(
                f"lockstep: client {c}'s samples differ between their split and ours "
                f"({len(theirs)} vs {len(ours)} samples)"
            )


def their_predictions(model, test_loader, device) -> np.ndarray:
    """Their model's predicted classes on their test loader (their evaler's
    ``torch.max(results["logit"], 1)``), on a copy of the model."""
    import torch

    m = copy.deepcopy(model).to(device).eval()
    out = []
    with torch.no_grad():
        for images, _ in test_loader:
            out.append(torch.max(m(images.to(device))["logit"], 1)[1].cpu().numpy())
    return np.concatenate(out)


# ------------------------------------------------------------------------ the run


def run_trainer(a, plan, data: Path, work: Path, record, groups: dict, sets: dict) -> None:
    """Their ``federated_train.main`` with the shims of the module docstring, in this
    process (the child: working directory their checkout, first on ``sys.path``)."""
    import logging

    import torch
    from torch.utils.data import DataLoader

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _common

    install_stubs()
    _common.patch_torchvision_cifar_integrity()
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    code = Path(a.authors_code)
    base_sets = {
        "seed": a.seed,
        "use_amp": False,
        "wandb": False,
        "num_workers": 0,
        "batch_size": a.batch_size,
        "checkpoint_path": str(work / "theirs" / "ckpt"),
        "log_dir": str(work / "theirs" / "log"),
        "save_freq": 0,
        "dataset.path": str(data),
        "dataset.client_path": str(work / "theirs" / "no_client_data"),
        "dataset.download": False,
        "split.mode": "dirichlet",
        "split.alpha": a.alpha,
        "trainer.num_clients": a.clients,
        "trainer.participation_rate": a.participation,
        "trainer.global_rounds": a.rounds,
        "trainer.local_epochs": a.epochs,
        "trainer.local_lr": a.lr,
        "trainer.local_lr_decay": 0.998,
    }
    args = compose(code, groups, {**base_sets, **sets})
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)

    import trainers.base_trainer as their_trainer_module  # noqa: I001 - theirs, first on sys.path
    from clients import get_client_type
    from datasets.build import build_datasets
    from evalers import get_evaler_type
    from models import build_encoder
    from servers import build_server
    from trainers import get_trainer_type
    from utils import initalize_random_seed

    initalize_random_seed(args)
    device = torch.device(a.device)
    model = build_encoder(args)  # where main builds it
    model.load_state_dict(plan.initial_state(), strict=True)  # shim 1
    trainer = get_trainer_type(args)(
        model=model,
        client_type=get_client_type(args),
        server=build_server(args),
        evaler_type=get_evaler_type(args),
        datasets=build_datasets(args),
        device=device,
        args=args,
        config=None,
    )
    check_split(trainer.local_dataset_split_ids, plan)

    # shim 2: the clients of each round
    sampler_np = PlannedNumpy(np, plan, a.clients)
    their_trainer_module.np = sampler_np

    # shim 4: the augmentation draws
    transforms = PlannedTransforms(trainer.datasets["train"].transform)
    augment = a.augment == "on"
    if (
        augment
        and transforms.crop is not None
        and plan.meta.get("crop_pad") not in (None, transforms.crop_pad)
    ):
        raise RuntimeError("lockstep: our crop padding differs from theirs")

    # shim 3: the batch order, client by client
    loaders_done: list = []

    def planned_setup(client, original):
        def setup(**kw):
            original(**kw)
            rnd, c = int(kw["global_epoch"]) + 1, int(client.client_index)
            if c not in plan.clients(rnd):
                raise RuntimeError(f"lockstep: their round {rnd} trains client {c}, not planned")
            local = kw["local_dataset"]
            positions = {int(g): i for i, g in enumerate(local.indices)}
            sampler = PlannedBatches(plan.epochs(rnd, c), positions, transforms.crop_pad, augment)
            client.loader = DataLoader(
                PlannedSamples(local, transforms), batch_sampler=sampler, num_workers=0
            )
            loaders_done.append((rnd, c, sampler))

        return setup

    for client in trainer.clients:
        client.setup = planned_setup(client, client.setup)

    # shim 5: observe each round's global model
    their_evaluate = trainer.evaluate

    def evaluate(epoch, local_datasets=None):
        out = their_evaluate(epoch=epoch, local_datasets=local_datasets)
        with record.observing():
            rnd = int(epoch) + 1
            ran = [(r, c, s.iterations) for r, c, s in loaders_done if r == rnd]
            if sorted(c for _, c, _ in ran) != sorted(plan.clients(rnd)) or any(
                it != a.epochs for *_, it in ran
            ):
                raise RuntimeError(f"lockstep: round {rnd} did not run the planned loaders: {ran}")
            weights = {k: v.detach().cpu().numpy() for k, v in trainer.model.state_dict().items()}
            preds = their_predictions(trainer.model, trainer.evaler.test_loader, device)
            record.round(rnd, weights, float(out["acc"]), preds)
        return out

    trainer.evaluate = evaluate
    record.start()
    trainer.train()
    if sampler_np.random.calls not in (0, a.rounds):
        raise RuntimeError("lockstep: their sampler was not called once per round")


# ------------------------------------------------------------------------ our side


NORMALIZE = {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2023, 0.1994, 0.2010]}  # theirs


def their_clients_per_round(a) -> int:
    """``Trainer.train``'s ``M = max(int(participation_rate * num_clients), 1)``."""
    return max(int(a.participation * a.clients), 1)


def our_experiment(a, data: Path, work: Path, client: dict, server: dict) -> dict:
    """Our experiment of the family's protocol: their CIFAR-10 pipeline on the digits
    files (their ``datasets/configs.yaml`` constants; RandomRotation(10) -> RandomCrop(32,
    4) black -> flip, or none with ``--augment off``), their balanced Dirichlet split
    (``generator: fedrcl``, seed 0: their ``temp_seed(0)``), ResNet-18-GN (PyTorch's
    default init, as their ``models/``; the plan's initial model is ours anyway), their
    trainer's clients per round, SGD lr ``a.lr`` x 0.998 per round and per local epoch,
    no momentum, weight decay 1e-3, clip 10, full local epochs of ``a.batch_size``
    (theirs keeps the last, smaller batch), uniform averaging, float32."""
    augment = a.augment == "on"
    return {
        "name": f"lockstep_{a.code}_{a.method}",
        "dataset": {
            "name": "cifar10",
            "root": str(data),
            "verify_md5": False,
            "normalize": NORMALIZE,
            "rotation": 10 if augment else 0,
            "crop_pad": 4 if augment else 0,
            "flip": augment,
            "pad_fill": "black",
            "cache_dir": str(work / "cache"),
        },
        "partition": {
            "scheme": "dirichlet",
            "alpha": a.alpha,
            "balanced": True,
            "seed": 0,
            "generator": "fedrcl",
        },
        "model": {"name": "resnet18_gn", "init": "pytorch"},
        "federation": {
            "num_clients": a.clients,
            "clients_per_round": their_clients_per_round(a),
        },
        "client": {
            "optimizer": "sgd",
            "lr": a.lr,
            "lr_decay": 0.998,
            "epoch_lr_decay": 0.998,
            "momentum": 0.0,
            "weight_decay": 1e-3,
            "local_epochs": a.epochs,
            "batch_size": a.batch_size,
            "grad_clip": 10.0,
            "amp": "off",
            **client,
        },
        "server": {"weighting": "uniform", **server},
        "evaluation": {"batch_size": 500},
    }


def write_digits(data: Path) -> None:
    """scikit-learn's digits as CIFAR-10 batches (``_common.write_digits_as_cifar10``),
    unless already there."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _common

    if not (data / "cifar-10-batches-py").is_dir():
        _common.write_digits_as_cifar10(data)
