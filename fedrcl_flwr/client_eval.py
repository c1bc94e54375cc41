"""Per-client (personalised) evaluation (``evaluation.per_client``; off by default).
The messages (which partitions a node evaluates, its ``(correct, samples, loss sum)``
per partition) are ``EvaluateInstructions`` / ``EvaluateReport`` of
:mod:`fedrcl_flwr.protocol`.

Every ``every`` rounds (and at the last round) the server asks clients, through Flower's
federated evaluation (``Strategy.configure_evaluate`` -> ``NumPyClient.evaluate`` ->
``Strategy.aggregate_evaluate``), to evaluate the round's global model on their *local
test data*; the same path serves simulation and real devices. Which clients
(``clients``):

* ``sampled`` (default): the round's sampled clients (all of them, also those that
  dropped out under ``federation.availability``: the evaluated set does not depend on
  availability). The model was just averaged from their updates, so this measures how
  well it serves the clients that shaped it last: an optimistic (biased) estimate of a
  client's accuracy.
* ``unsampled``: as many clients as a round samples, drawn from those *not* sampled in
  the round (:func:`unsampled_partitions`): clients the round's model did not just learn
  from, an unbiased estimate of the accuracy a client not in the round gets.
* ``all``: every client (each node then evaluates a share of the partitions).

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
accuracy}, for the distribution figure of ``fedrcl-flwr plot``). Evaluated clients too
small for a held-out share (0 test samples) are counted as ``client_eval_no_test`` (the
key is absent when there are none); the run says so before it starts, and refuses to
start when no client holds a share (:func:`check_test_shares`).
"""

from __future__ import annotations

import math

import numpy as np

from fedrcl_flwr.config.catalog import CLIENT_STAT_KEYS as STAT_KEYS
from fedrcl_flwr.config.sections import test_source
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.protocol import decode_client_eval, encode_client_eval

HOLDOUT_SALT = 0x7E57
FINETUNE_SALT = 0xF1E7
UNSAMPLED_SALT = 0x0E5A


def unsampled_partitions(seed: int, rnd: int, num_clients: int, sampled: list[int]) -> list[int]:
    """``clients: unsampled``: ``len(sampled)`` partitions (fewer when fewer are left)
    drawn without replacement from those not in ``sampled``, by
    ``default_rng([seed, rnd, UNSAMPLED_SALT])`` (a generator of its own: the round's
    sampling and training are untouched), in increasing order."""
    rest = sorted(set(range(num_clients)) - {int(p) for p in sampled})
    k = min(len(sampled), len(rest))
    if k == 0:
        return []
    rng = np.random.default_rng([int(seed), int(rnd), UNSAMPLED_SALT])
    return sorted(int(p) for p in rng.choice(rest, size=k, replace=False))


def enabled(cfg) -> bool:
    return cfg.evaluation.per_client.every > 0


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
    n_test = holdout_size(n, fraction)
    perm = np.random.default_rng([int(seed), int(client), HOLDOUT_SALT]).permutation(n)
    test_pos = np.sort(perm[:n_test])
    keep = np.ones(n, dtype=bool)
    keep[test_pos] = False
    return indices[keep], indices[test_pos]


def holdout_size(n: int, fraction: float) -> int:
    """Samples a partition of ``n`` holds out (module doc): 0 when it is too small."""
    return min(int(math.floor(fraction * n + 0.5)), n - 1) if n > 1 else 0


def clients_without_test(cfg, partitions: list) -> list[int]:
    """The partition ids whose held-out share is empty (``holdout`` only; ``[]`` when the
    feature is off or the local test data is the client's domain)."""
    if not holds_out(cfg):
        return []
    f = cfg.evaluation.per_client.local_test_fraction
    return [pid for pid, idx in enumerate(partitions) if holdout_size(len(idx), f) == 0]


def check_test_shares(cfg, partitions: list, source: str) -> str | None:
    """Before the run: no client with a local test share is one ``ConfigError`` (the
    statistics would be null every round); some without is a note (returned) saying they
    are left out (counted as ``client_eval_no_test`` in the records)."""
    none = clients_without_test(cfg, partitions)
    if not none:
        return None
    f = cfg.evaluation.per_client.local_test_fraction
    key = "evaluation.per_client.local_test_fraction"
    smallest = min(len(p) for p in partitions)
    if len(none) == len(partitions):
        raise ConfigError(
            f"{source}: '{key}' {f:g} holds out no sample of any client (partitions of "
            f"{smallest} to {max(len(p) for p in partitions)} samples; a share rounds to "
            "0 below 1/(2*fraction) samples): per-client evaluation would measure nothing; "
            "raise the fraction or use bigger partitions",
        )
    return (
        f"{len(none)} of {len(partitions)} clients are too small for a local test share "
        f"('{key}' {f:g}, smallest partition {smallest} samples): they are left out of the "
        "per-client statistics (counted as client_eval_no_test in metrics.jsonl)"
    )


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

    from fedrcl_flwr.data.datasets import batch_bounds
    from fedrcl_flwr.run import runtime
    from fedrcl_flwr.training import (
        batch_size_for,
        cross_entropy_term,
        last_batch_rule,
        local_train_settings,
        train_local,
    )

    if steps <= 0 or len(indices) == 0:
        return
    c = cfg.client
    bs = batch_size_for(len(indices), c.batch_size, c.iterations_per_epoch)
    seed = runtime.client_seed(cfg.seed, run_round, client) ^ FINETUNE_SALT
    # never dropped; folded for a BatchNorm model as in local training
    # (training.last_batch_rule), where a single sample makes no batch: no step then (an
    # epoch without a batch would make the chain below endless)
    rule = last_batch_rule(False, model)
    if not batch_bounds(len(indices), bs, rule):
        return
    epoch_batches = runtime.make_batches(
        dataset, np.asarray(indices), bs, seed, device=device, last_batch=rule
    )

    def batches(_epoch: int):  # one "epoch" of exactly `steps` steps, epochs chained
        return itertools.chain.from_iterable(epoch_batches(e) for e in itertools.count())

    # one "epoch" of exactly `steps` steps, without the local round's in-round decay
    settings = local_train_settings(
        c,
        run_round,
        rounds=cfg.federation.rounds,
        epochs=1,
        iterations_per_epoch=steps,
        epoch_lr_decay=1.0,
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
    no_test = sum(1 for (_, n, _) in results.values() if n <= 0)
    if no_test:  # evaluated clients too small for a local test share (check_test_shares)
        rec["client_eval_no_test"] = no_test
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
