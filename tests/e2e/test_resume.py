"""Real Flower run (marked ``flwr``): a run stopped by Ctrl-C (SIGINT) of the CLI after
round k leaves nothing behind and, resumed with ``--resume``, ends with the same metrics
as an uninterrupted run. (SIGKILL of the CLI, and SIGINT with the other transport:
``tests/e2e/test_process_teardown.py``.)"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import alive, leftover_procs, quickstart_run_args

from fedrcl_flwr.launch.processes import OutputLock, procs_with
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.run.run_files import LOCK_FILE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.flwr

SMALL = [
    "dataset.synthetic.num_train=1200",
    "dataset.synthetic.num_test=300",
    "dataset.synthetic.image_size=16",
    "dataset.synthetic.num_classes=4",
    "federation.num_clients=6",
    "federation.clients_per_round=2",
    "federation.participation=null",
    "client.local_epochs=1",
    "client.lr=0.05",
    "output.checkpoint_every=1",
]


def _args(out, *sets):
    args = quickstart_run_args(out, *SMALL, *sets)
    return args


def _strip(recs):
    drop = ("wall_time_s", "round_time_s")
    return [{k: v for k, v in r.items() if k not in drop} for r in recs]


def test_killed_run_resumes_to_identical_metrics(tmp_path):
    """The run is stopped by SIGINT after round 2 and resumed with ``run --resume``; it
    ends with the metrics of an uninterrupted run of its configuration, computed in-process
    (the same clients and strategy objects driven round by round: what Flower's apps run).
    Also: SuperNodes are execution slots, not clients: the Flower run has the default (one
    per sampled client, 2 for 6 clients), the reference none, the numbers are the same.
    And nothing of the stopped run survives Ctrl-C of the CLI (``interrupted``, exit 130),
    also when the CLI started with SIGINT ignored, as a command started in the background
    of a shell script does (``fedrcl-flwr run ... &``): no process of
    the run (by its private home or a tag every child inherits), the home deleted, the
    output lock free, no summary, nothing trains on; the output path (a quote, a space and
    braces) is handed to Flower without pasting."""
    import torch

    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import load_config

    full, cut = tmp_path / "full", tmp_path / 'cut "q" {x}'
    sets = ["federation.rounds=6", "server.strategy=fedavgm"]
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(
        _args(cut, *sets),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FEDRCL_TEST_TAG": tag},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.time() + 300
    while time.time() < deadline and len(read_metrics(cut)) < 2 and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, "run ended before it could be killed"
    lines = (cut / LOCK_FILE).read_text().splitlines()
    assert len(lines) >= 2 and "fedrcl-flwr-home-" in lines[1], lines
    home = lines[1]
    assert procs_with(home), "the run's processes should be found while it runs"
    proc.send_signal(signal.SIGINT)  # the CLI tears its SuperLink and Ray down
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "fedrcl-flwr: interrupted" in stderr
    done = len(read_metrics(cut))
    assert 2 <= done < 6, done
    assert not (cut / "summary.json").exists()
    left = alive(home, tag, 30.0)
    assert not left, f"left behind after SIGINT: {left}"
    assert not Path(home).exists()
    assert OutputLock.holder(cut) is None  # the lock died with the run
    time.sleep(2)
    assert len(read_metrics(cut)) == done  # nothing trains on
    left = leftover_procs()
    assert not left, f"left processes behind: {left}"

    from fedrcl_flwr.runner import checkpoint_round

    ckpt = checkpoint_round(cut, read_metrics(cut))
    res = subprocess.run(
        [sys.executable, "-m", "fedrcl_flwr.cli", "run", "--resume", str(cut)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # it says from which round it goes on, and prints exactly those rounds
    resumed = f"resuming {cut.resolve()} from its checkpoint at round {ckpt}: rounds {ckpt + 1}..6"
    assert resumed in res.stdout, res.stdout
    printed = [ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("round ")]
    assert printed == [f"{r}/6" for r in range(ckpt + 1, 7)], printed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ClientApp / ServerApp (simulation.num_cpus = 1)
    try:
        run_inprocess(load_config(cut / "config.yaml", [f"output.dir={full}"]), full)
    finally:
        torch.set_num_threads(threads)
    a, b = read_metrics(full), read_metrics(cut)
    assert [r["round"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert _strip(a) == _strip(b)
    assert (
        json.loads((cut / "summary.json").read_text())["final_accuracy"]
        == json.loads((full / "summary.json").read_text())["final_accuracy"]
    )
