"""Unreliable clients, ``federation.availability`` (fedrcl_flwr/availability.py): the
documented draws written out independently, stragglers in closed form, reproducible and
resume-safe runs, rounds nobody reports, every method x server optimizer, up-front checks,
and, with both features off, the metrics of the code before them."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_SYNTHETIC, assert_run_refused

from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.availability import Availability, local_steps, per_client_values
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.run.runtime import sample_partitions

DATA = Path(__file__).resolve().parents[1] / "data"


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "round_time_s")} for r in recs]


def _avail(tiny, **availability):
    return Availability.from_config(tiny(federation={"availability": availability}))


# ---------------------------------------------------------------- the draws


def test_dropout_draws_are_the_documented_ones(tiny):
    p = [0.0, 0.9, 0.5, 0.3, 0.0, 0.7, 0.2, 0.95]
    av = _avail(tiny, dropout=p)
    for rnd in range(1, 41):
        sampled = sample_partitions(0, rnd, 8, 2)
        u = np.random.default_rng([0, rnd, 0xD209]).random(8)
        out = av.round(rnd, sampled)
        assert out.dropped_out == [i for i in sampled if u[i] < p[i]]
        assert out.reporting == [i for i in sampled if u[i] >= p[i]]
        assert out.late == [] and out.sim_round_time is None
        # independent of the other sampled clients
        assert av.round(rnd, [sampled[0]]).dropped_out == [i for i in sampled[:1] if u[i] < p[i]]


def test_fixed_dropout_rate(tiny):
    av = _avail(tiny, dropout=0.3)
    dropped = sum(len(av.round(r, list(range(8))).dropped_out) for r in range(1, 501))
    # 4000 Bernoulli(0.3) draws: mean 1200, sd 29
    assert abs(dropped - 1200) < 4 * math.sqrt(4000 * 0.3 * 0.7)


def test_per_client_distributions(tiny):
    u = per_client_values({"distribution": "uniform", "low": 0.1, "high": 0.4}, 1000, 7, 0xD20C)
    assert np.array_equal(u, np.random.default_rng([7, 0xD20C]).uniform(0.1, 0.4, 1000))
    assert 0.1 <= u.min() and u.max() < 0.4 and len(set(u.tolist())) == 1000
    b = per_client_values({"distribution": "beta", "a": 2, "b": 6}, 20000, 7, 0xD20C)
    assert b.mean() == pytest.approx(0.25, abs=0.01)
    s = per_client_values({"distribution": "lognormal", "sigma": 0.5}, 20001, 3, 0x5BEED)
    assert np.median(s) == pytest.approx(1.0, abs=0.03)
    assert np.array_equal(
        s, np.exp(0.5 * np.random.default_rng([3, 0x5BEED]).standard_normal(20001))
    )
    # a client's probability depends on the seed only (not on the round)
    cfg = tiny(
        federation={
            "availability": {"dropout": {"distribution": "uniform", "low": 0.0, "high": 0.9}}
        }
    )
    av = Availability.from_config(cfg)
    assert np.array_equal(av.dropout, np.random.default_rng([0, 0xD20C]).uniform(0, 0.9, 8))


def test_stragglers_closed_form(tiny):
    """Equal workloads (iterations_per_epoch): client i's time is 1 / s_i; those above the
    deadline are late in every round they are sampled and available."""
    speed = [1.0, 0.5, 0.25, 2.0, 1.0, 0.8, 0.6, 4.0]
    cfg = tiny(
        client={"iterations_per_epoch": 3},
        federation={
            "clients_per_round": 4,
            "availability": {"stragglers": {"speed": speed, "deadline": 1.5}},
        },
    )
    av = Availability.from_config(cfg, sizes=[100, 40, 100, 70, 100, 100, 100, 100])
    for rnd in range(1, 11):
        sampled = sample_partitions(0, rnd, 8, 4)
        out = av.round(rnd, sampled)
        assert out.late == [i for i in sampled if i in (1, 2, 6)]  # times 2, 4, 1.67
        assert out.reporting == [i for i in sampled if i not in (1, 2, 6)]
        want = 1.5 if out.late else max(1 / speed[i] for i in out.reporting)
        assert out.sim_round_time == pytest.approx(want)
        rec = av.record(rnd, out)
        assert rec["dropped"] == rec["late"] == len(out.late)
        assert rec["dropped_ids"] == rec["late_ids"] == out.late


def test_straggler_workloads_follow_local_steps(tiny):
    """Without iterations_per_epoch a client's workload is its local steps (epochs x
    ceil(n / batch)) over the mean; with jitter times get exp(jitter z) per round."""
    cfg = tiny(
        client={"batch_size": 32, "local_epochs": 2},
        federation={"availability": {"stragglers": {"speed": 1.0, "jitter": 0.2}}},
    )
    sizes = [32, 64, 65, 100, 10, 0, 200, 96]
    steps = np.array([2 * math.ceil(n / 32) for n in sizes], dtype=float)
    assert [local_steps(n, 2, 32, None) for n in sizes] == steps.tolist()
    assert local_steps(100, 3, 50, 10) == 30 and local_steps(5, 1, 50, 10) == 5
    av = Availability.from_config(cfg, sizes=sizes)
    assert np.allclose(av.workload, steps / steps.mean())
    z = np.random.default_rng([0, 4, 0x5B17]).standard_normal(8)
    assert np.allclose(av.times(4), steps / steps.mean() * np.exp(0.2 * z))
    out = av.round(4, [0, 3, 6])
    assert out.late == [] and out.sim_round_time == pytest.approx(av.times(4)[[0, 3, 6]].max())


# ------------------------------------------------------------------ runs


AVAIL = {
    "dropout": {"distribution": "uniform", "low": 0.2, "high": 0.7},
    "stragglers": {
        "speed": {"distribution": "lognormal", "sigma": 0.6},
        "deadline": 1.6,
        "jitter": 0.1,
    },
}


def test_runs_are_reproducible_and_resume_safe(tiny, tmp_path):
    """A run killed after round 2 and resumed drops exactly the clients of an
    uninterrupted run (and ends with the same metrics), also with the ServerApp's
    overlapped round end and per-client evaluation."""
    cfg = tiny(
        federation={"rounds": 4, "clients_per_round": 4, "availability": AVAIL},
        evaluation={"target_rounds": [2], "per_client": {"every": 2}},
        output={"checkpoint_every": 1},
    )
    run_inprocess(cfg, tmp_path / "full")
    run_inprocess(cfg, tmp_path / "cut", stop_after=2, overlap_evaluation=True)
    run_inprocess(cfg, tmp_path / "cut", resume=True, overlap_evaluation=True)
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert _strip(full) == _strip(cut)
    av = Availability.from_config(cfg)
    for r in full:
        out = av.round(r["round"], sample_partitions(0, r["round"], 8, 4))
        assert r["dropped_ids"] == out.dropped and r["late_ids"] == out.late
        assert r["num_clients"] + r["dropped"] == 4
    assert sum(r["dropped"] for r in full) == full[-1]["dropped_total"] > 0
    assert any(r["late"] for r in full) and any(r["dropped"] > r["late"] for r in full)
    assert [r["round"] for r in full if "client_acc_mean" in r] == [2, 4]
    s = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert s["dropped_total"] == full[-1]["dropped_total"]
    assert s["late_total"] == full[-1]["late_total"]


def test_round_nobody_reports_keeps_the_model(tiny, tmp_path):
    """A round in which every sampled client drops out leaves the global model as it was
    and is recorded (not counted as a failure: the run goes on)."""
    p = [0.99] * 8
    p[3] = 0.0
    cfg = tiny(
        federation={"rounds": 4, "max_consecutive_failed_rounds": 1, "availability": {"dropout": p}}
    )
    run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == [1, 2, 3, 4]
    empty = [r for r in recs if r["num_clients"] == 0]
    assert empty, "expected a round without reports"
    for r in empty:
        assert r["dropped"] == 2 and r["failures"] == 0 and "train_loss" not in r
        before = [q for q in recs if q["round"] == r["round"] - 1]
        if before:  # the global model did not move
            assert r["test_loss"] == before[0]["test_loss"]
    assert any(r["num_clients"] == 1 for r in recs)  # partition 3 always reports


@pytest.mark.parametrize(
    "method,strategy",
    [
        ("fedavg", "fedadam"),
        ("fedrcl", "fedacg"),
        ("feddyn", "feddyn"),
        ("fedccl", "fedavgm"),
    ],
)
def test_composes_with_methods_and_server_optimizers(tiny, tmp_path, method, strategy):
    cfg = tiny(
        client={"method": method},
        server={"strategy": strategy},
        federation={"rounds": 2, "clients_per_round": 3, "availability": AVAIL},
        evaluation={"target_rounds": [2], "per_client": {"every": 1, "finetune_steps": 1}},
    )
    run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert len(recs) == 2
    for r in recs:
        assert math.isfinite(r["test_loss"]) and "dropped" in r and "late" in r
        assert r["client_acc_n"] == 3 and 0 <= r["client_acc_mean"] <= 1


@pytest.mark.parametrize(
    "privacy",
    [
        {"dp": {"mode": "server", "noise_multiplier": 1.0, "clipping_norm": 0.05}},
        {"secagg": True, "dp": {"mode": "client", "noise_multiplier": 0.0, "clipping_norm": 0.05}},
    ],
    ids=["dp-server", "secagg-dp-client"],
)
def test_composes_with_privacy(tiny, tmp_path, privacy):
    """Dropout with central DP and with SecAgg+ (Flower's workflow and the real ClientApp
    in process, per-client evaluation included): the privacy accountant counts the clients
    that were sent the model, not the sampled ones that dropped out; under SecAgg+ a round
    with a single reporting client is halted by Flower and leaves the model unchanged."""
    from fedrcl_flwr.privacy import gaussian_epsilon

    p = [0.99, 0.99, 0.99, 0.0, 0.0, 0.0, 0.0, 0.0]  # clients 0-2 always drop out
    cfg = tiny(
        federation={"rounds": 3, "clients_per_round": 4, "availability": {"dropout": p}},
        evaluation={"target_rounds": [2], "per_client": {"every": 3}},
        privacy=privacy,
    )
    run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    av = Availability.from_config(cfg)
    sent = [av.round(r, sample_partitions(0, r, 8, 4)).reporting for r in (1, 2, 3)]
    assert sent == [[3], [5], [3, 4, 5, 7]]
    released = [False, False, True] if privacy.get("secagg") else [True, True, True]
    counts = np.zeros(8, int)
    for rec, ids, out in zip(recs, sent, released):
        counts[ids] += out  # a halted SecAgg+ round releases nothing
        assert rec["dp_max_client_rounds"] == counts.max()  # round 2: 1 (sampled: 2)
        sigma = privacy["dp"]["noise_multiplier"]
        if sigma:
            assert rec["dp_epsilon"] == pytest.approx(
                gaussian_epsilon(sigma, counts.max(), rec["dp_delta"])
            )
        assert rec["dropped"] == 4 - len(ids)
    if privacy.get("secagg"):  # SecAgg+ needs 2 reporting clients
        assert [r["num_clients"] for r in recs] == [0, 0, 4]
        assert recs[0]["test_loss"] == recs[1]["test_loss"]
        assert [r.get("failure_reason") for r in recs] == [  # the failed-round rule
            "SecAgg+ needs at least 2 clients, 1 was sent the model",
            "SecAgg+ needs at least 2 clients, 1 was sent the model",
            None,
        ]
    else:
        assert [r["num_clients"] for r in recs] == [1, 1, 4]
    assert recs[-1]["client_acc_n"] == 4 and recs[-1]["client_eval_failures"] == 0


def test_both_features_off_change_no_number(tiny, tmp_path):
    """Defaults: the records are those of the code before these two features (same keys; the
    numbers within float tolerance: another BLAS may round differently). Such rounding
    differences (~1e-6 after two rounds between two x86 CPUs) are amplified by training:
    FedRCL + FedACG's third round then differs by a test example or more, so its numbers are
    compared over the first two rounds, FedAvg's over all three."""
    before = json.loads((DATA / "metrics_features_off.json").read_text())
    easy = {
        "name": "synthetic",
        "synthetic": {
            **TINY_SYNTHETIC,
            "noise": 0.3,
            "class_weight": 3.0,
            "distractor_strength": 0.2,
        },
    }
    kinds = {
        "fedavg": {},
        "fedrcl_fedacg": {"client": {"method": "fedrcl"}, "server": {"strategy": "fedacg"}},
    }
    for name, kw in kinds.items():
        cfg = tiny(dataset=easy, **kw)
        run_inprocess(cfg, tmp_path / name)
        now = [
            {k: v for k, v in r.items() if k != "client_nodes"}
            for r in _strip(read_metrics(tmp_path / name))
        ]
        assert [sorted(r) for r in now] == [sorted(r) for r in before[name]]
        assert len(now) == 3
        compared = 3 if name == "fedavg" else 2
        for a, b in zip(now[:compared], before[name][:compared]):
            for k, v in b.items():
                if isinstance(v, float):
                    assert a[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (name, k)
                else:
                    assert a[k] == v, (name, k)
    s = json.loads((tmp_path / "fedavg" / "summary.json").read_text())
    assert not {"dropped_total", "client_acc_mean"} & set(s)


# ------------------------------------------------------------------ up-front checks


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "federation.availability.dropout=1.0",
            "'federation.availability.dropout' must be a probability in [0, 1)",
        ),
        (
            "federation.availability.dropout=[0.1, 0.2]",
            "'federation.availability.dropout' lists 2 values but 'federation.num_clients' is 10",
        ),
        (
            "federation.availability.dropout={distribution: normal}",
            "'federation.availability.dropout.distribution' must be one of uniform, beta",
        ),
        (
            "federation.availability.dropout={distribution: uniform, low: 0.5, high: 0.2}",
            "uniform needs 0 <= low <= high < 1",
        ),
        (
            "federation.availability.dropout={distribution: beta, a: 1, b: 1, c: 1}",
            "unknown key 'federation.availability.dropout.c'",
        ),
        ("federation.availability.dropout=many", "'federation.availability.dropout' must be"),
        (
            "federation.availability.stragglers={deadline: 2}",
            "need 'federation.availability.stragglers.speed'",
        ),
        (
            "federation.availability.stragglers={speed: 0}",
            "'federation.availability.stragglers.speed' must be a speed factor > 0",
        ),
        (
            "federation.availability.stragglers={speed: {distribution: lognormal}}",
            "'federation.availability.stragglers.speed.sigma' is required",
        ),
        (
            "federation.availability.stragglers={speed: 1, deadline: -1}",
            "'federation.availability.stragglers.deadline' must be > 0",
        ),
        ("federation.availability.late=1", "unknown key 'federation.availability.late'"),
    ],
)
def test_bad_values_stop_before_the_run(tmp_path, capsys, override, message):
    experiment = {"federation": {"num_clients": 10}, "dataset": {"synthetic": {"num_train": 100}}}
    assert_run_refused(tmp_path, capsys, experiment, override, message)
