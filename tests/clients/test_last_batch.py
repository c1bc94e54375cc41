"""The last batch of a local epoch: kept, dropped (``client.drop_last``, FedUV's
``DataLoader(drop_last=True)``) or, for a model with BatchNorm, folded so that no step
trains on a single sample (a ``BatchNorm1d`` in training mode raises on one). FedUV's
projector has ``BatchNorm1d``: a client whose size is 1 modulo the batch size trains
like every other client instead of failing in every round it is sampled."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import TINY
from torch import nn

from fedrcl_flwr.config import config_from_dict


def sizes(n, bs, rule):
    from fedrcl_flwr.data.datasets import batch_bounds

    return [stop - start for start, stop in batch_bounds(n, bs, rule)]


@pytest.mark.parametrize(
    "n, bs, keep, drop, fold",
    [
        (101, 50, [50, 50, 1], [50, 50], [50, 51]),
        (100, 50, [50, 50], [50, 50], [50, 50]),  # no incomplete batch: all the same
        (102, 50, [50, 50, 2], [50, 50], [50, 50, 2]),  # only a batch of one is folded
        (1, 50, [1], [], []),  # a lone sample: no batch when folded
        (40, 50, [40], [], [40]),  # fewer than a batch: none with drop_last (FedUV's)
        (0, 50, [], [], []),
        (3, 2, [2, 1], [2], [3]),
    ],
)
def test_batch_bounds(n, bs, keep, drop, fold):
    from fedrcl_flwr.data.datasets import batch_bounds

    assert sizes(n, bs, "keep") == keep
    assert sizes(n, bs, "drop") == drop
    assert sizes(n, bs, "fold") == fold
    for rule in ("keep", "fold"):  # every sample in exactly one batch, in order
        covered = [i for a, b in batch_bounds(n, bs, rule) for i in range(a, b)]
        assert covered == (list(range(n)) if (rule == "keep" or n != 1) else [])
    with pytest.raises(ValueError, match="last_batch"):
        batch_bounds(n, bs, "skip")


def test_steps_per_epoch_counts_the_batches():
    """The closed form the step counts use (FPL's last epoch, a straggler's workload) is
    the number of batches the epochs iterate, under each rule, capped by
    ``iterations_per_epoch``."""
    from fedrcl_flwr.data.datasets import batch_bounds
    from fedrcl_flwr.training import steps_per_epoch

    for n in range(0, 130):
        for bs in (1, 2, 3, 7, 32, 50):
            for rule in ("keep", "drop", "fold"):
                batches = len(batch_bounds(n, bs, rule))
                assert steps_per_epoch(n, bs, None, rule) == batches, (n, bs, rule)
                assert steps_per_epoch(n, bs, 3, rule) == min(batches, 3), (n, bs, rule)
    with pytest.raises(ValueError, match="last_batch"):
        steps_per_epoch(10, 3, None, "skip")


def test_a_stragglers_workload_counts_the_folded_batch(tiny, monkeypatch):
    """With a BatchNorm model a client of 65 samples in batches of 32 takes 2 steps an
    epoch (its last sample joins the batch before), not 3; with ``drop_last`` 2 too, and
    one of 20 samples none."""
    from fedrcl_flwr import client_eval
    from fedrcl_flwr.app.server_app import make_availability
    from fedrcl_flwr.run import runtime

    sizes = [64, 65, 20, 96]
    monkeypatch.setattr(client_eval, "training_indices", lambda cfg, i, part: range(sizes[i]))
    expected = {
        ("cnn5", False): [2, 3, 1, 3],
        ("lightcnn", False): [2, 2, 1, 3],
        ("lightcnn", True): [2, 2, 0, 3],
    }
    for (name, drop_last), steps in expected.items():
        cfg = tiny(
            model={"name": name},
            client={"batch_size": 32, "local_epochs": 1, "drop_last": drop_last},
            federation={"num_clients": 4, "availability": {"stragglers": {"speed": 1.0}}},
        )
        av = make_availability(cfg, runtime.new_model(cfg, runtime.load_bundle(cfg)))
        s = np.array(steps, dtype=float)
        assert np.allclose(av.workload, s / s.mean()), (name, drop_last, av.workload)


def test_drop_last_is_torchs_dataloader_drop_last():
    """FedUV's loader, ``DataLoader(drop_last=True)``: the same number and sizes of
    batches as ours with ``drop``."""
    from torch.utils.data import DataLoader, TensorDataset

    for n in (1, 49, 50, 101, 257):
        ds = TensorDataset(torch.arange(n))
        theirs = [len(b[0]) for b in DataLoader(ds, batch_size=50, drop_last=True)]
        assert sizes(n, 50, "drop") == theirs


def test_the_rule_follows_the_model_and_drop_last():
    from fedrcl_flwr.training import last_batch_rule, normalises_over_batch

    plain = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    normed = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    assert not normalises_over_batch(plain)
    assert normalises_over_batch(normed) and normalises_over_batch(conv)
    assert last_batch_rule(False, plain) == "keep"
    assert last_batch_rule(False, normed) == "fold"
    assert last_batch_rule(True, plain) == last_batch_rule(True, normed) == "drop"
    # why: one sample cannot be normalised by BatchNorm1d in training mode
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        normed.train()(torch.zeros(1, 4))


def test_iterate_batches_folds_the_same_shuffled_samples():
    """Folding changes only the last two batches' boundary: the same samples in the same
    shuffled order as when kept."""
    from torch.utils.data import TensorDataset

    from fedrcl_flwr.data.datasets import iterate_batches

    ds = TensorDataset(torch.arange(101), torch.arange(101))
    idx = np.arange(101)
    out = {}
    for rule in ("keep", "fold"):
        g = torch.Generator().manual_seed(3)
        out[rule] = [y for _, y in iterate_batches(ds, idx, 50, generator=g, last_batch=rule)]
    assert [len(b) for b in out["keep"]] == [50, 50, 1]
    assert [len(b) for b in out["fold"]] == [50, 51]
    assert torch.equal(torch.cat(out["keep"]), torch.cat(out["fold"]))
    assert sorted(torch.cat(out["fold"]).tolist()) == list(range(101))


def _feduv_config(tmp_path, **client):
    """FedUV (``univarfl``, ``variant: feduv``: its projector has BatchNorm1d) on two
    clients of 102 and 101 samples, batch 50: partition 1 ends each epoch with one sample."""
    return config_from_dict(
        dict(
            TINY,
            dataset={
                "name": "synthetic",
                "synthetic": {"num_train": 203, "num_test": 40, "num_classes": 4, "image_size": 16},
            },
            model={"name": "cnn5", "params": {"projector": 16}},
            federation={
                "num_clients": 2,
                "rounds": 1,
                "participation": None,
                "clients_per_round": 2,
            },
            client={
                **TINY["client"],
                "method": "univarfl",
                "params": {"variant": "feduv"},
                "batch_size": 50,
                **client,
            },
            output={"dir": str(tmp_path / "run"), "checkpoint_every": 0},
        )
    )


@pytest.mark.integration
@pytest.mark.parametrize("drop_last", [False, True])
def test_feduv_client_with_a_trailing_sample_trains(tmp_path, drop_last):
    """Before, partition 1 raised BatchNorm1d's error in every round and was averaged
    out (``failures 1``, nothing else said); now it trains, with its last sample folded
    into the batch before or, with ``client.drop_last`` (FedUV's own loader), dropped."""
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.run import runtime
    from fedrcl_flwr.run.results import read_metrics

    cfg = _feduv_config(tmp_path, **({"drop_last": True} if drop_last else {}))
    assert sorted(len(p) for p in runtime.client_partitions(cfg)) == [101, 102]
    run_inprocess(cfg, tmp_path / "run")
    (rec,) = read_metrics(tmp_path / "run")
    assert (rec["num_clients"], rec["failures"]) == (2, 0), rec
    assert np.isfinite(rec["train_loss"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["client_failures"] == {}


def test_feduv_code_protocol_drops_the_last_batch():
    """``experiments/univarfl/feduv_code_protocol.yaml`` follows FedUV's loader."""
    from pathlib import Path

    from fedrcl_flwr.config import load_config

    path = Path(__file__).resolve().parents[2] / "experiments/univarfl/feduv_code_protocol.yaml"
    assert load_config(path).client.drop_last is True


@pytest.mark.integration
def test_a_client_smaller_than_a_batch_takes_no_step_with_drop_last(tmp_path):
    """FedUV's loader gives a client of fewer samples than a batch no batch at all: it
    takes no step and reports no training loss (not 0: the round's mean leaves it out),
    and it uploads the model it received."""
    from clients import client_class
    from fedrcl_flwr.protocol import FitInstructions
    from fedrcl_flwr.run import runtime

    cfg = _feduv_config(tmp_path, drop_last=True, batch_size=102)  # sizes 102 and 101
    sizes = [len(p) for p in runtime.client_partitions(cfg)]
    model = runtime.new_model(cfg, runtime.load_bundle(cfg))
    weights = runtime.get_weights(model)
    for pid in (0, 1):
        client = client_class("univarfl")(cfg, state_dir=str(tmp_path / "state"))
        _, metrics = client.train_round(weights, FitInstructions.build(1, pid).to_config())
        if sizes[pid] < 102:
            assert metrics["steps"] == 0 and "train_loss" not in metrics
            assert all(np.array_equal(a, b) for a, b in zip(client.upload(), weights))
        else:
            assert metrics["steps"] == 1 and np.isfinite(metrics["train_loss"])
    # in a run both are averaged (the unchanged model weighted by its size, as FedUV's
    # train_fl.py weights every sampled client by its data size), no failure; the round's
    # training loss is the one client's that trained
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.run.results import read_metrics

    run_inprocess(cfg, tmp_path / "run")
    (rec,) = read_metrics(tmp_path / "run")
    assert (rec["num_clients"], rec["failures"]) == (2, 0) and np.isfinite(rec["train_loss"])


@pytest.mark.integration
@pytest.mark.parametrize("drop_last, samples", [(False, 100), (True, 99)])
def test_fpl_last_epoch_prototypes_follow_the_last_batch(
    tiny, tmp_path, monkeypatch, drop_last, samples
):
    """FPL's ``proto_source: last_epoch`` counts the steps before the last epoch as the
    epochs run them: clients of 100 samples in batches of 33 with a BatchNorm model run 3
    steps an epoch (the last sample folded), so the prototypes hold every sample of the
    last epoch once; with ``drop_last`` the 99 of its 3 full batches."""
    import clients.fpl as fpl
    from fedrcl_flwr.app.inprocess import run_inprocess

    seen = []

    def spy(feats, labels, **kw):
        seen.append(np.asarray(labels).copy())
        return real(feats, labels, **kw)

    real = fpl.class_cluster_signals
    monkeypatch.setattr(fpl, "class_cluster_signals", spy)
    cfg = tiny(
        model={"name": "lightcnn"},
        federation={"rounds": 1, "clients_per_round": 2},
        client={
            "method": "fpl",
            "local_epochs": 2,
            "batch_size": 33,
            "drop_last": drop_last,
            "params": {"mean_over": "batch", "proto_source": "last_epoch", "tau": 0.02},
        },
    )
    run_inprocess(cfg, tmp_path / "run")
    assert [len(labels) for labels in seen] == [samples, samples]
