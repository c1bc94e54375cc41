"""Experiment trackers (output.tracker), offline: W&B's offline mode and MLflow's file
store, no network. Each is read back (W&B: its own transaction log; MLflow: its client)
and compared with metrics.jsonl and summary.json; a resumed run continues the same
tracker runs with each round once; a sweep groups its runs; a missing extra, an unknown
tracker or W&B online without a key is one line, exit 2."""

import importlib.util
import json
import socket
import struct
from pathlib import Path

import pytest

from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.cli import main
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.tracking.mlflow_backend import mlflow_key, prepare_sweep_group
from fedrcl_flwr.tracking.records import flat_params, scalars, summary_scalars
from fedrcl_flwr.tracking.run_tracker import STATE_FILE

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"


@pytest.fixture
def no_internet(monkeypatch):
    """No connection leaves this machine: IP sockets fail the test; Unix sockets (W&B's
    local service, a process of this test) are allowed."""
    real = socket.socket.connect

    def connect(sock, address):
        if sock.family == socket.AF_UNIX:
            return real(sock, address)
        raise AssertionError(f"test tried to use the network: {address!r}")

    def refuse(*args, **kwargs):
        raise AssertionError(f"test tried to use the network: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def offline(tmp_path, monkeypatch, no_internet):
    """W&B offline, MLflow file store, W&B's own caches in the test's directory."""
    store = tmp_path / "mlstore"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{store}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return store


def wandb_records(run_dir: Path) -> list:
    """Every record of the run's W&B offline transaction logs (``run-<id>.wandb``:
    LevelDB log format with W&B's 7-byte header, protobuf ``Record`` payloads), in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B"
        pos, block, buf = 7, 32768, b""
        while pos + 7 <= len(data):
            left = block - pos % block
            if left < 7:  # block trailer
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            chunk = data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind == 0:
                continue
            buf = chunk if kind in (1, 2) else buf + chunk
            if kind in (1, 4):  # full / last fragment
                rec = pb.Record()
                rec.ParseFromString(buf)
                out.append(rec)
    return out


def _item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def wandb_history(run_dir: Path) -> dict:
    """``{step: {key: value}}`` of the logged rounds."""
    hist = {}
    for rec in wandb_records(run_dir):
        if rec.WhichOneof("record_type") == "history":
            row = {_item_key(i): json.loads(i.value_json) for i in rec.history.item}
            step = row.pop("_step")
            assert step not in hist, f"step {step} logged twice"
            hist[step] = {k: v for k, v in row.items() if not k.startswith("_")}
    return hist


def wandb_summary(run_dir: Path) -> dict:
    out = {}
    for rec in wandb_records(run_dir):
        if rec.WhichOneof("record_type") == "summary":
            for i in rec.summary.update:
                out[_item_key(i)] = json.loads(i.value_json)
    return out


def wandb_run(run_dir: Path):
    return next(r.run for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "run")


def mlflow_run(store: Path, run_dir: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{store}")
    run_id = json.loads((run_dir / STATE_FILE).read_text())["mlflow"]["run_id"]
    return client, client.get_run(run_id)


def _check_rounds(recs, wb_hist, client, run):
    for rec in recs:
        want = scalars(rec)
        assert want, rec
        got = wb_hist[rec["round"]]
        assert set(got) == set(want), (sorted(got), sorted(want))
        for tag, value in want.items():
            assert got[tag] == pytest.approx(value, rel=1e-12), tag
            hist = client.get_metric_history(run.info.run_id, mlflow_key(tag))
            by_step = {m.step: m.value for m in hist}
            assert len(by_step) == len(hist), f"{tag}: a step logged twice"
            assert by_step[rec["round"]] == pytest.approx(value, rel=1e-12), tag
    assert sorted(wb_hist) == [r["round"] for r in recs]


def test_every_tracker_holds_metrics_jsonl_across_a_resume(tiny, tmp_path, offline):
    """Killed after round 3 with a checkpoint at 2: W&B and MLflow got rounds 1-2 only
    (round 3 is recomputed on resume), TensorBoard all three (it purges on resume); the
    resumed run continues the same tracker runs and each holds exactly metrics.jsonl."""
    run_dir = tmp_path / "run"
    cfg = tiny(
        federation={"rounds": 4},
        evaluation={"target_rounds": [2]},
        output={
            "dir": str(run_dir),
            "tracker": ["tensorboard", "wandb", "mlflow"],
            "tracker_project": "proj",
            "checkpoint_every": 2,
        },
    )
    run_inprocess(cfg, run_dir, stop_after=3)
    assert sorted(wandb_history(run_dir)) == [1, 2]
    state = json.loads((run_dir / STATE_FILE).read_text())
    assert state["wandb"]["last_round"] == 2 and state["mlflow"]["last_round"] == 2
    run_inprocess(cfg, run_dir, resume=True)
    recs = read_metrics(run_dir)
    assert [r["round"] for r in recs] == [1, 2, 3, 4]
    assert wandb_run(run_dir).run_id == state["wandb"]["id"]
    summary = json.loads((run_dir / "summary.json").read_text())
    client, run = mlflow_run(offline, run_dir)
    # per round: the same numbers under the same names, each round once
    _check_rounds(recs, wandb_history(run_dir), client, run)
    # the resolved config as run parameters
    flat = flat_params(json.loads(json.dumps(_asdict(cfg))))
    params = run.data.params
    assert params["client.method"] == "fedavg" and params["client.lr"] == "0.05"
    assert params["federation.clients_per_round"] == "2"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert set(params) == {mlflow_key(k) for k in flat}
    wb_run = wandb_run(run_dir)
    assert wb_run.project == "proj" and wb_run.display_name == "run"
    wb_cfg = {i.key: json.loads(i.value_json) for i in wb_run.config.update}
    assert wb_cfg["client"]["method"] == "fedavg" and wb_cfg["federation"]["rounds"] == 4
    # summary.json values and the plots
    want = summary_scalars(summary)
    assert want["summary/final_accuracy"] == summary["final_accuracy"]
    assert "summary/accuracy_at/2" in want
    wb_sum = wandb_summary(run_dir)
    for key, value in want.items():
        assert wb_sum[key] == pytest.approx(value), key
        assert run.data.metrics[mlflow_key(key)] == pytest.approx(value), key
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "summary.json", "plots"} <= arts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "plots")] == [
        "plots/accuracy.png"
    ]
    assert run.info.status == "FINISHED"
    files = [
        f.path
        for rec in wandb_records(run_dir)
        if rec.WhichOneof("record_type") == "files"
        for f in rec.files.files
    ]
    assert "accuracy.png" in files
    # TensorBoard: the same tags
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    for rec in recs:
        for tag, value in scalars(rec).items():
            assert {e.step: e.value for e in acc.Scalars(tag)}[rec["round"]] == pytest.approx(
                value, rel=1e-6
            )


def _asdict(cfg):
    import dataclasses

    return dataclasses.asdict(cfg)


def test_sweep_groups_its_runs(tiny, tmp_path, offline):
    """A sweep's runs: W&B group = the sweep's name; MLflow children of one parent run."""
    from fedrcl_flwr.launch.sweep_spec import plan_sweep

    base = tmp_path / "base.yaml"
    base.write_text(QUICKSTART.read_text())
    sweep = tmp_path / "grp.yaml"
    sweep.write_text(
        f"base: {base}\nseeds: [0, 1]\nset: {{output.tracker: [wandb, mlflow], "
        "federation.rounds: 1}\n"
    )
    runs, out = plan_sweep(sweep, tmp_path / "out", check_components=False)
    assert {r.cfg.output.tracker_group for r in runs} == {"grp"}
    assert prepare_sweep_group([r.cfg for r in runs], out) == {}  # URI set by the fixture
    for r in runs:
        cfg = tiny(
            seed=r.cfg.seed,
            federation={"rounds": 1},
            output={"dir": str(r.out_dir), "tracker": ["wandb", "mlflow"], "tracker_group": "grp"},
        )
        run_inprocess(cfg, r.out_dir)
    parents = set()
    for r in runs:
        assert wandb_run(r.out_dir).run_group == "grp"
        _, run = mlflow_run(offline, r.out_dir)
        parents.add(run.data.tags["mlflow.parentRunId"])
    client, _ = mlflow_run(offline, runs[0].out_dir)
    (parent,) = parents
    assert client.get_run(parent).data.tags["fedrcl_flwr.sweep"] == "grp"


def test_sweep_without_uri_keeps_mlflow_in_its_directory(tmp_path, monkeypatch, tiny):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tiny(output={"tracker": ["mlflow"], "tracker_group": "g"})
    env = prepare_sweep_group([cfg], tmp_path / "sweep")
    assert env == {"MLFLOW_TRACKING_URI": f"file:{(tmp_path / 'sweep').resolve()}/mlruns"}
    assert any((tmp_path / "sweep" / "mlruns").iterdir())


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "output.tracker=[wandb]"], ["output.tracker", "wandb", "pip install"]),
        (["--set", "output.tracker=[neptune]"], ["output.tracker", "neptune"]),
        (["--set", "output.tracker=[mlflow, mlflow]"], ["output.tracker", "twice"]),
    ],
)
def test_bad_tracker_is_one_line_exit_2(args, words, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    assert main(["run", str(QUICKSTART), *args, "--out", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words) and str(QUICKSTART) in err, err
    assert len(err.strip().splitlines()) == 1


def test_wandb_online_without_a_key_is_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert (
        main(
            [
                "run",
                str(QUICKSTART),
                "--set",
                "output.tracker=[wandb]",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "WANDB_MODE=offline" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
