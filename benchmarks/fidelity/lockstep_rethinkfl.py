"""The RethinkFL side of ``lockstep.py`` (WenkeHuang/RethinkFL @ 74201b3, FPL, CVPR 2023):
their unmodified ``main.py`` (``main.main()`` with their own argparse: ``--dataset
fl_digits``) with their ``resnet10`` at their width 64, ``FedAvG`` / ``FPL`` and their
``aggregate_nets``, against our ``fedavg`` / ``fpl`` clients (``mean_over: batch``,
``proto_source: last_epoch``, ``variant: official``, τ 0.02), the ``fedavg`` strategy
weighted by samples and ``resnet10_bn`` (nf 64).

Protocol (defaults; the command line changes them): the Digits files of
``benchmarks/fidelity/rethinkfl.py`` (scikit-learn's digits drawn as MNIST idx, USPS bz2,
SVHN .mat and SynthDigits PNG, 60 test images per domain) with ``exact=True``: MNIST in a
32-px box and USPS on 16 grey levels, so that their per-image Pillow resize and ours give
the same pixels; their domain split (``np.random.choice`` of the domains, then each
client's share :data:`FRACTION` of its domain: ours ``generator: rethinkfl_digits``); 4
clients, all every round, one local epoch of batch 64, SGD lr 0.01 (theirs), momentum 0.9,
weight decay 1e-5, no gradient clipping; their augmentation ``RandomCrop(32, padding=4)``
+ flip (``--augment off``: identity draws). ``--alpha`` is not used (a domain split). The
accuracy is the mean over the four domains' test sets (theirs ``global_evaluate``), which
with equal test sets is ours over all of them.

Shims (in the child process, before their ``main`` runs; none edits their files), each for
this CPU and today's NumPy, or handing their unchanged code a value the plan fixed, or
reading what it computed:

1. **Environment** (as ``rethinkfl.py``): ``setproctitle`` a no-op module;
   ``utils.conf.data_path()`` the files' folder; SVHN's MD5 check / download off;
   ``torch.set_num_threads`` kept at ``--threads`` (their ``parse_args`` asks for 4);
   ``get_data_loaders`` gets the domain list as a Python list (their ``selected_domain_list
   == []`` on a NumPy array raises under NumPy >= 1.25; older NumPy answered ``False``);
   ``np.array`` as ``models/fpl.py`` sees it makes a 1-d object array of a list of torch
   tensors (their per-class prototype lists; NumPy >= 1.24 refuses ragged lists, and an
   equal-shape list would become a numeric array on which their ``[...][0].to(device)``
   fails): the same tensors selected by the same masks.
2. **Protocol values**: ``FedLeaDigits.percent_dict`` every domain :data:`FRACTION`
   (theirs 0.01 of the full sets); ``best_args['fl_digits'][method]`` ``local_lr`` and
   ``local_batch_size`` from ``--lr`` / ``--batch-size`` (theirs 0.01 / 64, the defaults).
3. **Initial model.** ``FedLeaDigits.get_backbone`` runs as theirs, then every net is
   loaded with the plan's initial weights (ours renamed ``fc.* -> linear.*``; their unused
   ``encoder`` MLP keeps its drawn values). Their first net, built right after their
   ``set_random_seed(seed)``, is the plan's model already (our ``initial_model`` draws the
   same layers in the same order from ``torch.manual_seed(seed)``): the run checks and
   prints it.
4. **Clients of a round.** Their ``FederatedModel.random_state`` is
   ``np.random.RandomState()`` — seeded from the operating system, not from ``--seed`` —
   and ``loc_update`` draws ``choice(range(N), online_num, replace=False)`` from it: a
   random order of the clients even when all take part. That one object is replaced by
   one that answers exactly this call (checked) with the plan's clients of the round, in
   the plan's order. It draws nothing else in their run.
5. **Batch order.** ``SubsetRandomSampler.__iter__`` (the sampler of their client loaders)
   yields, inside a client's ``_train_net``, the plan's order of the current local epoch
   (our global indices less the domain's offset: indices of their domain dataset),
   checked to be a permutation of the sampler's own ``indices``. The round and client
   come from a wrapper of the model's ``_train_net`` (called with their arguments; it
   notes ``(epoch_index + 1, index)`` and checks afterwards that every planned epoch was
   used). Their ``randperm`` would have come from torch's global generator, which decides
   nothing else that is not fed here.
6. **Augmentation draws.** While a planned epoch is read, ``RandomCrop.get_params`` (the
   offsets their ``RandomCrop.forward`` draws after padding) returns the plan's ``(top,
   left)`` and ``RandomHorizontalFlip.forward`` flips where the plan's flip is true (its
   two lines re-done: ``F.hflip(img)`` if flipped). The draws are queued as the sampler
   yields each index and taken in that order as their dataset reads it
   (``num_workers`` 0: one process, in order); the queue is checked empty after each
   epoch. ``--augment off``: identity draws (the crop at the padding's offset, no flip).
7. **Observation.** ``utils.training.global_evaluate`` (called by their ``train`` after
   each round's aggregation) runs unchanged; then, inside ``record.observing()``, the
   global net's ``state_dict`` is copied (``linear.* -> fc.*``, the ``encoder`` left out:
   ours has none) and it predicts each domain's test set (their test loaders, in order)
   in eval mode, its mode restored.

Their split is checked, not shimmed: the run stops unless each client's sampler indices
(plus its domain's offset) are the plan's partition (ours keeps them sorted; their sampler
reorders them every epoch anyway).
"""

from __future__ import annotations

import json
import sys
import types
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lockstep import Quirk, identity_draw  # noqa: E402

NAME = "rethinkfl"
SOURCE = "WenkeHuang/RethinkFL @ 74201b3"
METHODS = ("fedavg", "fpl")
DEFAULTS = {
    "clients": 4,
    "participation": 1.0,
    "epochs": 1,
    "batch_size": 64,
    "lr": 0.01,
    "alpha": 0.0,
}
DOMAINS = ["mnist", "usps", "svhn", "syn"]
FRACTION = 0.25  # each client's share of its domain (their percent_dict: 0.01)
NF = 64  # their resnet10 width
CROP_PAD = 4

QUIRKS: tuple[Quirk, ...] = (
    Quirk(
        "the clients' order in a round: theirs from np.random.RandomState() seeded by the "
        "operating system (a new order every round and every run, whatever --seed); it "
        "decides which client gets which of torch's draws and the order of the average "
        "(theirs is a bug: a seeded run is not reproducible); ours from the seed, in id order",
        "none (the harness feeds the plan's order)",
        theirs_is_bug=True,
    ),
    Quirk(
        "the average's arithmetic: theirs sums float32(n_i / n) * w_i in float32, client by "
        "client, over every state entry (BatchNorm's num_batches_tracked too, truncated); "
        "ours by default in float64: set here",
        "server.average_dtype: float32",
    ),
    Quirk(
        "gradient clipping: theirs none; ours by default clips the local gradient at norm "
        "10 (FedRCL's and FedACG's codes); FPL's contrast at 1/tau = 50 exceeds it now and "
        "then (set here)",
        "client.grad_clip: null",
    ),
    Quirk(
        "FPL's loss (--method fpl): theirs a per-sample loop in float32 (exp, a masked sum, "
        "-log of the ratio) against the cluster prototypes in the order their classes "
        "first appear; ours by default the batch at once (log-sum-exp), classes sorted: "
        "the same formula, another rounding, which 1/tau = 50 amplifies over an epoch",
        "client.params.variant: official",
    ),
    Quirk(
        "MNIST / USPS resized to 32 px: theirs Pillow's bilinear per image, ours PyTorch's "
        "antialiased bilinear once at load (at most one grey level apart on some pixels); "
        "this protocol's files avoid it (MNIST at 32 px, USPS on 16 grey levels)",
        "none",
    ),
    Quirk(
        "their ResNet-10's encoder MLP is built, averaged and sent but never used or "
        "trained; ours has none (left out of the comparison)",
        "none",
    ),
)


def checkout_problem(path: Path) -> str | None:
    for f in ("main.py", "models/fpl.py", "datasets/digits.py", "backbone/ResNet.py"):
        if not (path / f).is_file():
            return f"no {f} (a checkout of WenkeHuang/RethinkFL?)"
    return None


def write_data(a, data: Path) -> None:
    sizes_file = data / "sizes.json"
    if sizes_file.is_file():
        return
    import rethinkfl

    data.mkdir(parents=True, exist_ok=True)
    sizes = rethinkfl.write_files(data, exact=True)
    sizes_file.write_text(json.dumps({d: int(sizes[d][0]) for d in DOMAINS}))


def our_experiment(a, data: Path, work: Path) -> dict:
    params = (
        {
            "tau": 0.02,
            "lam": 1.0,
            "mean_over": "batch",
            "proto_source": "last_epoch",
            "variant": "official",
        }
        if a.method == "fpl"
        else {}
    )
    augment = (
        {"crop_pad": CROP_PAD, "flip": True, "pad_fill": "black"}
        if a.augment == "on"
        else {"augment": False}
    )
    return {
        "name": f"lockstep_rethinkfl_{a.method}",
        "dataset": {
            "name": "digit5",
            "root": str(data),
            "domains": DOMAINS,
            "verify_md5": False,
            "image_size": 32,
            "normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
            **augment,
            "cache_dir": str(work / "cache"),
        },
        "partition": {
            "scheme": "domain",
            "generator": "rethinkfl_digits",
            "domain_fraction": FRACTION,
        },
        "model": {"name": "resnet10_bn", "params": {"nf": NF}},
        "federation": {"num_clients": a.clients, "participation": a.participation},
        "client": {
            "method": a.method,
            "params": params,
            "optimizer": "sgd",
            "lr": a.lr,
            "lr_decay": 1.0,  # theirs: no schedule (the schema's default is FedRCL's 0.998)
            "momentum": 0.9,
            "weight_decay": 1.0e-5,
            "grad_clip": None,  # theirs does not clip (the schema's default is FedRCL's 10)
            "local_epochs": a.epochs,
            "batch_size": a.batch_size,
        },
        "server": {"strategy": "fedavg", "weighting": "samples", "average_dtype": "float32"},
        "evaluation": {"batch_size": 64},
    }


# ------------------------------------------------------------------------ their side


def ours_to_theirs(name: str) -> str:
    return "linear." + name[len("fc.") :] if name.startswith("fc.") else name


def theirs_to_ours(name: str) -> str | None:
    """Ours for their ``state_dict`` name; ``None`` for their unused ``encoder`` and for
    ``_features.*`` / ``cls.*``, second names of modules already listed (their
    ``nn.Sequential(self.conv1, self.bn1, ..., self.layer4)`` and ``self.cls =
    self.linear``)."""
    if name.startswith(("encoder.", "_features.", "cls.")):
        return None
    return "fc." + name[len("linear.") :] if name.startswith("linear.") else name


class _Planned:
    """Shims 4-6: the round, the client, its local epoch, the queued draws."""

    def __init__(self):
        self.round = 0
        self.client = -1
        self.epoch = 0
        self.draws: deque = deque()


def _numpy_for_fpl(np_module):
    """Shim 1: ``models/fpl.py``'s ``np`` with an ``array`` that keeps a list of torch
    tensors as a 1-d object array; every other name is NumPy's."""
    import torch

    def array(x, *args, **kw):
        if isinstance(x, list) and x and all(isinstance(v, torch.Tensor) for v in x):
            out = np_module.empty(len(x), dtype=object)
            for i, v in enumerate(x):
                out[i] = v
            return out
        return np_module.array(x, *args, **kw)

    ns = types.SimpleNamespace(
        **{n: getattr(np_module, n) for n in dir(np_module) if not n.startswith("__")}
    )
    ns.array = array
    return ns


def their_side(a, plan, data: Path, work: Path, record) -> None:
    import torch
    import torch.utils.data as tud
    import torchvision.transforms as T
    import torchvision.transforms.functional as TF

    # shim 1: environment
    sys.modules.setdefault("setproctitle", types.SimpleNamespace(setproctitle=lambda *x: None))  # type: ignore[arg-type]
    torch.set_num_threads = lambda n: None  # type: ignore[assignment]
    import torchvision.datasets as tvd

    tvd.SVHN._check_integrity = lambda self: True  # type: ignore[method-assign]
    tvd.SVHN.download = lambda self: None  # type: ignore[method-assign]
    sys.path.insert(0, ".")
    import utils.conf

    utils.conf.data_path = lambda: str(data) + "/"
    import datasets.digits as digits
    import models as their_models
    import models.fpl
    import utils.best_args
    import utils.training

    loaders = digits.FedLeaDigits.get_data_loaders
    digits.FedLeaDigits.get_data_loaders = lambda self, sel=[]: loaders(self, list(sel))  # noqa: B006
    models.fpl.np = _numpy_for_fpl(np)

    # shim 2: protocol values
    digits.FedLeaDigits.percent_dict = {d: FRACTION for d in DOMAINS}
    best = utils.best_args.best_args["fl_digits"][a.method]
    best["local_lr"], best["local_batch_size"] = a.lr, a.batch_size

    state = _Planned()
    sizes = json.loads((data / "sizes.json").read_text())
    offset = dict(zip(DOMAINS, np.cumsum([0] + [sizes[d] for d in DOMAINS[:-1]]).tolist()))
    client_domain: list[str] = []

    # the split, checked: each client's sampler indices + its domain's offset = the plan's
    split = digits.partition_digits_domain_skew_loaders

    def checked_split(train_datasets, test_datasets, setting):
        train_loaders, test_loaders = split(train_datasets, test_datasets, setting)
        for c, (ds, dl) in enumerate(zip(train_datasets, train_loaders)):
            name = ds.data_name
            n = len(ds.imagefolder_obj if name == "syn" else ds.dataset)
            if n != sizes[name]:
                raise SystemExit(
                    f"lockstep: their {name} has {n} training images, ours {sizes[name]}"
                )
            client_domain.append(name)
            got = np.asarray(dl.sampler.indices, dtype=np.int64) + offset[name]
            # ours keeps a client's indices sorted (its sampler reorders every epoch)
            if not np.array_equal(np.sort(got), plan.partition(c)):
                raise SystemExit(f"lockstep: client {c}: their split differs from ours")
        return train_loaders, test_loaders

    digits.partition_digits_domain_skew_loaders = checked_split

    # shim 3: the initial model
    initial = {ours_to_theirs(k): v for k, v in plan.initial_state().items()}
    backbone = digits.FedLeaDigits.get_backbone

    def planned_backbone(parti_num, names_list):
        nets = backbone(parti_num, names_list)
        first = nets[0].state_dict()
        same = all(torch.equal(first[k], v) for k, v in initial.items())
        print(f"lockstep: their first net drawn after their seed is the plan's model: {same}")
        for net in nets:
            # the aliases (_features.*, cls.*) are the same tensors: loaded with them
            own = {k: v for k, v in net.state_dict().items() if k.startswith("encoder.")}
            net.load_state_dict({**own, **initial}, strict=False)
            missing = [
                k
                for k, v in net.state_dict().items()
                if theirs_to_ours(k) and not torch.equal(v, initial[k])
            ]
            if missing:
                raise RuntimeError(f"lockstep: the plan's model did not load: {missing[:3]}")
        return nets

    digits.FedLeaDigits.get_backbone = staticmethod(planned_backbone)

    # shim 4: the clients of a round; shim 5's (round, client)
    class PlannedChoice:
        def __init__(self, model):
            self.model = model

        def choice(self, population, size, replace=True, p=None):
            if list(population) != list(range(len(plan.partitions))) or replace or p is not None:
                raise RuntimeError("lockstep: an unexpected draw from their RandomState")
            rnd = self.model.epoch_index + 1
            if int(size) != len(plan.clients(rnd)):
                raise RuntimeError(
                    f"lockstep: they take {size} clients, the plan {len(plan.clients(rnd))}"
                )
            return np.asarray(plan.clients(rnd))

    get_model = their_models.get_model

    def planned_model(nets_list, args, transform):
        model = get_model(nets_list, args, transform)
        model.random_state = PlannedChoice(model)
        train_net = model._train_net

        def planned_train_net(index, net, train_loader):
            if state.round == 0:
                record.start()  # their first round's first training
            state.round, state.client, state.epoch = model.epoch_index + 1, int(index), 0
            out = train_net(index, net, train_loader)
            planned = len(plan.epochs(state.round, state.client))
            if state.epoch != planned or state.draws:
                raise RuntimeError(
                    f"lockstep: round {state.round}, client {index}: {state.epoch} epochs "
                    f"read of {planned} planned, {len(state.draws)} draws left"
                )
            state.client = -1
            return out

        model._train_net = planned_train_net
        return model

    their_models.get_model = planned_model

    # shim 5: batch order (their client loaders' SubsetRandomSampler)
    def planned_iter(sampler):
        if state.client < 0:
            raise RuntimeError("lockstep: a client loader read outside a client's training")
        epochs = plan.epochs(state.round, state.client)
        if state.epoch >= len(epochs) or state.draws:
            raise RuntimeError(
                f"lockstep: round {state.round}, client {state.client}: epoch {state.epoch} not planned"
            )
        ep = epochs[state.epoch]
        state.epoch += 1
        local = ep.order - offset[client_domain[state.client]]
        if sorted(local.tolist()) != sorted(np.asarray(sampler.indices).tolist()):
            raise RuntimeError(
                f"lockstep: client {state.client}: the plan's order is not its samples"
            )
        sizes_ = np.diff(ep.bounds)
        if len(sizes_) and (np.any(sizes_[:-1] != a.batch_size) or sizes_[-1] > a.batch_size):
            raise RuntimeError(f"lockstep: the plan's batches {sizes_.tolist()} are not theirs")
        for k, i in enumerate(local.tolist()):
            draw = ep.draws(k) if a.augment == "on" else identity_draw(CROP_PAD)
            if draw["angle"] not in (None, 0.0) or draw["top"] is None or draw["flip"] is None:
                raise RuntimeError(f"lockstep: draws {draw} are not their crop and flip")
            state.draws.append(draw)
            yield i

    tud.SubsetRandomSampler.__iter__ = planned_iter  # type: ignore[method-assign]

    # shim 6: augmentation draws
    crop_params = T.RandomCrop.get_params

    def planned_crop_params(img, output_size):
        if state.client < 0:
            return crop_params(img, output_size)
        d = state.draws[0]
        th, tw = output_size
        return d["top"], d["left"], th, tw

    def planned_flip(self, img):
        if state.client < 0:
            raise RuntimeError("lockstep: a training flip outside a client's training")
        d = state.draws.popleft()
        return TF.hflip(img) if d["flip"] else img

    T.RandomCrop.get_params = staticmethod(planned_crop_params)  # type: ignore[method-assign]
    T.RandomHorizontalFlip.forward = planned_flip  # type: ignore[method-assign]

    # shim 7: observation
    evaluate = utils.training.global_evaluate

    def observed_evaluate(model, test_dl, setting, name):
        accs = evaluate(model, test_dl, setting, name)
        with record.observing():
            net = model.global_net
            was = net.training
            net.eval()
            preds = []
            with torch.no_grad():
                for dl in test_dl:
                    for x, _ in dl:
                        preds.append(net(x.to(model.device)).argmax(1).cpu().numpy())
            net.train(was)
            weights = {}
            for k, v in net.state_dict().items():
                ours = theirs_to_ours(k)
                if ours is not None:
                    weights[ours] = v.detach().cpu().numpy()
            record.round(
                model.epoch_index + 1, weights, float(np.mean(accs)), np.concatenate(preds)
            )
        return accs

    utils.training.global_evaluate = observed_evaluate

    sys.argv = [
        "main.py", "--dataset", "fl_digits", "--model", a.method, "--seed", str(a.seed),
        "--parti_num", str(len(plan.partitions)), "--communication_epoch", str(a.rounds),
        "--local_epoch", str(a.epochs),
        "--online_ratio", repr((len(plan.clients(1)) - 0.5) / len(plan.partitions)),
    ]  # fmt: skip
    import main

    main.main()
