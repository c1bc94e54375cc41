"""Per-client (personalised) evaluation (``evaluation.per_client``; off by default).
The messages (which partitions a node evaluates, its ``(correct, samples, loss sum)``
per partition) are ``EvaluateInstructions`` / ``EvaluateReport`` of
:mod:`fedrcl_flwr.protocol`.

Every ``every`` rounds (and at the last round) the server asks clients, through Flower's
federated evaluation (``Strategy.configure_evaluate`` -> ``NumPyClient.evaluate`` ->
``Strategy.aggregate_evaluate``), to evaluate the round's global model on their *local
test data*; the same path serves simulation and real devices. Which clients: the round's
sampled clients (all of them, also those that dropped out under
``federation.availability``: the evaluated set does not depend on availability), or every
client with ``clients: all`` (each node then evaluates a share of the partitions).

Local test data (``local_test``):

* ``holdout``: a share of the client's own partition, split once: with ``n`` samples,
  ``n_test = min(floor(F * n + 1/2), n - 1)`` (F = ``local_test_fraction``) positions
  drawn by ``default_rng([split seed, partition id, HOLDOUT_SALT]).permutation(n)``
  (split seed = ``partition.seed``, else ``seed``), the rest (in the partition's order)
  is what the client **trains on** while the feature is on. Off, nothing is held out.
  A real device (node-config ``data-path``) splits its own data the same way.
* ``domain`` (FedCCL's inter-domain settings, ``partition.scheme: domain``): the test
  samples of the client's own domain(s); its training data is unchanged.
* ``auto`` (default): ``domain`` under ``partition.scheme: domain``, else ``holdout``.

Local adaptation (``finetune_steps`` S > 0): before evaluating, the client takes S
cross-entropy steps from the global model on its training data (its method's loss terms
are not used: this is the "FedAvg-FT" protocol of personalised FL), with its round's
learning rate, optimizer, weight decay, momentum, clipping and batch size, its batches
shuffled and augmented from ``client_seed(seed, round, partition id) ^ FINETUNE_SALT``
(epochs repeat until S steps). The fine-tuned model is thrown away: the global model
and the clients' training are untouched.

Statistics per evaluated round (``metrics.jsonl``, fractions like ``test_accuracy``):
with a_1 <= ... <= a_n the accuracies of the n evaluated clients that have local test
data and k = ceil(n / 10): ``client_acc_mean`` = mean a_i (every client weighs the same),
``client_acc_std`` = population std (ddof 0), ``client_acc_worst10`` = mean of a_1..a_k,
``client_acc_best10`` = mean of a_{n-k+1}..a_n; also ``client_acc_n`` (= n),
``client_loss_mean``, ``client_eval_failures`` and ``client_accuracy`` ({partition id:
accuracy}, for the distribution figure of ``fedrcl-flwr plot``).
"""

from __future__ import annotations

import math

import numpy as np

from fedrcl_flwr.config.catalog import CLIENT_STAT_KEYS as STAT_KEYS
from fedrcl_flwr.protocol import decode_client_eval, encode_client_eval

HOLDOUT_SALT = 0x7E57
FINETUNE_SALT = 0xF1E7


def _cfg_error(source: str, msg: str):
    from fedrcl_flwr.config import ConfigError

    return ConfigError(f"{source}: {msg}")


def check_config(cfg, source: str) -> None:
    """``evaluation.per_client`` consistent with the rest of the experiment (one
    ``ConfigError`` naming the key and ``source``; each key's own range is a rule in
    ``fedrcl_flwr.config.CONFIG_RULES``)."""
    pc = cfg.evaluation.per_client
    key = "evaluation.per_client"
    if not pc.every:
        return
    every = cfg.federation.eval_every
    if pc.every % every:
        raise _cfg_error(
            source,
            f"'{key}.every' ({pc.every}) must be a multiple of "
            f"'federation.eval_every' ({every}): client metrics go "
            "into the evaluated rounds' records",
        )
    if pc.local_test == "domain" and cfg.partition.scheme != "domain":
        raise _cfg_error(
            source,
            f"'{key}.local_test' domain needs partition.scheme domain "
            f"(got {cfg.partition.scheme}); use holdout",
        )
    if test_source(cfg) == "holdout" and pc.local_test_fraction <= 0:
        raise _cfg_error(
            source,
            f"'{key}.local_test_fraction' must be > 0 for a held-out "
            "local test share (local_test holdout)",
        )


def enabled(cfg) -> bool:
    return cfg.evaluation.per_client.every > 0


def test_source(cfg) -> str:
    """``holdout`` or ``domain`` (``auto`` resolved)."""
    lt = cfg.evaluation.per_client.local_test
    if lt == "auto":
        return "domain" if cfg.partition.scheme == "domain" else "holdout"
    return lt


def holds_out(cfg) -> bool:
    """Is a share of each client's data held out of its training (feature on, holdout)?"""
    return enabled(cfg) and test_source(cfg) == "holdout"


def split_seed(cfg) -> int:
    return int(cfg.partition.seed if cfg.partition.seed is not None else cfg.seed)


def holdout_split(
    indices: np.ndarray, fraction: float, seed: int, client: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` of one client's ``indices`` (see the module doc): disjoint, their
    union is ``indices``, both in the order of ``indices``."""
    indices = np.asarray(indices)
    n = len(indices)
    n_test = min(int(math.floor(fraction * n + 0.5)), n - 1) if n > 1 else 0
    perm = np.random.default_rng([int(seed), int(client), HOLDOUT_SALT]).permutation(n)
    test_pos = np.sort(perm[:n_test])
    keep = np.ones(n, dtype=bool)
    keep[test_pos] = False
    return indices[keep], indices[test_pos]


def training_indices(cfg, client: int, indices: np.ndarray) -> np.ndarray:
    """What the client trains on: ``indices`` minus the held-out share when held out."""
    if not holds_out(cfg):
        return indices
    return holdout_split(
        indices, cfg.evaluation.per_client.local_test_fraction, split_seed(cfg), client
    )[0]


def local_test(cfg, client: int, indices: np.ndarray, train_dataset, bundle=None):
    """``(dataset, indices)`` of the client's local test data; ``indices`` is its whole
    partition (before the hold-out); ``bundle`` (the experiment's data) for ``domain``."""
    if test_source(cfg) == "holdout":
        test = holdout_split(
            indices, cfg.evaluation.per_client.local_test_fraction, split_seed(cfg), client
        )[1]
        return train_dataset, test
    if bundle is None or bundle.train_domains is None or bundle.test_domains is None:
        raise ValueError(
            "evaluation.per_client.local_test domain needs the experiment's "
            "dataset with domains (a real device with its own data: use "
            "local_test holdout)"
        )
    mine = np.unique(np.asarray(bundle.train_domains)[np.asarray(indices)])
    return bundle.test, np.flatnonzero(np.isin(np.asarray(bundle.test_domains), mine))


def due(every: int, rnd: int, rounds: int) -> bool:
    return every > 0 and (rnd % every == 0 or rnd == rounds)


def finetune(
    model, dataset, indices: np.ndarray, cfg, run_round: int, client: int, steps: int, device
) -> None:
    """``steps`` cross-entropy steps on ``dataset[indices]`` in place (module doc)."""
    import itertools

    import torch

    from fedrcl_flwr.run import runtime
    from fedrcl_flwr.training import (
        LocalTrainSettings,
        batch_size_for,
        cross_entropy_term,
        round_lr,
        train_local,
    )

    if steps <= 0 or len(indices) == 0:
        return
    c = cfg.client
    bs = batch_size_for(len(indices), c.batch_size, c.iterations_per_epoch)
    seed = runtime.client_seed(cfg.seed, run_round, client) ^ FINETUNE_SALT
    epoch_batches = runtime.make_batches(dataset, np.asarray(indices), bs, seed, device=device)

    def batches(_epoch: int):  # one "epoch" of exactly `steps` steps, epochs chained
        return itertools.chain.from_iterable(epoch_batches(e) for e in itertools.count())

    settings = LocalTrainSettings(
        lr=round_lr(c.lr, c.lr_decay, run_round, c.lr_schedule, cfg.federation.rounds),
        epochs=1,
        momentum=c.momentum,
        weight_decay=c.weight_decay,
        grad_clip=c.grad_clip,
        iterations_per_epoch=steps,
        optimizer=c.optimizer,
        nesterov=c.nesterov,
        betas=tuple(c.betas),
        eps=c.eps,
        amp=c.amp,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        train_local(model, batches, [cross_entropy_term()], settings, device)


# the ``client_eval`` report of a client's evaluate metrics (fedrcl_flwr/protocol.py)
encode = encode_client_eval
decode = decode_client_eval


def summarize(results: dict, failures: int = 0) -> dict:
    """The round's per-client statistics (module doc) from
    ``{partition id: (correct, samples, loss sum)}``; clients without local test samples
    are left out of every statistic."""
    acc = {pid: c / n for pid, (c, n, _) in sorted(results.items()) if n > 0}
    loss = [s / n for pid, (c, n, s) in sorted(results.items()) if n > 0]
    rec: dict = {"client_acc_n": len(acc), "client_eval_failures": int(failures)}
    if not acc:
        rec.update({k: None for k in STAT_KEYS})
        rec["client_loss_mean"] = None
        rec["client_accuracy"] = {}
        return rec
    a = np.sort(np.fromiter(acc.values(), dtype=np.float64))
    k = max(1, math.ceil(len(a) / 10))
    rec.update(
        {
            "client_acc_mean": float(a.mean()),
            "client_acc_std": float(a.std()),
            "client_acc_worst10": float(a[:k].mean()),
            "client_acc_best10": float(a[-k:].mean()),
            "client_loss_mean": float(np.mean(loss)),
            "client_accuracy": {str(p): float(v) for p, v in acc.items()},
        }
    )
    return rec


def assign(pids: list, slots: int) -> list[list]:
    """Partition ids spread over ``slots`` nodes (contiguous, sizes differing by <= 1)."""
    pids = list(pids)
    if not pids or slots < 1:
        return []
    slots = min(slots, len(pids))
    size, extra = divmod(len(pids), slots)
    out, start = [], 0
    for i in range(slots):
        end = start + size + (1 if i < extra else 0)
        out.append(pids[start:end])
        start = end
    return out
