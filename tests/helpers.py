"""The suite's one shared harness (imported as ``helpers``: ``tests/`` is on ``sys.path``
through its conftest): tiny experiment configs, the real-run command line and the
leftover-process checks, a strategy driven in process (fake client proxies and manager,
fit results), and writers of tiny files in real dataset formats. Test files import from
here, never from each other; fixtures and hooks stay in ``tests/conftest.py``."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np

from fedrcl_flwr.config import config_from_dict
from fedrcl_flwr.launch.processes import procs_with

ROOT = Path(__file__).resolve().parents[1]

# the test doubles: registered for the test session only (tests/conftest.py), never in the
# package's registries
TEST_DOUBLES = {"client.method": {"faulty": "clients.faulty:FaultyClient"}}

# the directory of this session's runs' private homes (set by conftest's _session_tmpdir)
SESSION: dict = {"tmp": None}

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)  # the marked pixels of images()

# the synthetic data of tiny_config: tests that need a variant spread it ({**TINY_SYNTHETIC, ...})
TINY_SYNTHETIC = {
    "num_train": 800,
    "num_test": 300,
    "num_classes": 4,
    "image_size": 16,
    "channels": 3,
    "subclusters": 2,
}


def tiny_experiment(tmp_path=None, **sections) -> dict:
    """A seconds-sized experiment as YAML data: 8 clients, 2 per round, 16x16 synthetic
    images; each given section updates the default one key by key."""
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
    return data


def tiny_config(tmp_path=None, **sections):
    """:func:`tiny_experiment`, loaded and checked."""
    return config_from_dict(tiny_experiment(tmp_path, **sections), "tiny")


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


# the experiment of the in-process CLI tests (bad inputs, output safety): 4 clients, 2 rounds
TINY = {
    "name": "tiny",
    "seed": 0,
    "dataset": {
        "name": "synthetic",
        "synthetic": {"num_train": 400, "num_test": 100, "num_classes": 4, "image_size": 16},
    },
    "partition": {"scheme": "iid"},
    "model": {"name": "cnn5"},
    "federation": {"num_clients": 4, "rounds": 2, "participation": None, "clients_per_round": 2},
    "client": {"method": "fedavg", "local_epochs": 1, "batch_size": 32, "device": "cpu"},
    "output": {"checkpoint_every": 1},
}


# ---------------------------------------------------------------- processes of a run


def run_marker() -> str:
    """What every process of a run started by this test session has in its environment,
    command line or working directory (see ``_session_tmpdir`` in ``tests/conftest.py``)."""
    assert SESSION["tmp"] is not None, "the session fixture has not run"
    return f"{SESSION['tmp']}/fedrcl-flwr-home-"


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
# (a strategy driven round by round without Flower's server loop)


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


def fit_result(arrays, pid=0, n=10, metrics=None):
    """``(proxy, FitRes)`` as ``aggregate_fit`` receives it: partition ``pid``'s ``arrays``
    on ``n`` examples, training loss 0.5 (``metrics`` replaces the metrics)."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    if metrics is None:
        metrics = {"partition_id": pid, "train_loss": 0.5}
    return FakeProxy(str(pid)), FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics
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


def alive(home: str, tag: str, grace: float) -> dict[int, str]:
    """Processes of the run still alive after up to ``grace`` seconds."""
    deadline = time.time() + grace
    while True:
        left = set(procs_with(home)) | set(procs_with(f"FEDRCL_TEST_TAG={tag}"))
        if not left or time.time() > deadline:
            break
        time.sleep(0.5)
    out = {}
    for pid in sorted(left):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            out[pid] = cmd.decode()[:160]
        except OSError:
            continue
    return out


# ------------------------------------------------------- tiny files in real formats


def images(n: int, size: int, channels: int, seed: int) -> np.ndarray:
    """Random uint8 (n, size, size, channels); in colour images pixel (0, 3) of every
    image is red, (3, 0) green and (1, 1) blue (asymmetric: a transposed image fails)."""
    x = np.random.default_rng(seed).integers(0, 256, (n, size, size, channels), np.uint8)
    if channels == 3:
        x[:, 0, 3], x[:, 3, 0], x[:, 1, 1] = RED, GREEN, BLUE
    return x


def cifar_rows(x: np.ndarray) -> np.ndarray:
    """The CIFAR row layout: 1024 red, 1024 green, 1024 blue values, each row-major."""
    return x.transpose(0, 3, 1, 2).reshape(len(x), 3072)


def write_pickle(path: Path, obj) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_cifar10(root: Path, per_class_batch: int = 1, per_class_test: int = 2, seed=0):
    """cifar-10-batches-py/data_batch_1..5, test_batch, batches.meta (as distributed)."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    xs, ys = [], []
    for b in range(1, 6):
        y = np.tile(np.arange(10), per_class_batch)
        x = images(len(y), 32, 3, seed + b)
        write_pickle(
            d / f"data_batch_{b}",
            {
                "batch_label": f"training batch {b} of 5",
                "labels": y.tolist(),
                "data": cifar_rows(x),
                "filenames": [f"img_{b}_{i}.png" for i in range(len(y))],
            },
        )
        xs.append(x)
        ys.append(y)
    yt = np.repeat(np.arange(10), per_class_test)
    xt = images(len(yt), 32, 3, seed + 99)
    write_pickle(
        d / "test_batch",
        {
            "batch_label": "testing batch 1 of 1",
            "labels": yt.tolist(),
            "data": cifar_rows(xt),
            "filenames": [f"t{i}.png" for i in range(len(yt))],
        },
    )
    write_pickle(
        d / "batches.meta",
        {
            "num_cases_per_batch": len(xs[0]),
            "num_vis": 3072,
            "label_names": [f"class{k}" for k in range(10)],
        },
    )
    return np.concatenate(xs), np.concatenate(ys), xt, yt


def write_saved_dataset_dict(path: Path) -> list[Path]:
    """The layout ``DatasetDict({"train": ..., "test": ...}).save_to_disk(path)`` writes
    (``datasets`` 2.x - 4.x): ``dataset_dict.json`` and per split ``state.json`` naming
    one data file, ``dataset_info.json`` with a ``ClassLabel`` of 4 classes, and that
    data file (a stand-in: what is checked before a dataset is read or fingerprinted,
    not a readable dataset). Returns the files, every mtime set to 10**18 ns."""
    import json
    import os

    path.mkdir(parents=True)
    (path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    files = [path / "dataset_dict.json"]
    for split in ("train", "test"):
        (path / split).mkdir()
        state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}
        info = {"features": {"label": {"names": ["0", "1", "2", "3"], "_type": "ClassLabel"}}}
        (path / split / "state.json").write_text(json.dumps(state))
        (path / split / "dataset_info.json").write_text(json.dumps(info))
        (path / split / "data-00000-of-00001.arrow").write_bytes(b"arrow")
        files += [path / split / n for n in ("state.json", "dataset_info.json")]
        files.append(path / split / "data-00000-of-00001.arrow")
    for f in files:
        os.utime(f, ns=(10**18, 10**18))
    return files


def stop_process_groups(procs, timeout: float) -> None:
    """SIGTERM the process group of each ``Popen`` a test started (``start_new_session``),
    wait up to ``timeout`` s for each, then SIGKILL its group."""
    import os
    import signal
    import subprocess

    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
