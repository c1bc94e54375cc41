"""Per-client (personalised) evaluation, ``evaluation.per_client`` (fedrcl_flwr/
client_eval.py): closed-form statistics, the held-out split, known per-client accuracies
through the real strategy and clients, unchanged global metrics, report / plot /
TensorBoard, and the up-front checks. In process (Flower's evaluate path is driven by
``run_inprocess`` exactly as the server loop calls it)."""

import json
import math

import numpy as np
import pytest
import yaml
from helpers import TINY_SYNTHETIC, assert_run_refused

from fedrcl_flwr import client_eval
from fedrcl_flwr.app.inprocess import _Manager, evaluate_clients, run_inprocess
from fedrcl_flwr.app.server_app import build_server
from fedrcl_flwr.run import runtime
from fedrcl_flwr.run.results import read_metrics

DOMAINS = {
    "name": "synthetic",
    "synthetic": {**TINY_SYNTHETIC, "num_domains": 2},
}
CLIENT_KEYS = ("client_acc_", "client_loss_mean", "client_eval_failures", "client_accuracy")


def _global(recs):
    """Records without times and without the per-client keys."""
    return [
        {
            k: v
            for k, v in r.items()
            if k not in ("wall_time_s", "round_time_s") and not k.startswith(CLIENT_KEYS)
        }
        for r in recs
    ]


# ----------------------------------------------------------------- closed forms


def test_statistics_closed_form():
    # ten clients with accuracies 0.1 .. 1.0: k = ceil(10 / 10) = 1
    res = {pid: (pid + 1, 10, 2.0 + pid) for pid in range(10)}
    s = client_eval.summarize(res)
    assert s["client_acc_n"] == 10 and s["client_eval_failures"] == 0
    assert s["client_acc_mean"] == pytest.approx(0.55)
    assert s["client_acc_std"] == pytest.approx(math.sqrt(0.0825))  # population std
    assert s["client_acc_worst10"] == pytest.approx(0.1)
    assert s["client_acc_best10"] == pytest.approx(1.0)
    assert s["client_loss_mean"] == pytest.approx(0.65)  # mean of (2 + pid) / 10
    assert s["client_accuracy"]["3"] == pytest.approx(0.4)
    # eleven clients: k = 2; a client without local test data counts nowhere
    res = {pid: (pid, 10, 0.0) for pid in range(11)}
    res[99] = (0, 0, 0.0)
    s = client_eval.summarize(res, failures=1)
    assert s["client_acc_n"] == 11 and s["client_eval_failures"] == 1
    assert s["client_acc_worst10"] == pytest.approx(0.05)
    assert s["client_acc_best10"] == pytest.approx(0.95)
    assert "99" not in s["client_accuracy"]
    # three clients, unequal test sizes: every client weighs the same
    s = client_eval.summarize({0: (1, 4, 0.0), 1: (30, 40, 0.0), 2: (0, 1, 0.0)})
    assert s["client_acc_mean"] == pytest.approx((0.25 + 0.75 + 0.0) / 3)
    assert s["client_acc_worst10"] == 0.0 and s["client_acc_best10"] == 0.75
    empty = client_eval.summarize({})
    assert empty["client_acc_n"] == 0 and empty["client_acc_mean"] is None


def _reference_holdout(indices, fraction, seed, client):
    """The documented split, written out: floor(F n + 1/2) (at most n - 1) positions of
    default_rng([seed, client, 0x7E57]).permutation(n), both parts in partition order."""
    n = len(indices)
    n_test = min(int(np.floor(fraction * n + 0.5)), n - 1) if n > 1 else 0
    pos = set(np.random.default_rng([seed, client, 0x7E57]).permutation(n)[:n_test].tolist())
    test = [indices[i] for i in range(n) if i in pos]
    train = [indices[i] for i in range(n) if i not in pos]
    return train, test


@pytest.mark.parametrize("n,fraction", [(100, 0.2), (7, 0.25), (2, 0.9), (1, 0.5), (5, 0.1)])
def test_holdout_split(n, fraction):
    idx = np.random.default_rng(1).permutation(1000)[:n]
    train, test = client_eval.holdout_split(idx, fraction, seed=3, client=5)
    want_train, want_test = _reference_holdout(list(idx), fraction, 3, 5)
    assert train.tolist() == want_train and test.tolist() == want_test
    assert not set(train) & set(test) and sorted([*train, *test]) == sorted(idx)
    assert len(train) >= 1
    again = client_eval.holdout_split(idx, fraction, seed=3, client=5)
    assert all(np.array_equal(a, b) for a, b in zip((train, test), again))


def test_training_data_only_changes_when_held_out(tiny):
    from clients.fedavg import FedAvgClient

    off = tiny()
    parts = runtime.client_partitions(off)
    assert all(np.array_equal(FedAvgClient(off).local_data(p).indices, parts[p]) for p in range(8))
    # the fraction alone does nothing while every = 0
    unused = tiny(evaluation={"per_client": {"every": 0, "local_test_fraction": 0.5}})
    assert np.array_equal(FedAvgClient(unused).local_data(2).indices, parts[2])
    on = tiny(
        evaluation={"target_rounds": [2], "per_client": {"every": 1, "local_test_fraction": 0.3}}
    )
    for p in range(8):
        train, _ = _reference_holdout(list(parts[p]), 0.3, 0, p)
        assert FedAvgClient(on).local_data(p).indices.tolist() == train


# ------------------------------------------------------- known per-client accuracies


def _constant_class0_weights(cfg):
    """A model that predicts class 0 for every input: every entry zero, fc.bias = e_0."""
    model = runtime.new_model(cfg, runtime.load_bundle(cfg))
    out = []
    for k, v in model.state_dict().items():
        w = np.zeros(tuple(v.shape), dtype=v.detach().numpy().dtype)
        if k == "fc.bias":
            w[0] = 1.0
        out.append(w)
    return out


@pytest.mark.parametrize("source", ["holdout", "domain"])
@pytest.mark.parametrize("clients", ["sampled", "all"])
def test_per_client_accuracy_of_a_constant_model(tiny, tmp_path, source, clients):
    """A model that always says class 0 has, on each client, the share of class 0 in that
    client's local test data; the statistics follow in closed form."""
    extra = {"dataset": DOMAINS, "partition": {"scheme": "domain"}} if source == "domain" else {}
    cfg = tiny(
        evaluation={
            "target_rounds": [2],
            "per_client": {"every": 1, "local_test_fraction": 0.25, "clients": clients},
        },
        federation={"rounds": 1},
        **extra,
    )
    strategy, _ = build_server(cfg, tmp_path / "run")
    strategy.weights = _constant_class0_weights(cfg)
    strategy._sampled = [1, 6]
    strategy._fit_info = {"num_clients": 2}
    strategy.ledger.rounds_trained = 1  # the fits are not this test's: a round trained
    assert strategy.evaluate(1, None) is None  # waits for the per-client evaluation
    from clients.fedavg import FedAvgClient

    evaluate_clients(strategy, 1, _Manager(2), lambda: FedAvgClient(cfg))
    rec = read_metrics(tmp_path / "run")[0]

    bundle = runtime.load_bundle(cfg)
    parts = runtime.client_partitions(cfg)
    want = {}
    for pid in range(8) if clients == "all" else [1, 6]:
        if source == "holdout":
            _, test = _reference_holdout(list(parts[pid]), 0.25, 0, pid)
            labels = bundle.train_labels[test]
        else:
            doms = set(bundle.train_domains[parts[pid]].tolist())
            labels = bundle.test_labels[[d in doms for d in bundle.test_domains.tolist()]]
        want[str(pid)] = float(np.mean(labels == 0))
    assert rec["client_accuracy"] == pytest.approx(want)
    a = np.sort(list(want.values()))
    k = math.ceil(len(a) / 10)
    assert rec["client_acc_n"] == len(a) and rec["client_eval_failures"] == 0
    assert rec["client_acc_mean"] == pytest.approx(a.mean())
    assert rec["client_acc_std"] == pytest.approx(a.std())
    assert rec["client_acc_worst10"] == pytest.approx(a[:k].mean())
    assert rec["client_acc_best10"] == pytest.approx(a[-k:].mean())
    assert rec["test_accuracy"] == pytest.approx(float(np.mean(bundle.test_labels == 0)))
    if source == "domain":  # two domains: clients of one domain see the same data
        assert len(set(want.values())) <= 2


def test_finetuning_adapts_a_copy_only(tiny):
    """finetune_steps > 0 changes what a client measures, never the weights it got."""
    from clients.fedavg import FedAvgClient

    base = {"target_rounds": [2], "per_client": {"every": 1}}
    plain = tiny(evaluation=base)
    tuned = tiny(evaluation={**base, "per_client": {"every": 1, "finetune_steps": 4}})
    weights = _constant_class0_weights(plain)
    sent = [w.copy() for w in weights]
    ins = {"run_round": 3, "partition_ids": "0,5"}
    _, n0, m0 = FedAvgClient(plain).evaluate(weights, ins)
    _, n1, m1 = FedAvgClient(tuned).evaluate(weights, ins)
    _, _, m2 = FedAvgClient(tuned).evaluate(weights, ins)
    assert all(np.array_equal(a, b) for a, b in zip(weights, sent))
    r0, r1 = client_eval.decode(m0["client_eval"]), client_eval.decode(m1["client_eval"])
    assert sorted(r0) == sorted(r1) == [0, 5] and n0 == n1
    assert r0 != r1  # four steps away from "always class 0"
    assert m1 == m2  # seeded: the same steps twice


# ------------------------------------------------- global metrics: on = off


def test_global_metrics_identical_with_domain_test_data(tiny, tmp_path):
    """Local test data from the domain's test set leaves training alone: every global
    number equals the run without per-client evaluation (also through the ServerApp's
    overlapped round end, and with local adaptation and every client evaluated)."""
    common = dict(
        dataset=DOMAINS,
        partition={"scheme": "domain"},
        client={"method": "fedrcl"},
        federation={"rounds": 3, "eval_every": 1},
    )
    off = tiny(**common)
    on = tiny(
        **common,
        evaluation={
            "target_rounds": [2],
            "per_client": {"every": 1, "finetune_steps": 2, "clients": "all"},
        },
    )
    run_inprocess(off, tmp_path / "off")
    run_inprocess(on, tmp_path / "on", overlap_evaluation=True)
    a, b = read_metrics(tmp_path / "off"), read_metrics(tmp_path / "on")
    assert _global(a) == _global(b)
    assert all(r["client_acc_n"] == 8 and len(r["client_accuracy"]) == 8 for r in b)
    s = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert s["client_acc_mean"] == b[-1]["client_acc_mean"] and s["client_acc_round"] == 3


def test_held_out_share_is_the_only_change_to_training(tiny, tmp_path):
    """With a held-out local test share each client trains on its partition minus that
    share (documented); the global metrics are exactly those of a run without per-client
    evaluation whose split file holds those training indices."""
    from fedrcl_flwr.data.split_file import save_split_file

    on = tiny(
        evaluation={"target_rounds": [2], "per_client": {"every": 2, "local_test_fraction": 0.3}},
        federation={"rounds": 4, "eval_every": 2},
    )
    parts = runtime.client_partitions(on)
    split = tmp_path / "train_only.json"
    save_split_file([client_eval.training_indices(on, p, parts[p]) for p in range(8)], split)
    off = tiny(
        partition={"scheme": "file", "path": str(split)}, federation={"rounds": 4, "eval_every": 2}
    )
    run_inprocess(on, tmp_path / "on")
    run_inprocess(off, tmp_path / "off")
    a, b = read_metrics(tmp_path / "on"), read_metrics(tmp_path / "off")
    assert [r["round"] for r in a] == [2, 4]
    assert _global(a) == _global(b)
    assert all(0 <= r["client_acc_mean"] <= 1 for r in a)


def test_missing_evaluation_replies_do_not_lose_the_record(tiny, tmp_path):
    """Every client's evaluation fails: the round's record is still written, with the
    failures counted and no statistics."""
    cfg = tiny(
        evaluation={"target_rounds": [2], "per_client": {"every": 1}}, federation={"rounds": 2}
    )
    strategy, _ = build_server(cfg, tmp_path / "run")
    strategy._sampled, strategy._fit_info = [0, 1], {}
    strategy.ledger.rounds_trained = 1  # the fits are not this test's: a round trained
    strategy.evaluate(1, None)
    strategy.aggregate_evaluate(1, [], [RuntimeError("gone"), RuntimeError("gone")])
    rec = read_metrics(tmp_path / "run")[0]
    assert rec["client_eval_failures"] == 2 and rec["client_acc_mean"] is None
    # a round end that never got its evaluation is written when the strategy drains
    strategy.evaluate(2, None)
    strategy.drain()
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [1, 2]


# --------------------------------------------------------- report, plot, TensorBoard


def _fake_run(path, method, seed, client_accs):
    path.mkdir(parents=True)
    cfg = {"seed": seed, "client": {"method": method}, "server": {"strategy": "fedavg"}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    s = client_eval.summarize(
        {i: (int(round(100 * a)), 100, 0.0) for i, a in enumerate(client_accs)}
    )
    rec = {"round": 5, "test_accuracy": 0.5, "ema_accuracy": 0.5, "test_loss": 1.0, **s}
    (path / "metrics.jsonl").write_text(json.dumps(rec) + "\n")


def test_report_and_plot_read_client_metrics(tmp_path, capsys):
    from fedrcl_flwr.cli import main

    _fake_run(tmp_path / "a0", "fedavg", 0, [0.1, 0.5, 0.9])
    _fake_run(tmp_path / "a1", "fedavg", 1, [0.3, 0.5, 0.7])
    _fake_run(tmp_path / "b0", "fedrcl", 0, [0.6, 0.6, 0.6])
    assert main(["report", str(tmp_path), "--metric", "client_worst10"]) == 0
    out = capsys.readouterr().out
    assert "| fedavg | 20.00 ± 14.14 (n=2) |" in out, out
    assert "| fedrcl | **60.00 (n=1)** |" in out, out
    assert main(["report", str(tmp_path), "--metric", "client_mean", "--format", "csv"]) == 0
    assert "fedavg,,client_mean,2,0,50.00,0.00" in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--metric", "client_median"]) == 2
    assert "client_worst10" in capsys.readouterr().err
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out
    for ext in ("png", "pdf"):
        assert (tmp_path / f"fig_clients.{ext}").stat().st_size > 0
        assert f"fig_clients.{ext}" in out


def test_tracker_tags(tiny, tmp_path):
    """The client statistics reach every tracker (one writer: fedrcl_flwr/tracking/)
    under ``client_accuracy/...``; the per-client mapping stays in metrics.jsonl."""
    from fedrcl_flwr.tracking.records import scalars

    rec = {
        "round": 2,
        "test_accuracy": 0.5,
        **client_eval.summarize({0: (1, 4, 0.0), 1: (3, 4, 0.0)}),
    }
    tags = scalars(rec)
    assert tags["client_accuracy/mean"] == 0.5 and tags["client_accuracy/worst10"] == 0.25
    assert tags["client_accuracy/best10"] == 0.75 and tags["client_accuracy/n"] == 2
    assert not any("client_accuracy/0" in t for t in tags)


# ------------------------------------------------------------------ up-front checks


@pytest.mark.parametrize(
    "override,message",
    [
        ("evaluation.per_client.every=-1", "'evaluation.per_client.every' must be >= 0"),
        (
            "evaluation.per_client={every: 4, local_test_fraction: 1.5}",
            "'evaluation.per_client.local_test_fraction' must be in [0, 1)",
        ),
        (
            "evaluation.per_client={every: 4, local_test_fraction: 0}",
            "'evaluation.per_client.local_test_fraction' must be > 0",
        ),
        (
            "evaluation.per_client={every: 4, local_test: domain}",
            "'evaluation.per_client.local_test' domain needs partition.scheme domain",
        ),
        (
            "evaluation.per_client={every: 4, clients: few}",
            "'evaluation.per_client.clients' must be sampled, unsampled or all",
        ),
        (
            "evaluation.per_client={every: 4, finetune_steps: -1}",
            "'evaluation.per_client.finetune_steps' must be in [0, 100000]",
        ),
        ("evaluation.per_client={every: 4, steps: 1}", "unknown key 'evaluation.per_client.steps'"),
        ("evaluation.per_client.every=3", "must be a multiple of 'federation.eval_every' (2)"),
    ],
)
def test_bad_values_stop_before_the_run(tmp_path, capsys, override, message):
    experiment = {
        "federation": {"eval_every": 2, "num_clients": 10},
        "dataset": {"synthetic": {"num_train": 100}},
    }
    assert_run_refused(tmp_path, capsys, experiment, override, message)


def test_a_device_holds_out_and_evaluates_its_own_data(tiny):
    """A real device (fixed local data) ignores the partitions the server names: it holds
    out its own share (seeded by its partition-id), trains on the rest and reports itself."""
    from clients.client_data import LocalData
    from clients.fedavg import FedAvgClient

    cfg = tiny(
        evaluation={"target_rounds": [2], "per_client": {"every": 1, "local_test_fraction": 0.5}}
    )
    bundle = runtime.load_bundle(cfg)
    own = LocalData(bundle.train, np.arange(40), bundle.train_labels, bundle.num_classes)
    client = FedAvgClient(cfg, local_data=own, partition_id=3)
    train, test = _reference_holdout(list(range(40)), 0.5, 0, 3)
    assert client.local_data(0).indices.tolist() == train
    _, n, metrics = client.evaluate(
        _constant_class0_weights(cfg), {"run_round": 1, "partition_ids": "0,1"}
    )
    got = client_eval.decode(metrics["client_eval"])
    assert list(got) == [3] and n == len(test) == 20
    assert got[3][0] == int(np.sum(bundle.train_labels[test] == 0))
