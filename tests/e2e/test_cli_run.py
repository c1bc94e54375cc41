"""Real Flower runs through the CLI (each ~30 s of start-up): wiring, files, exit codes,
the same numbers with weights by reference and inside Flower's messages, and
no SuperLink / simulation / Ray process left behind."""

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import leftover_procs, quickstart_run_args

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.flwr

SMALL = [
    "dataset.synthetic.num_train=2000",
    "dataset.synthetic.num_test=500",
    "federation.num_clients=10",
    "federation.clients_per_round=3",
    "federation.participation=null",
    "client.local_epochs=2",
    "client.lr=0.1",
    "dataset.synthetic.image_size=16",
    "dataset.synthetic.noise=0.3",
    "dataset.synthetic.class_weight=3.0",
    "dataset.synthetic.distractor_strength=0.2",
    "evaluation.target_rounds=[2,4]",
]


def _run(tmp_path, *sets, rounds=4, env=None):
    args = quickstart_run_args(tmp_path / "run", *SMALL, f"federation.rounds={rounds}", *sets)
    return subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)


# every Python process that starts with this directory on its path (the CLI, the
# SuperLink, the simulation process, each Ray worker) loses the synthetic generator
NO_GENERATOR = """
import fedrcl_flwr.data.sources.synthetic as _s

def _refuse(*a, **kw):
    raise RuntimeError("the synthetic generator ran in a run's process")

_s.make_synthetic = _refuse
"""


# the wiring of the research features through Flower's runtime: per-client evaluation of
# every client (Flower's federated evaluation, records completed after
# ``aggregate_evaluate``) and the availability records (stragglers, none late)
RESEARCH = [
    "evaluation.per_client={every: 2, clients: all}",
    "federation.availability.stragglers={speed: 1.0, deadline: 2.0}",
]


def _env_without_generator(tmp_path):
    """The dataset prepared in the cache, and an environment in which every process loses
    the synthetic generator (the CLI checks the entry, the ServerApp and Ray workers
    memory-map it)."""
    import os

    from fedrcl_flwr.launch.preflight import load_experiment
    from fedrcl_flwr.run.runtime import prepare_dataset

    cfg = load_experiment(
        str(ROOT / "experiments" / "quickstart.yaml"), [*SMALL, "federation.rounds=4"], None
    )
    prepare_dataset(cfg)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(NO_GENERATOR)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_cli_runs_fedavg_end_to_end(tmp_path):
    """Also: no process of the run generates the dataset, and the research features'
    records come through Flower's runtime (:data:`RESEARCH`)."""
    env = _env_without_generator(tmp_path)
    res = _run(tmp_path, *RESEARCH, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    # the hook was active: a dataset not prepared yet fails in the CLI, before Flower
    (tmp_path / "b").mkdir()
    other = _run(tmp_path / "b", "dataset.synthetic.num_train=2001", env=env)
    assert other.returncode == 1 and "generator ran" in other.stderr, other.stderr
    run = tmp_path / "run"
    for f in [
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "model.pt",
        "accuracy.png",
        "run.log",
        "flower.log",
    ]:
        assert (run / f).exists(), f
    # the README's quickstart list names every file a run leaves; the lock file is gone
    # once the run has completed
    assert not (run / ".fedrcl-flwr.lock").exists()
    readme = (ROOT / "README.md").read_text()
    start = readme.index("writes to `runs/quickstart/`:") + len("writes to `runs/quickstart/`:")
    listed = set(re.findall(r"`([^`]+)`", readme[start : readme.index("\n\n", start)]))
    assert {p.name for p in run.iterdir()} <= listed, listed
    assert ".fedrcl-flwr.lock" in listed
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2, 3, 4]
    for r in recs:
        for k in [
            "test_accuracy",
            "test_loss",
            "ema_accuracy",
            "train_loss",
            "num_clients",
            "wall_time_s",
        ]:
            assert k in r, k
        assert r["num_clients"] == 3
        assert r["dropped"] == r["late"] == 0 and r["sim_round_time"] == 1.0
    client = [r for r in recs if "client_acc_mean" in r]
    assert [r["round"] for r in client] == [2, 4]
    assert all(
        r["client_acc_n"] == 10
        and sorted(r["client_accuracy"], key=int) == [str(i) for i in range(10)]
        for r in client
    )
    s = json.loads((run / "summary.json").read_text())
    assert s["client_acc_worst10"] == client[-1]["client_acc_worst10"]
    assert s["method"] == "fedavg" and s["strategy"] == "fedavg" and s["rounds"] == 4
    assert 0.0 <= s["final_accuracy"] <= 1.0
    assert s["best_accuracy"] > 0.15, s  # chance is 0.1; learning speed is asserted in-process
    assert set(s["accuracy_at"]) == {"2", "4"}
    # one progress line per round on stdout
    assert sum(line.startswith("round ") for line in res.stdout.splitlines()) == 4
    # the start-up phases as they happen, before round 1; an ETA from round 2
    lines = res.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("round "))
    phases = " / ".join(ln for ln in lines[:first] if ln.startswith("fedrcl-flwr: ["))
    for phase in ("SuperLink up", "submitted", "ServerApp's process is up", "ServerApp built"):
        assert phase in phases, phases
    rounds = [ln for ln in lines if ln.startswith("round ")]
    assert "ETA" not in rounds[0] and "ETA" not in rounds[3]  # none yet / nothing left
    assert all(re.search(r" \| ETA \d+(s|m\d\ds)$", ln) for ln in rounds[1:3]), rounds
    # flower.log without the CLI's status polling, everything else kept
    flog = (run / "flower.log").read_text()
    assert "ControlServicer.ListRuns" not in flog and "/v1/control/list-runs" not in flog
    assert "lines of the CLI's run-status polling (ListRuns) left out" in flog
    assert "fedrcl-flwr timing:" in flog
    # the run carried the weights by reference (simulation.transport's default)
    store = re.search(
        r"weights travel by reference through (\S+) \(10 slots of [0-9.]+ MiB in one file\)",
        (run / "run.log").read_text(),
    )  # 4 for the server's sends, 2 x 3 for the uploads (3 clients per round)
    assert store and store[1].startswith("/dev/shm/fedrcl-flwr-store-"), store
    # the simulation engine's look-up was replaced before its thread started, and each
    # actor was given its next message while it ran one
    log = (run / "run.log").read_text()
    assert "engine picks up messages when the ServerApp sends them" in log
    assert re.search(r"each of the \d+ Ray actors holds its next message while it runs one", log)
    assert not Path(store[1]).exists()  # removed with the run
    left = leftover_procs()
    assert not left, f"left processes behind: {left}"


@pytest.mark.slow
def test_weights_inside_flowers_messages_give_the_same_run(tmp_path):
    """The run of the test above carries the weights by reference (``simulation.transport``'s
    default); the same run inside Flower's messages gives the same numbers and model. (In
    process, for every method and server rule: ``tests/app/test_weight_transport.py``.)"""
    env = _env_without_generator(tmp_path)
    res = _run(tmp_path, *RESEARCH, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    run = tmp_path / "run"
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (tmp_path / "f").mkdir()
    flower = _run(tmp_path / "f", *RESEARCH, "simulation.transport=flower", env=env)
    assert flower.returncode == 0, flower.stdout + flower.stderr
    frun = tmp_path / "f" / "run"
    assert (
        "inside Flower's messages: simulation.transport: flower" in (frun / "run.log").read_text()
    )
    timing = ("wall_time_s", "round_time_s")
    same = [{k: v for k, v in r.items() if k not in timing} for r in recs]
    frecs = [json.loads(line) for line in (frun / "metrics.jsonl").read_text().splitlines()]
    assert same == [{k: v for k, v in r.items() if k not in timing} for r in frecs]
    import torch

    ma, mb = torch.load(run / "model.pt"), torch.load(frun / "model.pt")
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    left = leftover_procs()
    assert not left, f"left processes behind: {left}"
