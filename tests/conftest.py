"""Shared fixtures: tiny experiment configs on the embedded synthetic data."""

import socket
import time
from pathlib import Path

import pytest

from fedrcl_flwr.config import config_from_dict
from fedrcl_flwr.run.processes import procs_with

ROOT = Path(__file__).resolve().parents[1]

# the test doubles: registered for the test session only, never in the package's registries
TEST_DOUBLES = {"client.method": {"faulty": "clients.faulty:FaultyClient"}}
_ENV_BEFORE: dict = {}


def pytest_configure(config):
    """Register the test doubles (the ``faulty`` client method, ``clients/faulty.py``) in
    this process and, through ``EXTRA_COMPONENTS_ENV``, in every process a test starts
    (``fedrcl-flwr run``, ``flwr run``, SuperNodes, Ray's workers inherit it)."""
    import json
    import os

    from fedrcl_flwr.components import EXTRA_COMPONENTS_ENV

    _ENV_BEFORE["value"] = os.environ.get(EXTRA_COMPONENTS_ENV)
    os.environ[EXTRA_COMPONENTS_ENV] = json.dumps(TEST_DOUBLES)
    from clients import CLIENTS

    for name, target in TEST_DOUBLES["client.method"].items():
        CLIENTS.register(name, target)


def pytest_unconfigure(config):
    import os

    from fedrcl_flwr.components import EXTRA_COMPONENTS_ENV

    if _ENV_BEFORE.get("value") is None:
        os.environ.pop(EXTRA_COMPONENTS_ENV, None)
    else:
        os.environ[EXTRA_COMPONENTS_ENV] = _ENV_BEFORE["value"]


@pytest.fixture(autouse=True, scope="session")
def _dataset_cache_dir(tmp_path_factory):
    """The suite's dataset cache is a temporary directory, never the user's cache (real
    `fedrcl-flwr run` subprocesses inherit the variable)."""
    import os

    from fedrcl_flwr.data.cache import ENV_VAR

    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = str(tmp_path_factory.mktemp("dataset-cache"))
    yield
    if before is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = before


# the synthetic data of tiny_config: tests that need a variant spread it ({**TINY_SYNTHETIC, ...})
TINY_SYNTHETIC = {
    "num_train": 800,
    "num_test": 300,
    "num_classes": 4,
    "image_size": 16,
    "channels": 3,
    "subclusters": 2,
}


def tiny_config(tmp_path=None, **sections):
    """A seconds-sized experiment: 8 clients, 2 per round, 16x16 synthetic images."""
    data = {
        "name": "tiny",
        "seed": 0,
        "dataset": {
            "name": "synthetic",
            "synthetic": dict(TINY_SYNTHETIC),
        },
        "partition": {"scheme": "dirichlet", "alpha": 0.5, "balanced": True},
        "model": {"name": "cnn5"},
        "federation": {
            "num_clients": 8,
            "rounds": 3,
            "participation": None,
            "clients_per_round": 2,
        },
        "client": {
            "method": "fedavg",
            "lr": 0.05,
            "local_epochs": 1,
            "batch_size": 32,
            "device": "cpu",
        },
        "server": {"strategy": "fedavg"},
        "evaluation": {"target_rounds": [2]},
        "output": {"dir": str(tmp_path / "run") if tmp_path else "runs/tiny"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            merged = dict(data[key])
            merged.update(value)
            data[key] = merged
        else:
            data[key] = value
    return config_from_dict(data, "tiny")


def assert_run_refused(tmp_path, capsys, experiment: dict, override: str, message: str):
    """``fedrcl-flwr run`` of ``experiment`` with ``--set override`` exits 2 with one
    line holding ``message`` and the file's path, before writing anything."""
    import yaml

    from fedrcl_flwr.cli import main

    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(experiment))
    assert main(["run", str(exp), "--set", override, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and str(exp) in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"test tried to use the network: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def tiny(tmp_path):
    return lambda **kw: tiny_config(tmp_path, **kw)


_SESSION: dict = {"tmp": None}


@pytest.fixture(autouse=True, scope="session")
def _session_tmpdir(tmp_path_factory):
    """The suite's processes are marked as the runner marks a run's: every run started by
    a test (in process or as a subprocess, which inherits the variable) makes its private
    home with ``tempfile`` under ``$TMPDIR``, so with ``TMPDIR`` set to a directory of this
    session, every process of a run the tests started — the SuperLink, the simulation
    process, Ray's workers and agents (found by their command line or working directory)
    — names ``<session dir>/fedrcl-flwr-home-``, and processes of anyone else's runs on
    the machine never do (:func:`leftover_procs` judges only ours). Ray also keeps its
    session files under ``$TMPDIR/ray``. pytest's own temporary directories are fixed
    first and stay where they were; the directory is removed at the end."""
    import os
    import shutil
    import tempfile

    tmp_path_factory.getbasetemp()
    before = os.environ.get("TMPDIR")
    mine = Path(tempfile.mkdtemp(prefix="fedrcl-tests-"))  # short: Ray's socket paths
    os.environ["TMPDIR"] = str(mine)
    tempfile.tempdir = None  # recomputed from $TMPDIR
    _SESSION["tmp"] = mine
    yield mine
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None
    shutil.rmtree(mine, ignore_errors=True)


def run_marker() -> str:
    """What every process of a run started by this test session has in its environment,
    command line or working directory (see :func:`_session_tmpdir`)."""
    assert _SESSION["tmp"] is not None, "the session fixture has not run"
    return f"{_SESSION['tmp']}/fedrcl-flwr-home-"


def leftover_procs(grace: float = 10.0) -> dict[int, str]:
    """Processes of the runs this test session started still alive ``grace`` seconds
    after the run returned (a SIGKILLed Ray worker takes a moment to vanish); another
    user's or session's runs on the same machine are never counted. Maps PID to its
    command line, for the assertion message."""
    marker = run_marker()
    deadline = time.time() + grace
    while True:
        left = set(procs_with(marker))
        if not left or time.time() > deadline:
            break
        time.sleep(0.25)
    out = {}
    for pid in sorted(left):
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            continue
    return out


# ------------------------------------------------------------- strategies in process
# (tests/test_fedavg_strategy.py, tests/test_privacy.py: a strategy driven round by round
# without Flower's server loop)


class FakeProxy:
    """A client proxy as a strategy sees it: only its id."""

    def __init__(self, cid):
        self.cid = cid


class FakeManager:
    """A client manager with ``n`` connected proxies (ids ``"0"`` .. ``"n-1"``)."""

    def __init__(self, n):
        self.proxies = {str(i): FakeProxy(str(i)) for i in range(n)}

    def wait_for(self, num, timeout=0):
        return len(self.proxies) >= num

    def all(self):
        return self.proxies


def fitres(arrays, n, pid, loss=1.0):
    """A successful FitRes of partition ``pid`` with ``n`` examples."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    return FitRes(
        Status(Code.OK, ""),
        ndarrays_to_parameters(arrays),
        n,
        {"partition_id": pid, "train_loss": loss},
    )


def make_strategy(weights, **kw):
    """The registered strategy ``kw["name"]`` (default fedavg): 10 clients, 3 per round,
    2 rounds, seed 0, every entry trainable; other keywords override."""
    from strategies import strategy_class

    cls = strategy_class(kw.pop("name", "fedavg"))
    args = dict(
        initial_weights=weights,
        trainable=[True] * len(weights),
        num_clients=10,
        clients_per_round=3,
        rounds=2,
        seed=0,
    )
    args.update(kw)
    return cls(**args)


def quickstart_run_args(out, *sets) -> list[str]:
    """``python -m fedrcl_flwr.cli run experiments/quickstart.yaml --out OUT`` with a
    ``--set`` per item of ``sets``: the command line of the real-run tests."""
    import sys

    args = [
        sys.executable,
        "-m",
        "fedrcl_flwr.cli",
        "run",
        str(Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"),
        "--out",
        str(out),
    ]
    for item in sets:
        args += ["--set", item]
    return args
