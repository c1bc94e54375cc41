"""Lockstep: the project's run and the authors' run of the same protocol, draw for draw,
compared round by round.

    python benchmarks/fidelity/lockstep.py --code {fedrcl,fedacg,feduv,rethinkfl} \\
        --authors-code PATH [--rounds 5] [--device cpu|cuda] [--augment on|off] \\
        [--method M] [--seed S] [--clients N] [--participation P] [--epochs E] \\
        [--batch-size B] [--lr LR] [--alpha A] [--threads T] [--out DIR] [--json FILE]

PATH is a checkout of the authors' repository (never vendored here: their code is imported
from PATH at run time, in a child process whose working directory is PATH). The side-by-side
harnesses (``fedacg.py``, ``feduv.py``, ``rethinkfl.py``) compare distributions over seeds;
this one removes the randomness instead, so that any difference left is a difference of
computation.

The plan (:func:`make_plan`): every random draw of the run, computed once from the project's
own generators before either side runs, and given to both:

* the initial global model: ours (``runtime.initial_model``), loaded into their model;
* the clients of each round: ours (``runtime.sample_partitions``), returned by their sampler;
* for each round, client and local epoch, the order of the client's samples and their cut
  into batches: ours (``runtime.make_batches`` with the client's seed), fed to their loader;
* for each sample, the augmentation draws ours makes for it (rotation angle, crop offsets,
  flip), fed to their transforms. ``--augment off``: no augmentation on our side, and on
  theirs identity draws through their unchanged transforms (angle 0, the crop at the
  padding's offset, no flip), which leave their images as their test pipeline makes them.

Our side runs twice: in this process through the project's real strategy and clients
(``fedrcl_flwr.app.inprocess.run_inprocess``), observed after each round, for the
comparison; and through ``fedrcl-flwr run`` (Flower's simulation, one client at a time, one
thread), for the speed. Their side runs once, in a child process, through the loop their
entry point runs (their trainer), fed the plan through the shims its module lists.

Printed per round: ``D`` = the max relative difference of the global weights, max over the
state entries k of max|ours_k − theirs_k| / max|theirs_k|; the test accuracy (%) of each side
by its own evaluation; the share (%) of test images whose predicted class (argmax of the
logits) is the same on both sides; the seconds of the round on each side (training,
aggregation, evaluation; ours in process). The last line::

    lockstep NAME: max rel weight diff D after N rounds; identical predictions P %; ours S1 s/round, theirs S2 s/round

with D and P of the last round, S1 = ours through ``fedrcl-flwr run`` and S2 = theirs: the
wall seconds per round between the end of round 1 and the end of round N (the first round,
which holds the start of workers and the first data loads, left out), each side run alone,
one after the other, with the same number of threads (``--threads``).

Interface of a code side (one module per authors' code, ``benchmarks/fidelity/
lockstep_<code>.py``, listed by one line in :data:`CODES`). The module defines:

``NAME: str``
    the ``--code`` value.
``SOURCE: str``
    the repository and commit its shims were written against ("owner/repo @ commit").
``METHODS: tuple[str, ...]``
    the ``--method`` values it runs; the first is the default.
``DEFAULTS: dict``
    the tiny protocol's defaults for the keys of :data:`PROTOCOL` that the command line
    leaves unset (``clients``, ``participation``, ``epochs``, ``batch_size``, ``lr``,
    ``alpha``).
``QUIRKS: tuple[Quirk, ...]``
    the differences in kind between the two codes that remain under this protocol, each
    with the key that gives theirs (printed before the table).
``checkout_problem(path: Path) -> str | None``
    why ``path`` is not a checkout of their code (``None``: it is).
``write_data(a, data: Path) -> None``
    the data files both sides read, written under ``data``.
``our_experiment(a, data: Path, work: Path) -> dict``
    our experiment (an experiment YAML as a dict) for ``a.method`` and the protocol in
    ``a``; the driver sets ``seed``, ``federation.rounds``, ``client.device``,
    ``output`` and ``simulation`` itself.
``their_side(a, plan: Plan, data: Path, work: Path, record: Recorder) -> None``
    run their code fed the plan, in the child process (working directory: their checkout,
    first on ``sys.path``; the project's packages ``clients`` and ``strategies`` must not be
    imported there, theirs have the same names); call ``record.start()`` when their first
    round begins and, after each round's aggregation, ``record.round(...)`` inside ``with
    record.observing():`` (time spent there is not counted as theirs) with the global
    weights keyed and shaped as our ``state_dict``, their accuracy and their test
    predictions.

What a module may use from here: :class:`Plan` (``plan.clients(r)``, ``plan.epochs(r, c)``
-> :class:`EpochPlan` with ``batches()`` and ``draws(k)``, ``plan.partition(c)``,
``plan.initial_state()``), :class:`Recorder`, :class:`Quirk`, :func:`identity_draw`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

# --code NAME -> its module (benchmarks/fidelity/lockstep_<code>.py): one line per code
CODES = {
    "fedrcl": "lockstep_fedrcl",
    "fedacg": "lockstep_fedacg",
    "feduv": "lockstep_feduv",
    "rethinkfl": "lockstep_rethinkfl",
}
ALL_CODES = ("fedrcl", "fedacg", "feduv", "rethinkfl")
PROTOCOL = ("clients", "participation", "epochs", "batch_size", "lr", "alpha")


@dataclass(frozen=True)
class Quirk:
    """A difference in kind between the two codes: what it is, which side it is a quirk
    of, the key (ours) that gives theirs, and whether theirs is a bug."""

    what: str
    key: str
    theirs_is_bug: bool = False

    def line(self) -> str:
        bug = " (theirs is a bug; ours is the default)" if self.theirs_is_bug else ""
        return f"- {self.what}; theirs: {self.key}{bug}"


# ------------------------------------------------------------------------------ plan


@dataclass
class EpochPlan:
    """One local epoch of one client in one round: the global training-set indices in the
    order the client visits them (``order``), cut into batches at ``bounds`` (batch k is
    ``order[bounds[k]:bounds[k + 1]]``), and per visited sample the augmentation draws
    ours makes for it (``angle`` degrees, crop ``top`` / ``left`` offsets in the padded
    image, ``flip``), each ``None`` where our pipeline makes no such draw."""

    order: np.ndarray
    bounds: np.ndarray
    angle: np.ndarray | None = None
    top: np.ndarray | None = None
    left: np.ndarray | None = None
    flip: np.ndarray | None = None

    def batches(self) -> list[np.ndarray]:
        return [self.order[a:b] for a, b in zip(self.bounds[:-1], self.bounds[1:])]

    def draws(self, k: int) -> dict:
        """The draws of the k-th visited sample: ``{"angle", "top", "left", "flip"}``,
        each a Python number or ``None``."""

        def pick(a, cast):
            return None if a is None else cast(a[k])

        return {
            "angle": pick(self.angle, float),
            "top": pick(self.top, int),
            "left": pick(self.left, int),
            "flip": pick(self.flip, bool),
        }


def identity_draw(crop_pad: int) -> dict:
    """Draws that leave torchvision's RandomRotation -> RandomCrop(padding=crop_pad) ->
    RandomHorizontalFlip chain's image unchanged (Pillow returns a copy for a rotation by
    0; the crop at the padding's offset is the image)."""
    return {"angle": 0.0, "top": int(crop_pad), "left": int(crop_pad), "flip": False}


@dataclass
class Plan:
    """The run's shared randomness (see the module docstring). ``names`` / ``initial``:
    the initial global model as our ``state_dict`` (names, arrays); ``rounds``: per round
    (1-based, index r − 1) the clients in the order ours aggregates them; ``partitions``:
    each client's training-set indices (ours); ``epoch_plans[(r, c)]``: the local epochs of
    client c in round r."""

    names: list[str]
    initial: list[np.ndarray]
    rounds: list[list[int]]
    partitions: list[np.ndarray]
    epoch_plans: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def clients(self, rnd: int) -> list[int]:
        return list(self.rounds[rnd - 1])

    def epochs(self, rnd: int, client: int) -> list[EpochPlan]:
        return self.epoch_plans[(rnd, client)]

    def partition(self, client: int) -> np.ndarray:
        return self.partitions[client]

    def initial_state(self) -> dict:
        """The initial model as a ``state_dict`` of CPU tensors."""
        import torch

        return {
            n: torch.from_numpy(np.array(w, copy=True)) for n, w in zip(self.names, self.initial)
        }

    # ---- files (NumPy arrays without pickles, and JSON)
    def save(self, path: Path) -> None:
        arrays: dict[str, np.ndarray] = {}
        for i, w in enumerate(self.initial):
            arrays[f"init/{i}"] = np.asarray(w)
        for c, idx in enumerate(self.partitions):
            arrays[f"part/{c}"] = np.asarray(idx, dtype=np.int64)
        keys = []
        for (r, c), eps in sorted(self.epoch_plans.items()):
            for e, ep in enumerate(eps):
                base = f"r{r}/c{c}/e{e}"
                keys.append([r, c, e])
                arrays[f"{base}/order"] = ep.order
                arrays[f"{base}/bounds"] = ep.bounds
                for k in ("angle", "top", "left", "flip"):
                    v = getattr(ep, k)
                    if v is not None:
                        arrays[f"{base}/{k}"] = v
        np.savez(path.with_suffix(".npz"), **arrays)
        path.with_suffix(".json").write_text(
            json.dumps(
                {
                    "names": self.names,
                    "rounds": self.rounds,
                    "num_partitions": len(self.partitions),
                    "epochs": keys,
                    "meta": self.meta,
                }
            )
        )

    @classmethod
    def load(cls, path: Path) -> Plan:
        info = json.loads(path.with_suffix(".json").read_text())
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        plans: dict = {}
        for r, c, e in info["epochs"]:
            base = f"r{r}/c{c}/e{e}"
            ep = EpochPlan(
                order=arrays[f"{base}/order"],
                bounds=arrays[f"{base}/bounds"],
                **{k: arrays.get(f"{base}/{k}") for k in ("angle", "top", "left", "flip")},
            )
            plans.setdefault((r, c), []).append(ep)
        return cls(
            names=list(info["names"]),
            initial=[arrays[f"init/{i}"] for i in range(len(info["names"]))],
            rounds=[list(map(int, r)) for r in info["rounds"]],
            partitions=[arrays[f"part/{c}"] for c in range(int(info["num_partitions"]))],
            epoch_plans=plans,
            meta=dict(info["meta"]),
        )


class _DrawRecorder:
    """Stands in for our training dataset in ``runtime.make_batches``: each batch it is
    asked for is returned as ``(indices, draws)``, the draws made by the real dataset's
    ``draw_augment`` from the same generator, in the same order as in training (so the
    generator passes through exactly the states it passes through in a client)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def get_batch(self, idx, generator=None):
        return np.asarray(idx, dtype=np.int64), self.dataset.draw_augment(len(idx), generator)


def _epoch_plan(batches: list) -> EpochPlan:
    order = np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in batches])
    bounds = np.cumsum([0] + [len(i) for i, _ in batches]).astype(np.int64)

    def cat(name, dtype):
        parts = [getattr(d, name) for _, d in batches]
        if any(p is None for p in parts):
            return None
        return np.concatenate([p.numpy() for p in parts]).astype(dtype)

    return EpochPlan(
        order=order,
        bounds=bounds,
        angle=cat("angles", np.float32),
        top=cat("top", np.int64),
        left=cat("left", np.int64),
        flip=cat("flip", np.bool_),
    )


def make_plan(cfg) -> Plan:
    """The plan of experiment ``cfg`` (an ``ExperimentConfig``): what our run draws, from
    the functions our server and clients draw it with (``fedrcl_flwr/run/runtime.py``:
    ``initial_model``, ``sample_partitions``, ``client_seed``, ``make_batches``; the
    batch size of ``training.batch_size_for``; ``client.iterations_per_epoch`` cuts an
    epoch as the training loop does). Depends only on ``cfg``."""
    from fedrcl_flwr import availability, client_eval
    from fedrcl_flwr.run import runtime
    from fedrcl_flwr.training import batch_size_for

    if client_eval.enabled(cfg) or availability.enabled(cfg):
        raise ValueError("lockstep plans runs without per-client evaluation or availability")
    bundle = runtime.load_bundle(cfg)
    parts = runtime.client_partitions(cfg)
    model = runtime.initial_model(cfg, bundle)
    names = list(model.state_dict().keys())
    initial = runtime.get_weights(model)
    k = cfg.federation.sampled_per_round()
    c = cfg.client
    recorder = _DrawRecorder(bundle.train)
    rounds, epoch_plans = [], {}
    for rnd in range(1, cfg.federation.rounds + 1):
        clients = runtime.sample_partitions(cfg.seed, rnd, cfg.federation.num_clients, k)
        rounds.append(clients)
        for pid in clients:
            idx = np.asarray(parts[pid])
            bs = batch_size_for(len(idx), c.batch_size, c.iterations_per_epoch)
            seed = runtime.client_seed(cfg.seed, rnd, pid)
            batches = runtime.make_batches(recorder, idx, bs, seed)
            eps = []
            for e in range(c.local_epochs):
                got = []
                for i, b in enumerate(batches(e)):
                    if c.iterations_per_epoch and i >= c.iterations_per_epoch:
                        break
                    got.append(b)
                eps.append(_epoch_plan(got))
            epoch_plans[(rnd, pid)] = eps
    return Plan(
        names=names,
        initial=initial,
        rounds=rounds,
        partitions=[np.asarray(p, dtype=np.int64) for p in parts],
        epoch_plans=epoch_plans,
        meta={
            "seed": cfg.seed,
            "num_clients": cfg.federation.num_clients,
            "crop_pad": cfg.dataset.crop_pad,
            "rotation": cfg.dataset.rotation,
            "flip": cfg.dataset.flip,
        },
    )


# ----------------------------------------------------------------------------- traces


@dataclass
class Trace:
    """One side's run: per round (1-based) the global weights (our ``state_dict`` names),
    the test accuracy (%), the test predictions and the time (seconds since the start of
    round 1) at the end of the round."""

    weights: dict = field(default_factory=dict)
    accuracy: dict = field(default_factory=dict)
    predictions: dict = field(default_factory=dict)
    clock: dict = field(default_factory=dict)

    def rounds(self) -> list[int]:
        return sorted(self.weights)

    def seconds(self, rnd: int) -> float:
        return self.clock[rnd] - self.clock.get(rnd - 1, 0.0)

    def save(self, path: Path) -> None:
        arrays = {}
        for r, ws in self.weights.items():
            for name, w in ws.items():
                arrays[f"w/{r}/{name}"] = np.asarray(w)
            arrays[f"pred/{r}"] = np.asarray(self.predictions[r], dtype=np.int64)
        np.savez(path.with_suffix(".npz"), **arrays)
        path.with_suffix(".json").write_text(
            json.dumps(
                {
                    "accuracy": {str(r): a for r, a in self.accuracy.items()},
                    "clock": {str(r): t for r, t in self.clock.items()},
                }
            )
        )

    @classmethod
    def load(cls, path: Path) -> Trace:
        info = json.loads(path.with_suffix(".json").read_text())
        t = cls(
            accuracy={int(r): float(a) for r, a in info["accuracy"].items()},
            clock={int(r): float(s) for r, s in info["clock"].items()},
        )
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as z:
            for key in z.files:
                kind, r, *rest = key.split("/")
                if kind == "w":
                    t.weights.setdefault(int(r), {})["/".join(rest)] = z[key]
                else:
                    t.predictions[int(r)] = z[key]
        return t


class Recorder:
    """What a side's run reports after each round (:meth:`round`), with the round's end
    time; the time spent inside :meth:`observing` (copying weights, predicting for the
    comparison) is not counted as the side's."""

    def __init__(self) -> None:
        self.trace = Trace()
        self._start: float | None = None
        self._excluded = 0.0
        self._now: float | None = None

    def start(self) -> None:
        self._start = time.perf_counter()
        self._excluded = 0.0

    @contextlib.contextmanager
    def observing(self) -> Iterator[None]:
        t0 = time.perf_counter()
        self._now = t0
        try:
            yield
        finally:
            self._excluded += time.perf_counter() - t0
            self._now = None

    def round(self, rnd: int, weights: dict, accuracy: float, predictions) -> None:
        if self._start is None or self._now is None:
            raise RuntimeError("Recorder.round: call start() first and round() inside observing()")
        self.trace.weights[rnd] = {k: np.array(v, copy=True) for k, v in weights.items()}
        self.trace.accuracy[rnd] = float(accuracy)
        self.trace.predictions[rnd] = np.asarray(predictions, dtype=np.int64)
        # the excluded time includes this observation's own, not yet added
        self.trace.clock[rnd] = self._now - self._start - self._excluded


# ------------------------------------------------------------------------- comparison


def max_rel_weight_diff(ours: dict, theirs: dict) -> float:
    """max over the state entries k of max|ours_k − theirs_k| / max|theirs_k| (an entry
    that is zero on their side counts its absolute difference); the two must hold the
    same names and shapes."""
    if set(ours) != set(theirs):
        missing = sorted(set(ours) ^ set(theirs))
        raise ValueError(f"the sides' state entries differ: {missing[:5]}")
    worst = 0.0
    for name, b in theirs.items():
        a = np.asarray(ours[name], dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"{name}: shape {a.shape} (ours) vs {b.shape} (theirs)")
        if a.size == 0:
            continue
        scale = float(np.max(np.abs(b)))
        diff = float(np.max(np.abs(a - b)))
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


GOAL_WEIGHT_DIFF = 1e-4  # max relative weight difference after the last round
GOAL_IDENTICAL_PCT = 99.9  # identical test predictions (%)


def worst_entry(ours: dict, theirs: dict) -> str:
    """The state entry whose relative difference is :func:`max_rel_weight_diff`'s."""
    return max(theirs, key=lambda k: max_rel_weight_diff({k: ours[k]}, {k: theirs[k]}))


def first_departure(rows: list[dict]) -> dict | None:
    """The first row (round) outside the goal (:data:`GOAL_WEIGHT_DIFF`,
    :data:`GOAL_IDENTICAL_PCT`); ``None`` when every round is inside it."""
    for r in rows:
        if r["weight_diff"] > GOAL_WEIGHT_DIFF or r["identical_pct"] < GOAL_IDENTICAL_PCT:
            return r
    return None


def identical_share(ours, theirs) -> float:
    """The share (%) of positions where the two prediction vectors agree."""
    a, b = np.asarray(ours), np.asarray(theirs)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"prediction vectors of shapes {a.shape} and {b.shape}")
    return 100.0 * float(np.mean(a == b))


def steady_seconds_per_round(clock: dict) -> float:
    """Wall seconds per round between the end of the first round and the end of the
    last (``clock``: round -> seconds at its end); the first round's own time with one
    round only."""
    rounds = sorted(clock)
    if len(rounds) < 2:
        return float(clock[rounds[0]])
    first, last = rounds[0], rounds[-1]
    return (clock[last] - clock[first]) / (last - first)


def compare(ours: Trace, theirs: Trace) -> list[dict]:
    """One row per round both traces hold."""
    rows = []
    for r in sorted(set(ours.rounds()) & set(theirs.rounds())):
        rows.append(
            {
                "round": r,
                "weight_diff": max_rel_weight_diff(ours.weights[r], theirs.weights[r]),
                "acc_ours": ours.accuracy[r],
                "acc_theirs": theirs.accuracy[r],
                "identical_pct": identical_share(ours.predictions[r], theirs.predictions[r]),
                "s_ours": ours.seconds(r),
                "s_theirs": theirs.seconds(r),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| round | max rel weight diff | acc ours % | acc theirs % | identical predictions % "
        "| s ours (in process) | s theirs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['round']} | {r['weight_diff']:.2e} | {r['acc_ours']:.2f} | "
            f"{r['acc_theirs']:.2f} | {r['identical_pct']:.2f} | {r['s_ours']:.1f} | "
            f"{r['s_theirs']:.1f} |"
        )
    return "\n".join(out)


def last_line(name: str, rows: list[dict], s_ours: float, s_theirs: float) -> str:
    last = rows[-1]
    return (
        f"lockstep {name}: max rel weight diff {last['weight_diff']:.2e} after "
        f"{last['round']} rounds; identical predictions {last['identical_pct']:.2f} %; "
        f"ours {s_ours:.2f} s/round, theirs {s_theirs:.2f} s/round"
    )


# -------------------------------------------------------------------------- our side


def full_experiment(mod, a, data: Path, work: Path) -> dict:
    """The code's experiment plus what the driver decides: the seed, the rounds, the
    device, one client at a time on ``--threads`` threads, evaluation every round."""
    exp = mod.our_experiment(a, data, work)
    exp["seed"] = a.seed
    exp.setdefault("federation", {})
    exp["federation"]["rounds"] = a.rounds
    exp["federation"]["eval_every"] = 1
    exp.setdefault("client", {})["device"] = a.device
    exp["simulation"] = {
        "num_supernodes": 1,
        "num_cpus": a.threads,
        "init_num_cpus": a.threads,
        **({"num_gpus": 1.0, "init_num_gpus": 1.0} if a.device == "cuda" else {}),
    }
    exp["output"] = {"dir": str(work / "ours"), "checkpoint_every": 0, "save_model": False}
    return exp


def load_experiment(exp: dict, path: Path):
    import yaml

    from fedrcl_flwr.config.loading import load_config

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return load_config(path)


@contextlib.contextmanager
def _observed_rounds(recorder: Recorder, cfg) -> Iterator[None]:
    """Our in-process run, observed: ``run_inprocess`` builds its strategy with
    ``build_server``; the strategy hands every round's state (copies of the global
    weights) to its ``on_checkpoint`` after the round's record. This wraps that callback
    to read the weights and predict the test set first (inside
    :meth:`Recorder.observing`); nothing the run computes changes."""
    from fedrcl_flwr.app import inprocess
    from fedrcl_flwr.run import runtime

    bundle = runtime.load_bundle(cfg)
    device = runtime.pick_device(cfg.client.device)
    model = runtime.new_model(cfg, bundle).to(device)
    names = list(model.state_dict().keys())
    real = inprocess.build_server

    def build_server(*args, **kwargs):
        strategy, left = real(*args, **kwargs)
        then = strategy.on_checkpoint

        def on_checkpoint(rnd: int, state: dict) -> None:
            with recorder.observing():
                weights = state["weights"]
                runtime.set_weights(model, weights)
                rec = _last_record(cfg)
                recorder.round(
                    rnd,
                    dict(zip(names, weights)),
                    100.0 * float(rec["test_accuracy"]),
                    predict(model, bundle.test, device),
                )
            if then is not None:
                then(rnd, state)

        strategy.on_checkpoint = on_checkpoint
        recorder.start()
        return strategy, left

    inprocess.build_server = build_server
    try:
        yield
    finally:
        inprocess.build_server = real


def _last_record(cfg) -> dict:
    path = Path(cfg.output_dir()) / "metrics.jsonl"
    return json.loads(path.read_text().splitlines()[-1])


def predict(model, dataset, device, batch_size: int = 500) -> np.ndarray:
    """Our model's predicted classes on ``dataset`` (un-augmented, in order)."""
    import torch

    from fedrcl_flwr.data.datasets import iterate_batches

    out = []
    model.eval()
    with torch.no_grad():
        for x, _ in iterate_batches(dataset, np.arange(len(dataset)), batch_size, device=device):
            out.append(model(x).argmax(1).cpu().numpy())
    return np.concatenate(out)


def run_ours_inprocess(cfg, out: Path) -> Trace:
    from fedrcl_flwr.app.inprocess import run_inprocess

    recorder = Recorder()
    with _observed_rounds(recorder, cfg):
        run_inprocess(cfg, out)
    return recorder.trace


def run_ours_cli(exp_path: Path, out: Path, threads: int) -> float:
    """Ours through ``fedrcl-flwr run`` (a child process: Flower's simulation on Ray);
    returns the steady seconds per round from its ``metrics.jsonl`` (``wall_time_s``)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable, "-m", "fedrcl_flwr.cli", "run", str(exp_path), "--out", str(out),
        "--overwrite",
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    (out.parent / "ours_cli.log").write_text(p.stdout + "\n--- stderr\n" + p.stderr)
    if p.returncode != 0:
        raise SystemExit(
            f"fedrcl-flwr run failed (rc {p.returncode}): see {out.parent}/ours_cli.log"
        )
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    clock = {int(r["round"]): float(r["wall_time_s"]) for r in recs if "wall_time_s" in r}
    return steady_seconds_per_round(clock)


# ------------------------------------------------------------------------ their side


def run_theirs(a, work: Path) -> Trace:
    """Their side in a child process (this script with ``--their-side``), working
    directory their checkout; returns the trace it wrote."""
    argv = [
        "--code", a.code, "--authors-code", a.authors_code, "--rounds", str(a.rounds),
        "--device", a.device, "--augment", a.augment, "--method", a.method,
        "--seed", str(a.seed), "--threads", str(a.threads),
    ]  # fmt: skip
    for key in PROTOCOL:
        argv += [f"--{key.replace('_', '-')}", str(getattr(a, key))]
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--their-side",
        "--work",
        str(work),
        *argv,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(a.threads)}
    log = work / "theirs.log"
    with open(log, "w") as f:
        p = subprocess.run(cmd, cwd=a.authors_code, stdout=f, stderr=subprocess.STDOUT, env=env)
    if p.returncode != 0:
        raise SystemExit(f"their side failed (rc {p.returncode}): see {log}")
    return Trace.load(work / "theirs_trace")


def their_side_main(mod, a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    work = Path(a.work)
    code = Path(a.authors_code).resolve()
    sys.path.insert(0, str(code))
    plan = Plan.load(work / "plan")
    recorder = Recorder()
    mod.their_side(a, plan, work / "data", work, recorder)
    recorder.trace.save(work / "theirs_trace")


# ------------------------------------------------------------------------------- main


def code_module(name: str):
    if name not in CODES:
        raise SystemExit(
            f"lockstep: --code {name}: no side module registered here yet "
            f"(registered: {', '.join(sorted(CODES))})"
        )
    return importlib.import_module(CODES[name])


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", required=True, choices=ALL_CODES)
    ap.add_argument("--authors-code", required=True, help="a checkout of the authors' code")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--augment", choices=("on", "off"), default="on")
    ap.add_argument("--method", default=None, help="default: the code's first method")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clients", type=int, default=None)
    ap.add_argument("--participation", type=float, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--alpha", type=float, default=None)
    ap.add_argument("--threads", type=int, default=1, help="threads of each side (1)")
    ap.add_argument("--out", default=None, help="work directory (default: a new temp dir)")
    ap.add_argument("--json", default=None, help="write the rows and settings here")
    ap.add_argument("--their-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    mod = code_module(a.code)
    if a.method is None:
        a.method = mod.METHODS[0]
    elif a.method not in mod.METHODS:
        ap.error(f"--method {a.method}: {a.code} runs {', '.join(mod.METHODS)}")
    for key in PROTOCOL:
        if getattr(a, key) is None:
            setattr(a, key, mod.DEFAULTS[key])
    if a.rounds < 1 or a.threads < 1:
        ap.error("--rounds and --threads must be at least 1")
    return a, mod


def main(argv=None) -> None:
    a, mod = parse_args(argv)
    if a.their_side:
        their_side_main(mod, a)
        return
    problem = mod.checkout_problem(Path(a.authors_code))
    if problem:
        raise SystemExit(f"lockstep: --authors-code {a.authors_code}: {problem}")
    a.authors_code = str(Path(a.authors_code).resolve())
    work = Path(a.out).resolve() if a.out else Path(tempfile.mkdtemp(prefix=f"lockstep_{a.code}_"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    mod.write_data(a, data)

    import torch

    torch.set_num_threads(a.threads)
    exp = full_experiment(mod, a, data, work)
    cfg = load_experiment(exp, work / "experiment.yaml")
    plan = make_plan(cfg)
    plan.save(work / "plan")
    print(
        f"lockstep {a.code} ({mod.SOURCE}), method {a.method}: {a.clients} clients, "
        f"{len(plan.clients(1))} per round, {a.epochs} local epoch(s), batch {a.batch_size}, "
        f"lr {a.lr}, alpha {a.alpha}, augmentation {a.augment}, {a.rounds} rounds, "
        f"seed {a.seed}, {a.device}, {a.threads} thread(s); work: {work}",
        flush=True,
    )
    ours = run_ours_inprocess(cfg, work / "ours")
    print("ours (in process): done", flush=True)
    theirs = run_theirs(a, work)
    print("theirs: done", flush=True)
    s_ours = run_ours_cli(work / "experiment.yaml", work / "ours_cli", a.threads)
    rows = compare(ours, theirs)
    if mod.QUIRKS:
        print("\nDifferences in kind under this protocol (and the key that gives theirs):")
        for q in mod.QUIRKS:
            print(q.line())
    print()
    print(table(rows))
    print(
        f"\nspeed: ours through fedrcl-flwr run {s_ours:.2f} s/round; ours in process "
        f"{steady_seconds_per_round(ours.clock):.2f}; theirs "
        f"{steady_seconds_per_round(theirs.clock):.2f} (rounds 2-{a.rounds})"
    )
    s_theirs = steady_seconds_per_round(theirs.clock)
    away = first_departure(rows)
    if away is None:
        print(
            f"goal met in every round: max rel weight diff <= {GOAL_WEIGHT_DIFF:g}, "
            f"identical predictions >= {GOAL_IDENTICAL_PCT} %"
        )
    else:
        r = away["round"]
        cause = (
            "the differences in kind listed above are its known causes"
            if mod.QUIRKS
            else "no difference in kind is known for this code: its cause is not yet named"
        )
        print(
            f"first round outside the goal: {r} (max rel weight diff "
            f"{away['weight_diff']:.2e} in {worst_entry(ours.weights[r], theirs.weights[r])}, "
            f"identical predictions {away['identical_pct']:.2f} %); {cause}"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "code": a.code,
                    "source": mod.SOURCE,
                    "settings": {
                        k: v for k, v in vars(a).items() if k not in ("their_side", "work")
                    },
                    "rows": rows,
                    "s_ours_cli": s_ours,
                    "s_ours_inprocess": steady_seconds_per_round(ours.clock),
                    "s_theirs": s_theirs,
                },
                indent=1,
            )
        )
    print(last_line(a.code, rows, s_ours, s_theirs))


if __name__ == "__main__":
    main()
