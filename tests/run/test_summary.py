"""summary.json: ``last5`` (FedCCL's mean of the last five rounds) overall and per domain,
``report_metric`` from the config, and ``accuracy_at`` only for target rounds the run
reached. Built from hand-written round records."""

import json

import pytest

from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.run.results import RunRecorder, read_metrics


def _rec(rnd, acc, ema=None, dom=None):
    r = {
        "round": rnd,
        "test_accuracy": acc,
        "test_loss": 1.0,
        "ema_accuracy": acc if ema is None else ema,
        "num_clients": 2,
    }
    if dom is not None:
        r["domain_accuracy"] = dom
    return r


def test_last5_is_the_mean_of_the_last_five_evaluated_rounds(tmp_path):
    rec = RunRecorder(tmp_path, method="fedccl", strategy="fedavg", rounds=8, report_metric="last5")
    accs = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.9]
    for r, a in enumerate(accs, 1):
        rec.append(_rec(r, a))
    rec.append({"round": 9, "test_accuracy": None, "num_clients": 2})  # not evaluated
    s = rec.finish()
    assert s["last5"] == pytest.approx((0.4 + 0.5 + 0.6 + 0.7 + 0.9) / 5)
    assert s["report_metric"] == "last5"
    assert "last5_per_domain" not in s
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["last5"] == pytest.approx(0.62) and on_disk["report_metric"] == "last5"


def test_last5_with_fewer_rounds_and_none(tmp_path):
    rec = RunRecorder(tmp_path, method="m", strategy="s", rounds=2)
    assert rec.summary()["last5"] is None
    rec.append(_rec(1, 0.3))
    rec.append(_rec(2, 0.5))
    s = rec.summary()
    assert s["last5"] == pytest.approx(0.4) and s["report_metric"] == "final"


def test_last5_per_domain(tmp_path):
    rec = RunRecorder(tmp_path, method="fedccl", strategy="fedavg", rounds=7)
    for r in range(1, 8):
        rec.append(_rec(r, 0.1 * r, dom={"mnist": 0.1 * r, "svhn": 0.05 * r}))
    s = rec.summary()
    assert s["last5_per_domain"] == pytest.approx(
        {"mnist": (0.3 + 0.4 + 0.5 + 0.6 + 0.7) / 5, "svhn": (0.3 + 0.4 + 0.5 + 0.6 + 0.7) / 10}
    )
    assert 0.0 <= s["last5"] <= 1.0


def test_accuracy_at_only_for_reached_targets(tmp_path):
    rec = RunRecorder(tmp_path, method="m", strategy="s", rounds=40, target_rounds=[20, 40])
    rec.append(_rec(1, 0.3, 0.3))
    rec.append(_rec(2, 0.5, 0.32))
    s = rec.finish()
    assert s["accuracy_at"] == {}
    assert json.loads((tmp_path / "summary.json").read_text())["accuracy_at"] == {}


def test_accuracy_at_reached_target_between_evaluations(tmp_path):
    # eval every 3 rounds: target 4 was reached (round 5 recorded), its value is the EMA of
    # the last evaluation at or before it (round 3); target 7 was not reached
    rec = RunRecorder(tmp_path, method="m", strategy="s", rounds=7, target_rounds=[4, 7])
    for r in range(1, 6):
        if r % 3 == 0:
            rec.append(_rec(r, 0.5, 0.45))
        else:
            rec.append({"round": r, "test_accuracy": None, "num_clients": 2})
    assert rec.summary()["accuracy_at"] == {"4": 0.45}


@pytest.mark.parametrize(
    "value,ok",
    [
        ("final", True),
        ("best", True),
        ("last5", True),
        ("ema@2", True),
        ("ema@3", False),
        ("ema@0", False),
        ("ema@", False),
        ("last10", False),
        ("ema", False),
    ],
)
def test_report_metric_is_validated(tiny, value, ok):
    if ok:
        assert tiny(evaluation={"report_metric": value}).evaluation.report_metric == value
    else:
        with pytest.raises(ConfigError, match="evaluation.report_metric"):
            tiny(evaluation={"report_metric": value})


def test_inprocess_run_writes_last5_and_report_metric(tiny, tmp_path):
    from fedrcl_flwr.app.inprocess import run_inprocess

    cfg = tiny(
        federation={"rounds": 2}, evaluation={"report_metric": "last5", "target_rounds": [2, 40]}
    )
    run_inprocess(cfg, tmp_path / "run")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    recs = read_metrics(tmp_path / "run")
    assert s["last5"] == pytest.approx(sum(r["test_accuracy"] for r in recs) / 2)
    assert s["report_metric"] == "last5" and set(s["accuracy_at"]) == {"2"}


def test_domain_means_are_unweighted_over_domains(tmp_path):
    """The papers' "Avg": per domain, then the plain mean over domains, whatever the
    domains' test-set sizes (the pooled accuracy weights them by size instead)."""
    rec = RunRecorder(
        tmp_path,
        method="fedccl",
        strategy="fedavg",
        rounds=7,
        target_rounds=[3, 7, 9],
        report_metric="last5_domain_mean",
        ema_factor=0.5,
    )
    # domain a: 0.1 r, domain b: 0.6; pooled (b ten times larger) weighs b 10:1
    for r in range(1, 8):
        a, b = 0.1 * r, 0.6
        rec.append(_rec(r, (a + 10 * b) / 11, dom={"a": a, "b": b, "average": (a + b) / 2}))
    s = rec.finish()
    assert s["final_domain_mean"] == pytest.approx((0.7 + 0.6) / 2)
    # last five rounds 3..7: a = 0.5 on average
    assert s["last5_domain_mean"] == pytest.approx((0.5 + 0.6) / 2)
    assert s["last5"] == pytest.approx((0.5 + 6) / 11)  # the pooled number, unchanged
    assert s["best_domain_mean"] == pytest.approx(0.65)  # round 7
    # EMA (factor 0.5, started at the first value) of a: 0.1, 0.15, 0.225, 0.3125,
    # 0.40625, 0.503125, 0.6015625; of b: 0.6; target 9 was never reached
    assert s["ema_domain_mean_at"] == pytest.approx(
        {"3": (0.225 + 0.6) / 2, "7": (0.6015625 + 0.6) / 2}
    )
    assert s["report_metric"] == "last5_domain_mean"
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["last5_domain_mean"] == pytest.approx(0.55)


def test_no_domain_means_without_domains(tmp_path):
    rec = RunRecorder(tmp_path, method="m", strategy="s", rounds=2)
    rec.append(_rec(1, 0.3))
    s = rec.summary()
    assert not any("domain_mean" in k for k in s)


def test_reported_value_of_domain_metrics():
    from fedrcl_flwr.run.summaries import reported_value

    s = {"last5": 0.5, "last5_domain_mean": 0.4, "ema_domain_mean_at": {"10": 0.3}}
    assert reported_value(s, "last5") == 0.5
    assert reported_value(s, "last5_domain_mean") == 0.4
    assert reported_value(s, "ema@10_domain_mean") == 0.3
    assert reported_value(s, "final_domain_mean") is None  # an older summary: not there
