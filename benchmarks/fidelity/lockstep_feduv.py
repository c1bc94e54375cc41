"""The FedUV side of ``lockstep.py`` (sonhamin/FedUV @ dd2e3c5): their unmodified
``train_fl.py`` (run as ``__main__`` with their own argparse) with their ``SimpleCNN``,
``train_net_feduv`` / ``train_net_fedavg`` and FedAvg aggregation, against our
``univarfl`` client (``variant: feduv``, λ 2.5, μ 0.5) or ``fedavg`` client, the
``fedavg`` strategy weighted by samples and ``feduv_simplecnn`` (their SimpleCNN, ported).

Protocol (defaults; the command line changes them): scikit-learn's digits as CIFAR-10
files (1,440 training and 357 test images, 32 px, each 8x8 digit repeated to 32x32 RGB),
read by their ``load_cifar10_data`` / ``get_dataloader`` (torchvision's ``CIFAR10``, no
augmentation, their ``Normalize``) and by ours (``augment: false``, the same constants);
4 clients, all every round, their ``partition_data``: ``--alpha`` > 0 their 'noniid'
Dirichlet split (ours ``generator: feduv``), ``--alpha 0`` their 'homo' split (ours
``scheme: iid``, ``generator: feduv``: 360 images per client, a multiple of the default
batch, so that no epoch has an incomplete last batch); one local epoch of batch 20, SGD
momentum 0.9, weight decay 1e-5, lr 0.01 × their cosine over the rounds; their
``--out_dim`` 256. ``--augment`` changes nothing here: their CIFAR-10 pipeline has no
augmentation, and ours is off to match.

Shims (in the child process, before their script runs; none edits their files), each
handing their unchanged code a value the plan fixed, or reading what it computed:

1. **Initial model.** The name ``SimpleCNN`` that ``train_fl.py`` imports is a function
   that builds their ``SimpleCNN`` with their arguments and loads the plan's initial
   weights into it (ours renamed ``fc.* -> fc3.*``, strict). Their global model (the 11th net they build) and their
   clients then start from the plan's model; the values their constructor drew from
   torch's global generator are overwritten, and that generator decides nothing else
   that is not fed below.
2. **Clients of a round.** At ``--participation`` 1 their list is every client in id
   order, checked equal to the plan's. Otherwise their ``random.sample(party_list, n)``
   (Python's ``random``, drawn for every round before the split) is answered, for exactly
   that call, with the plan's clients of the round in the plan's order; every other call
   is Python's. ``--sample_fraction`` is passed as (k + ½) / N so that their
   ``int(N · fraction)`` is the plan's k. Python's ``random`` draws nothing else in their
   run.
3. **Batch order.** ``torch.utils.data.DataLoader`` is replaced (their module looks it up
   at call time) by a subclass with ``num_workers=0`` and no ``persistent_workers`` /
   ``pin_memory`` / ``worker_init_fn`` (their 8 workers per loader, 22 loaders, on a
   2-core machine: worker processes change where, not what, is computed). A client's
   training loader (their ``DatasetSplit`` of the client's indices, ``shuffle=True``,
   ``drop_last=True``) gets, instead of ``shuffle``, a sampler that yields, at its k-th
   iteration in a round, the plan's order of local epoch k (global indices turned into
   positions in their ``DatasetSplit``); their ``drop_last=True`` batch sampler cuts it
   into batches as before. The round and client come from a wrapper of their
   ``train_net_feduv`` / ``train_net_fedavg`` (called with their arguments; it only notes
   ``(round, net_id)`` and checks afterwards that every planned epoch was used). Their
   shuffle's seed would have come from torch's global generator, which decides nothing
   else here; the global training loader of their train-accuracy print keeps its own
   shuffle (an accuracy, in evaluation mode, order-independent).
4. **Observation.** ``compute_accuracy`` (their import in ``train_fl.py``) is wrapped:
   their evaluation runs unchanged; after the test-set call of each round the global
   model's ``state_dict`` is copied (renamed ``fc3.* -> fc.*``) and the model predicts the
   test set (their test loader, in order, ``argmax`` of the logits as their
   ``torch.max``) inside ``record.observing()``; its train / eval mode is restored.
5. **Environment.** ``nn.Module.cuda`` returns the module (their ``compute_accuracy``
   calls ``model.cuda()`` even with ``--device cpu``; ``--device cuda`` leaves it theirs);
   torchvision's CIFAR MD5s accept the digits files.

Their split is checked, not shimmed: the run stops unless each client's index list of
their ``partition_data`` equals the plan's, in order.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from lockstep import Quirk  # noqa: E402

NAME = "feduv"
SOURCE = "sonhamin/FedUV @ dd2e3c5"
METHODS = ("feduv", "fedavg")
DEFAULTS = {
    "clients": 4,
    "participation": 1.0,
    "epochs": 1,
    "batch_size": 20,
    "lr": 0.01,
    "alpha": 0.5,
}
# 1,440 training images: 4 x 360 under their 'homo' split, a multiple of batches of 20
TEST_FRACTION = 356.5 / 1797


def _has_drop_last() -> bool:
    """Whether this checkout's ``client`` section has ``drop_last`` (FedUV's loader)."""
    from fedrcl_flwr.config.schema import ClientConfig

    return any(f.name == "drop_last" for f in fields(ClientConfig))


QUIRKS: tuple[Quirk, ...] = (
    Quirk(
        "an epoch's last, incomplete batch: theirs DataLoader(drop_last=True) drops it (a "
        "client of fewer than a batch takes no step) and averages by every sample; "
        + (
            "ours drops it too with client.drop_last (set here)"
            if _has_drop_last()
            else "ours keeps it (this checkout has no client.drop_last): weights differ "
            "from round 1 unless every client's size is a multiple of the batch (--alpha 0)"
        ),
        "client.drop_last: true",
    ),
    Quirk(
        "the average's arithmetic: theirs sums float32(n_i / n) * w_i in float32, client "
        "by client, over every state entry (BatchNorm's num_batches_tracked too, then "
        "truncated to an integer); ours by default in float64 (one rounding), counters the "
        "largest. One float32 rounding per entry after round 1, which training amplifies "
        "(their own code from models one float32 step apart differs as much): set here",
        "server.average_dtype: float32",
    ),
    Quirk(
        "their round also evaluates the global model on the whole training set (their "
        "print of the train accuracy and loss); ours evaluates the test set only",
        "none (time only)",
    ),
)


def checkout_problem(path: Path) -> str | None:
    for f in ("train_fl.py", "nets/models.py", "algs/feduv.py", "utils/dataloader.py"):
        if not (path / f).is_file():
            return f"no {f} (a checkout of sonhamin/FedUV?)"
    return None


def write_data(a, data: Path) -> None:
    if not (data / "cifar-10-batches-py").is_dir():
        C.write_digits_as_cifar10(data, test_fraction=TEST_FRACTION)


def our_experiment(a, data: Path, work: Path) -> dict:
    if a.method == "feduv":
        method, params = "univarfl", {"variant": "feduv", "lam": 2.5, "mu": 0.5}
    else:
        method, params = "fedavg", {}
    partition = (
        {"scheme": "iid", "generator": "feduv"}
        if a.alpha <= 0
        else {
            "scheme": "dirichlet",
            "alpha": a.alpha,
            "balanced": False,
            "min_size": 10,
            "generator": "feduv",
        }
    )
    client = {
        "method": method,
        "params": params,
        "optimizer": "sgd",
        "lr": a.lr,
        "lr_decay": 1.0,
        "lr_schedule": "cosine",
        "momentum": 0.9,
        "weight_decay": 1e-5,
        "local_epochs": a.epochs,
        "batch_size": a.batch_size,
        "grad_clip": None,
    }
    if _has_drop_last():
        client["drop_last"] = True
    return {
        "name": f"lockstep_feduv_{a.method}",
        "dataset": {
            "name": "cifar10",
            "root": str(data),
            "verify_md5": False,
            "augment": False,
            "normalize": {"mean": C.CIFAR_MEAN, "std": C.CIFAR_STD},
            "cache_dir": str(work / "cache"),
        },
        "partition": partition,
        # their SimpleCNN has its own projector: no second one (univarfl asks for the key)
        "model": {"name": "feduv_simplecnn", "params": {"out_dim": 256, "projector": 0}},
        "federation": {"num_clients": a.clients, "participation": a.participation},
        "client": client,
        # their server's arithmetic (server.average_dtype), so that the sides agree bit
        # for bit rather than to the last float32 digit, which training amplifies
        "server": {"strategy": "fedavg", "weighting": "samples", "average_dtype": "float32"},
        "evaluation": {"batch_size": 500},
    }


# ------------------------------------------------------------------------ their side


def ours_to_theirs(name: str) -> str:
    return "fc3." + name[len("fc.") :] if name.startswith("fc.") else name


def theirs_to_ours(name: str) -> str:
    return "fc." + name[len("fc3.") :] if name.startswith("fc3.") else name


class _Planned:
    """The round and client their training function was called for, and the epoch the
    client's loader is at (shim 3)."""

    def __init__(self, plan):
        self.plan = plan
        self.round = 0
        self.client = -1
        self.epoch = 0
        self.partition_of: dict = {}  # tuple(indices) -> client id


def their_side(a, plan, data: Path, work: Path, record) -> None:
    import random
    import runpy

    import torch
    import torch.utils.data as tud

    if a.device == "cpu":
        torch.nn.Module.cuda = lambda self, *args, **kw: self  # type: ignore[method-assign]
    C.patch_torchvision_cifar_integrity()
    state = _Planned(plan)
    for c in range(len(plan.partitions)):
        state.partition_of[tuple(int(i) for i in plan.partition(c))] = c

    class PlannedOrder(tud.Sampler):
        """Shim 3: the plan's order of the current local epoch, as positions in their
        ``DatasetSplit`` of the client's indices."""

        def __init__(self, idxs: list, client: int, batch_size: int):
            self.client = client
            self.batch_size = batch_size
            self.position = {int(g): p for p, g in enumerate(idxs)}
            self.n = len(idxs)

        def __len__(self) -> int:
            return self.n

        def __iter__(self):
            if state.client != self.client:
                raise RuntimeError(
                    f"lockstep: client {self.client}'s loader read while client "
                    f"{state.client} trains"
                )
            epochs = plan.epochs(state.round, self.client)
            if state.epoch >= len(epochs):
                raise RuntimeError(
                    f"lockstep: round {state.round}, client {self.client}: more local "
                    f"epochs than the plan's {len(epochs)}"
                )
            ep = epochs[state.epoch]
            state.epoch += 1
            sizes = np.diff(ep.bounds)
            if len(sizes) and (
                np.any(sizes[:-1] != self.batch_size) or sizes[-1] > self.batch_size
            ):
                raise RuntimeError(
                    f"lockstep: round {state.round}, client {self.client}: the plan's "
                    f"batches {sizes.tolist()} are not batches of {self.batch_size} "
                    "(their DataLoader cuts the order into batches of that size)"
                )
            return iter([self.position[int(g)] for g in ep.order])

    base = tud.DataLoader

    class PlannedLoader(base):  # type: ignore[misc, valid-type]
        def __init__(self, dataset, *args, **kw):
            kw.update(num_workers=0, persistent_workers=False, pin_memory=False)
            kw.pop("worker_init_fn", None)
            idxs = getattr(dataset, "idxs", None)
            if kw.get("shuffle") and idxs is not None:
                key = tuple(int(i) for i in idxs)
                if key not in state.partition_of:
                    raise SystemExit(
                        "lockstep: their partition_data gave a client index list that is "
                        "none of the plan's (the splits differ)"
                    )
                kw.pop("shuffle")
                kw["sampler"] = PlannedOrder(
                    list(idxs), state.partition_of[key], int(kw["batch_size"])
                )
            super().__init__(dataset, *args, **kw)

    tud.DataLoader = PlannedLoader  # type: ignore[misc]

    import algs.fedavg
    import algs.feduv
    import nets.models
    import utils.calculate_acc
    import utils.dataloader

    # shim 1: their SimpleCNN, started from the plan's model
    initial = {ours_to_theirs(k): v for k, v in plan.initial_state().items()}
    their_cnn = nets.models.SimpleCNN

    def plan_start_simple_cnn(*args, **kw):
        # their class's own super(SimpleCNN, self) reads the module's name: theirs again
        # once train_fl.py has imported this function under that name
        nets.models.SimpleCNN = their_cnn
        net = their_cnn(*args, **kw)
        net.load_state_dict(initial, strict=True)
        return net

    nets.models.SimpleCNN = plan_start_simple_cnn

    # shim 2: the clients of each round
    n_clients = len(plan.partitions)
    k = len(plan.clients(1))
    rounds_asked = []
    real_sample = random.sample

    def planned_sample(population, n, *args, **kw):
        if list(population) == list(range(n_clients)) and n == k and not args and not kw:
            rounds_asked.append(len(rounds_asked) + 1)
            return plan.clients(rounds_asked[-1])
        return real_sample(population, n, *args, **kw)

    random.sample = planned_sample  # type: ignore[assignment]

    # shim 3: (round, client) of each local training
    def planned(train):
        def wrapper(net_id, net, train_dataloader, *args, **kw):
            # their signatures end with (..., args, round, device, logger)
            rnd = int(kw["round"] if "round" in kw else args[-3]) + 1
            if state.round == 0:
                record.start()  # their first round's first training
            state.round = rnd
            if int(net_id) not in plan.clients(rnd):
                raise RuntimeError(f"lockstep: round {rnd}: client {net_id} is not planned")
            state.client, state.epoch = int(net_id), 0
            out = train(net_id, net, train_dataloader, *args, **kw)
            if state.epoch != len(plan.epochs(rnd, int(net_id))):
                raise RuntimeError(
                    f"lockstep: round {rnd}, client {net_id}: {state.epoch} epochs read, "
                    f"{len(plan.epochs(rnd, int(net_id)))} planned"
                )
            return out

        return wrapper

    algs.fedavg.train_net_fedavg = planned(algs.fedavg.train_net_fedavg)
    algs.feduv.train_net_feduv = planned(algs.feduv.train_net_feduv)

    # shim 4: observation after each round's test evaluation
    their_accuracy = utils.calculate_acc.compute_accuracy
    observed = [0]

    def observed_accuracy(model, dataloader, *args, **kw):
        out = their_accuracy(model, dataloader, *args, **kw)
        if isinstance(dataloader.dataset, utils.dataloader.DatasetSplit):
            return out  # their train-set accuracy print
        observed[0] += 1
        with record.observing():
            was = model.training
            model.eval()
            preds = []
            with torch.no_grad():
                for x, _ in dataloader:
                    preds.append(model(x.to(a.device))[2].argmax(1).cpu().numpy())
            model.train(was)
            weights = {
                theirs_to_ours(n): t.detach().cpu().numpy() for n, t in model.state_dict().items()
            }
            record.round(observed[0], weights, 100.0 * float(out[0]), np.concatenate(preds))
        return out

    utils.calculate_acc.compute_accuracy = observed_accuracy

    split = "homo" if a.alpha <= 0 else "noniid"
    fraction = 1.0 if k == n_clients else (k + 0.5) / n_clients
    logdir = work / "theirs_logs"
    logdir.mkdir(parents=True, exist_ok=True)
    sys.argv = [
        "train_fl.py",
        "--dataset", "cifar10", "--datadir", str(data), "--partition", split,
        "--alpha", str(a.alpha), "--n_parties", str(n_clients),
        "--sample_fraction", repr(fraction), "--comm_round", str(a.rounds),
        "--epochs", str(a.epochs), "--batch-size", str(a.batch_size), "--lr", repr(a.lr),
        "--alg", a.method, "--model", "simple-cnn", "--out_dim", "256",
        "--seed", str(a.seed), "--device", a.device, "--logdir", str(logdir),
        "--optimizer", "sgd", "--reg", "1e-5",
    ]  # fmt: skip
    if k == n_clients:
        rounds_asked.extend(range(1, a.rounds + 1))  # their list: every client, in id order
        if plan.clients(1) != list(range(n_clients)):
            raise SystemExit("lockstep: full participation but the plan's clients differ")
    runpy.run_path("train_fl.py", run_name="__main__")
    if rounds_asked != list(range(1, a.rounds + 1)):
        raise SystemExit(f"lockstep: their client sampler asked for rounds {rounds_asked}")
    if observed[0] != a.rounds:
        raise SystemExit(f"lockstep: {observed[0]} rounds observed, {a.rounds} run")
