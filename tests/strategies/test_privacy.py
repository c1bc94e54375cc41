"""Privacy (privacy.dp on Flower's DP wrappers, privacy.secagg = Flower's SecAgg+), in
process: with noise 0 the DP path is plain clipping arithmetic for every server rule;
the noise on the aggregate has std σ·C/n; ε is the accountant's closed form of the
clients' participation (and within 10 % above the exact Gaussian ε); client-side clipping
(Flower's fixedclipping_mod in the real ClientApp) equals server-side clipping; SecAgg+
(the real secaggplus_mod and SecAggPlusWorkflow on an in-process grid) equals the plain
aggregate within one quantisation step; refused combinations are one line, exit 2."""

import math
from pathlib import Path

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays
from helpers import FakeManager, fitres
from helpers import make_strategy as make

from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.cli import main
from fedrcl_flwr.config import DPConfig, PrivacyConfig
from fedrcl_flwr.privacy import gaussian_epsilon
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.run.runtime import sample_partitions

pytest.importorskip("dp_accounting")


QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"


def _dp(mode="server", sigma=0.0, clip=1.0):
    return PrivacyConfig(dp=DPConfig(mode=mode, noise_multiplier=sigma, clipping_norm=clip))


def _clip(update, c):
    norm = math.sqrt(sum(float(np.sum(u.astype(np.float64) ** 2)) for u in update))
    return [u * min(1.0, c / norm) for u in update]


def _round(strategy, models, n_sampled, failures=()):
    """One round: configure (records what the clients are sent), then results for the
    sampled partitions with the given models."""
    ins = strategy.configure_fit(1, None, FakeManager(n_sampled))
    pids = [fi.config["partition_id"] for _, fi in ins]
    sent = parameters_to_ndarrays(ins[0][1].parameters)
    results = [(None, fitres(m, 10, pid)) for m, pid in zip(models, pids)]
    strategy.aggregate_fit(1, results, list(failures))
    return sent


@pytest.mark.parametrize(
    "name, params",
    [("fedavg", {}), ("fedavgm", {"momentum": 0.4}), ("fedadam", {}), ("fedacg", {})],
)
def test_noise_zero_is_plain_clipping_arithmetic(name, params):
    """σ = 0: the DP strategy on raw client models = the plain strategy on the clients'
    updates clipped by hand (relative to what they were sent: FedACG's look-ahead)."""
    rng = np.random.default_rng(0)
    w0 = [rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=7).astype(np.float32)]
    dp = make(w0, name=name, params=params, privacy=_dp(clip=0.5), clients_per_round=3)
    plain = make(w0, name=name, params=params, clients_per_round=3)
    if name == "fedacg":  # a non-zero momentum: the look-ahead differs from the model
        m = [rng.normal(size=w.shape) * 0.1 for w in w0]
        dp.m_buf, plain.m_buf = [x.copy() for x in m], [x.copy() for x in m]
    scales = [0.05, 0.3, 2.0]  # one update inside the ball, two clipped
    sent = dp.weights_to_send(1)
    updates = [[rng.normal(size=w.shape).astype(np.float32) * s for w in w0] for s in scales]
    models = [[w + u for w, u in zip(sent, up)] for up in updates]
    got_sent = _round(dp, models, 3)
    assert all(np.array_equal(a, b) for a, b in zip(got_sent, sent))
    clipped = [[w + c for w, c in zip(sent, _clip(up, 0.5))] for up in updates]
    _round(plain, clipped, 3)
    for a, b in zip(dp.weights, plain.weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)
    assert dp._fit_info["dp_epsilon"] == math.inf  # no noise, no guarantee


def test_a_missing_client_keeps_the_fixed_denominator():
    """3 sampled, 1 failed: w_sent + (clip Δ_1 + clip Δ_2) / 3 (DP-FedAvg's fixed
    denominator, so that σ·C/n stays the right noise)."""
    rng = np.random.default_rng(1)
    w0 = [rng.normal(size=20).astype(np.float32)]
    dp = make(w0, privacy=_dp(clip=1.0), clients_per_round=3)
    ups = [[rng.normal(size=20).astype(np.float32)] for _ in range(2)]
    _round(dp, [[w0[0] + u[0]] for u in ups], 3, failures=[RuntimeError("gone")])
    want = w0[0].astype(np.float64) + sum(_clip(u, 1.0)[0] for u in ups) / 3
    np.testing.assert_allclose(dp.weights[0], want, atol=2e-6)
    assert dp._fit_info["num_clients"] == 2 and dp._fit_info["failures"] == 1


def test_noise_std_is_sigma_c_over_n():
    """σ = 1.5, C = 2, n = 4, 400k entries: every client sends the same update (inside the
    ball), so the aggregate minus that update is Flower's noise alone."""
    rng = np.random.default_rng(2)
    w0 = [np.zeros(400_000, np.float32)]
    dp = make(w0, privacy=_dp(sigma=1.5, clip=2.0), clients_per_round=4)
    up = rng.normal(size=400_000).astype(np.float32)
    up *= 1.0 / np.linalg.norm(up)
    _round(dp, [[up]] * 4, 4)
    noise = dp.weights[0].astype(np.float64) - up
    assert noise.std() == pytest.approx(1.5 * 2.0 / 4, rel=0.01)
    assert abs(noise.mean()) < 5 * 0.75 / math.sqrt(400_000)


def test_client_mode_drops_an_unclipped_upload():
    """mode client: an update longer than the clipping norm (its ClientApp did not clip)
    is dropped and counted, not averaged."""
    rng = np.random.default_rng(3)
    w0 = [rng.normal(size=10).astype(np.float32)]
    dp = make(w0, privacy=_dp(mode="client", clip=0.1), clients_per_round=2)
    ins = dp.configure_fit(1, None, FakeManager(2))
    assert all(fi.config["clipping_norm"] == 0.1 for _, fi in ins)  # Flower's key
    small = [w0[0] + np.full(10, 0.01, np.float32)]
    big = [w0[0] + np.full(10, 1.0, np.float32)]
    pids = [fi.config["partition_id"] for _, fi in ins]
    dp.aggregate_fit(1, [(None, fitres(small, 5, pids[0])), (None, fitres(big, 5, pids[1]))], [])
    assert dp._fit_info["num_clients"] == 1 and dp._fit_info["failures"] == 1
    np.testing.assert_allclose(dp.weights[0], w0[0] + 0.005, atol=1e-6)  # fixed n = 2


@pytest.mark.parametrize("sigma, k", [(1.0, 1), (1.0, 10), (0.8, 3), (5.0, 100)])
def test_epsilon_is_the_accountants_closed_form(sigma, k):
    """k Gaussian releases (sensitivity 1): RDP k·α/(2σ²) on the accountant's orders,
    converted by Canonne-Kamath-Steinke Prop. 12 (transliterated here); and above the
    exact ε of the composed Gaussian (Balle & Wang 2018), by less than 10 %."""
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
    from scipy.optimize import brentq
    from scipy.stats import norm

    delta = 1e-5
    closed = min(
        k * a / (2 * sigma**2) + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
        for a in DEFAULT_RDP_ORDERS
        if a > 1.01
    )
    eps = gaussian_epsilon(sigma, k, delta)
    assert eps == pytest.approx(closed, rel=1e-12)
    mu = math.sqrt(k) / sigma
    exact = brentq(
        lambda e: norm.cdf(mu / 2 - e / mu) - math.exp(e) * norm.cdf(-mu / 2 - e / mu) - delta,
        0,
        500,
    )
    assert exact <= eps <= 1.1 * exact


@pytest.mark.integration
def test_run_records_epsilon_of_the_busiest_client_across_a_resume(tiny, tmp_path):
    """Per round ε = that of the largest number of rounds any client was sampled in so
    far (public sampling: no amplification), also after a kill and resume; summary.json
    carries the last."""
    sigma, delta = 1.2, 1e-4
    priv = {
        "dp": {"mode": "server", "noise_multiplier": sigma, "clipping_norm": 0.01, "delta": delta}
    }
    cfg = tiny(
        federation={"rounds": 3},  # 8 clients, 2 a round
        privacy=priv,
        output={"dir": str(tmp_path / "run"), "checkpoint_every": 1},
    )
    run_inprocess(cfg, tmp_path / "run", stop_after=2)
    run_inprocess(cfg, tmp_path / "run", resume=True)  # the accountant from the checkpoint
    counts = np.zeros(8, int)
    recs = read_metrics(tmp_path / "run")
    for rec in recs:
        counts[sample_partitions(0, rec["round"], 8, 2)] += 1
        assert rec["dp_max_client_rounds"] == counts.max()
        assert rec["dp_epsilon"] == pytest.approx(gaussian_epsilon(sigma, counts.max(), delta))
        assert rec["dp_delta"] == delta
    import json

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dp_epsilon"] == recs[-1]["dp_epsilon"] and summary["dp_delta"] == delta
    from fedrcl_flwr.report.formats import report

    assert f"ε≤{recs[-1]['dp_epsilon']:.2f}" in report([tmp_path / "run"])


def _weights(strategy):
    return [np.asarray(w, np.float64) for w in strategy.weights]


@pytest.mark.integration
def test_client_clipping_and_secagg_through_the_real_apps(tiny, tmp_path, monkeypatch):
    """One round, 3 clients, through Flower's workflow and the real ClientApp on an
    in-process grid: client-side clipping (fixedclipping_mod) = server-side clipping
    exactly; SecAgg+ (secaggplus_mod + SecAggPlusWorkflow) = the plain average within one
    quantisation step 2·range/levels, with and without client-side DP. SecAgg+ shows in
    the round line, and ``model_bytes_up`` is the bytes of the masked vectors the
    ClientApp really replied with (read from its messages)."""
    from flwr.common import bytes_to_ndarray

    from fedrcl_flwr.app.inprocess import InProcessGrid
    from fedrcl_flwr.run.progress import format_round_line

    masked: list = []  # (run dir, bytes of the arrays of one masked upload)
    real = InProcessGrid.send_and_receive

    def spy(self, messages, *, timeout=None):
        replies = real(self, messages, timeout=timeout)
        for r in replies:
            for rec in r.content.config_records.values() if r.has_content() else []:
                if "masked_params" in rec:
                    arrays = [bytes_to_ndarray(b) for b in rec["masked_params"]]
                    assert all(a.dtype == np.int64 for a in arrays)
                    masked.append((self.contexts[1000].run_config["output-dir"], arrays))
        return replies

    monkeypatch.setattr(InProcessGrid, "send_and_receive", spy)
    fed = {"rounds": 1, "clients_per_round": 3}
    dp = {"noise_multiplier": 0.0, "clipping_norm": 0.05}
    runs = {
        name: _weights(run_inprocess(tiny(federation=fed, privacy=priv), tmp_path / name))
        for name, priv in [
            ("plain", {}),
            ("secagg", {"secagg": True}),
            ("server_dp", {"dp": {"mode": "server", **dp}}),
            ("client_dp", {"dp": {"mode": "client", **dp}}),
            ("client_dp_secagg", {"secagg": True, "dp": {"mode": "client", **dp}}),
        ]
    }
    step = 2 * 8.0 / (1 << 22)  # privacy.secagg_clipping_range / secagg_quantization_range
    for a, b in zip(runs["client_dp"], runs["server_dp"]):
        assert np.array_equal(a, b)
    for ref, other in (("plain", "secagg"), ("client_dp", "client_dp_secagg")):
        diff = max(float(np.abs(a - b).max()) for a, b in zip(runs[ref], runs[other]))
        assert 0 < diff <= step + 1e-6, (ref, diff)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(runs["plain"], runs["client_dp"]))
    assert moved > 100 * step  # clipping to 0.05 did change the model
    recs = read_metrics(tmp_path / "secagg")
    assert recs[0]["num_clients"] == 3 and recs[0]["failures"] == 0
    ups = [sum(a.nbytes for a in arrays) for d, arrays in masked if d == str(tmp_path / "secagg")]
    assert len(ups) == 3 and recs[0]["model_bytes_up"] == sum(ups)
    plain = read_metrics(tmp_path / "plain")[0]
    assert recs[0]["model_bytes_up"] > 1.9 * plain["model_bytes_up"]  # int64 vs float32
    assert recs[0]["secagg_clients"] == 3 and "secagg_clients" not in plain
    assert "SecAgg+ sum of 3" in format_round_line(recs[0], 1)
    assert "SecAgg+" not in format_round_line(plain, 1)
    assert recs[0]["train_loss"] == pytest.approx(
        read_metrics(tmp_path / "plain")[0]["train_loss"], rel=1e-6
    )  # the clients' metrics travel in the clear


@pytest.mark.integration
def test_feddyn_over_secagg_needs_only_the_sum(tiny, tmp_path):
    """FedDyn's server uses the mean and the number of clients only (Acar et al. Alg. 1):
    under SecAgg+ its model and h equal the plain run's within the quantisation step."""
    cfg = dict(
        federation={"rounds": 1, "clients_per_round": 3},
        client={
            "method": "feddyn",
            "lr": 0.05,
            "local_epochs": 1,
            "batch_size": 32,
            "device": "cpu",
        },
        server={"strategy": "feddyn"},
    )
    plain = run_inprocess(tiny(**cfg), tmp_path / "plain")
    sa = run_inprocess(tiny(**cfg, privacy={"secagg": True}), tmp_path / "sa")
    step = 2 * 8.0 / (1 << 22)
    for a, b in zip(
        plain.weights + [h for h in plain.h if h is not None],
        sa.weights + [h for h in sa.h if h is not None],
    ):
        assert float(np.abs(np.asarray(a, np.float64) - b).max()) <= 2 * step + 1e-6


@pytest.mark.parametrize(
    "sets, words",
    [
        (["client.method=fedccl", "privacy.secagg=true"], ["privacy.secagg", "fedccl", "FINCH"]),
        (
            ["client.method=fedproto", "privacy.dp={noise_multiplier: 1, clipping_norm: 1}"],
            ["privacy.dp", "fedproto"],
        ),
        (
            ["server.strategy=feddyn", "privacy.dp={noise_multiplier: 1, clipping_norm: 1}"],
            ["privacy.dp", "FedDyn"],
        ),
        (
            ["server.weighting=samples", "privacy.dp={noise_multiplier: 1, clipping_norm: 1}"],
            ["privacy.dp", "server.weighting"],
        ),
        (["model.name=lightcnn", "privacy.secagg=true"], ["privacy.secagg", "integer buffers"]),
        (
            ["privacy.secagg=true", "privacy.dp={noise_multiplier: 1, clipping_norm: 1}"],
            ["privacy.dp.mode", "SecAgg+"],
        ),
        (
            [
                "privacy.secagg=true",
                "federation.clients_per_round=1",
                "federation.participation=null",
            ],
            ["privacy.secagg", "at least 2"],
        ),
        (["privacy.dp={noise_multiplier: 1}"], ["privacy.dp.clipping_norm", "required"]),
        (["privacy.dp={noise_multiplier: 1, clipping_norm: 1, delta: 1.5}"], ["privacy.dp.delta"]),
        (["privacy.secagg=true", "privacy.secagg_num_shares=2"], ["secagg", "num_shares"]),
    ],
)
def test_refused_combinations_are_one_line_exit_2(sets, words, tmp_path, capsys):
    args = ["run", str(QUICKSTART), "--out", str(tmp_path / "out")]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words) and str(QUICKSTART) in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_accountant_is_exit_2(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "dp_accounting" else real(name, *a),
    )
    assert (
        main(
            [
                "run",
                str(QUICKSTART),
                "--out",
                str(tmp_path / "o"),
                "--set",
                "privacy.dp={noise_multiplier: 1, clipping_norm: 1}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "fedrcl-flwr[privacy]" in err and len(err.strip().splitlines()) == 1


@pytest.mark.integration
def test_off_by_default_is_the_plain_path(tiny, tmp_path):
    """No privacy section: no wrapper, no accountant, no privacy keys in the records, the
    same numbers as an explicit off."""
    a = run_inprocess(tiny(federation={"rounds": 1}), tmp_path / "a")
    b = run_inprocess(
        tiny(federation={"rounds": 1}, privacy={"dp": None, "secagg": False}), tmp_path / "b"
    )
    assert a.dp is None and not a.secagg
    for x, y in zip(a.weights, b.weights):
        assert np.array_equal(x, y)
    assert not any(k.startswith("dp_") for k in read_metrics(tmp_path / "a")[0])


@pytest.mark.slow
@pytest.mark.flwr
def test_simulation_with_secagg_client_dp_and_trackers(tmp_path, monkeypatch):
    """The real wiring, through ``fedrcl-flwr run`` (Flower's simulation): the ServerApp
    runs SecAgg+ with client-side DP, the ClientApps' mods mask and clip, the ServerApp
    process logs to MLflow (file store) and W&B (offline); nothing is left running. Round 1
    has one reporting client (the two others drop out): SecAgg+ cannot run it, and the
    round is recorded and shown as failed with its reason; round 2 trains. The
    data are CIFAR-10 files in the distributed on-disk format (tests/datasets/test_real_formats.py
    writes them): the real loader runs inside Flower's worker processes."""
    import json
    import os
    import subprocess
    import sys

    store = tmp_path / "mlstore"
    env = dict(
        os.environ,
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        MLFLOW_TRACKING_URI=f"file:{store}",
        WANDB_CACHE_DIR=str(tmp_path / "wbc"),
        WANDB_CONFIG_DIR=str(tmp_path / "wbcfg"),
        WANDB_DATA_DIR=str(tmp_path / "wbd"),
    )
    from helpers import write_cifar10

    write_cifar10(tmp_path / "data", per_class_batch=2, per_class_test=2)
    sets = [
        "dataset={name: cifar10, root: %s, download: false, verify_md5: false}"
        % (tmp_path / "data"),
        "model={name: cnn5}",
        "federation.num_clients=6",
        "federation.clients_per_round=3",
        "federation.participation=null",
        "federation.rounds=2",
        "client.local_epochs=1",
        "evaluation.target_rounds=[2]",
        "privacy.secagg=true",
        "output.tracker=[mlflow, wandb]",
        "privacy.dp={mode: client, noise_multiplier: 0.5, clipping_norm: 0.1}",
        # round 1 samples 0, 1, 2 (0 and 2 drop out); round 2 samples 1, 4, 5
        "federation.availability={dropout: [0.999, 0.0, 0.999, 0.0, 0.0, 0.0]}",
    ]
    args = [
        sys.executable,
        "-m",
        "fedrcl_flwr.cli",
        "run",
        str(QUICKSTART),
        "--out",
        str(tmp_path / "run"),
    ]
    for s in sets:
        args += ["--set", s]
    res = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recs = read_metrics(tmp_path / "run")
    log = (tmp_path / "run" / "run.log").read_text()
    assert "privacy.secagg: Flower's SecAggPlusWorkflow" in log
    assert "DifferentialPrivacyClientSideFixedClipping" in log
    assert [r["round"] for r in recs] == [1, 2]
    assert [(r["num_clients"], r["failures"]) for r in recs] == [(0, 0), (3, 0)], recs
    why = "SecAgg+ needs at least 2 clients, 1 was sent the model"
    assert recs[0]["round_failed"] is True and recs[0]["failure_reason"] == why
    assert f"ROUND FAILED (model unchanged): {why}" in res.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_failed"] == 1
    assert "name: cifar10" in (tmp_path / "run" / "config.yaml").read_text()
    assert recs[0]["dp_epsilon"] == 0 and recs[1]["dp_epsilon"] > 0  # round 1 released nothing
    state = json.loads((tmp_path / "run" / "tracker.json").read_text())
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # reading MLflow 3's file store
    client = MlflowClient(tracking_uri=f"file:{store}")
    hist = client.get_metric_history(state["mlflow"]["run_id"], "accuracy/test")
    assert sorted((m.step, m.value) for m in hist) == [
        (r["round"], r["test_accuracy"]) for r in recs
    ]
    assert client.get_run(state["mlflow"]["run_id"]).info.status == "FINISHED"
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    # every process of this run (its environment names tmp_path: the SuperLink, the
    # simulation, Ray, W&B's service) is gone
    import time

    from fedrcl_flwr.launch.processes import procs_with

    deadline = time.time() + 10
    while procs_with(str(tmp_path)) and time.time() < deadline:
        time.sleep(0.25)
    assert procs_with(str(tmp_path)) == []
