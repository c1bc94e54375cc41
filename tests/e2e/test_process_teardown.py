"""Real Flower processes (marked ``flwr``; tiny synthetic runs): nothing of a run survives
SIGKILL of the CLI, its weight store in ``/dev/shm`` included; when the CLI and its
watchdog are both killed, the next run removes what they left; Ctrl-C (SIGINT) stops a
run with either transport as SIGTERM does (``shared``: the stopped run of
``tests/e2e/test_resume.py``; SIGTERM: the killed sweep of ``tests/run/test_sweep.py``);
a run stuck before starting times out cleanly.
(A real run where no client ever trained, exit 1 with the first client error: run ``d`` of
``tests/run/test_sweep.py``'s real sweep; SecAgg+ rounds that all fail, through Flower's
workflow and the real ClientApp in process: ``tests/strategies/test_failed_rounds.py``.)

"Of the run" is checked broadly: any process whose environment, command line or working
directory names the run's private home (read from the output directory's lock file), or
whose environment carries a tag this test put on the CLI (every child inherits it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from helpers import alive, quickstart_run_args

from fedrcl_flwr.launch.processes import OutputLock, procs_with, reap_stale_runs
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.run.run_files import LOCK_FILE
from fedrcl_flwr.weights.lifecycle import stores_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.flwr

SMALL = [
    "dataset.synthetic.num_train=600",
    "dataset.synthetic.num_test=200",
    "dataset.synthetic.image_size=16",
    "dataset.synthetic.num_classes=4",
    "federation.num_clients=4",
    "federation.clients_per_round=2",
    "federation.participation=null",
    "client.local_epochs=1",
    "simulation.num_supernodes=2",
    "output.checkpoint_every=0",
]


def _start(out: Path, *sets, tag: str, tmpdir: str | None = None):
    args = quickstart_run_args(out, *SMALL, *sets)
    env = {**os.environ, "FEDRCL_TEST_TAG": tag}
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _home(out: Path) -> str:
    lines = (out / LOCK_FILE).read_text().splitlines()
    assert len(lines) >= 2 and "fedrcl-flwr-home-" in lines[1], lines
    return lines[1]


def _wait_for_round(proc, out: Path, n: int, timeout: float = 240.0):
    deadline = time.time() + timeout
    while time.time() < deadline and len(read_metrics(out)) < n and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    assert len(read_metrics(out)) >= n


# SIGTERM of the CLI: the killed sweep of tests/run/test_sweep.py; SIGINT: the stopped run
# of tests/e2e/test_resume.py and the test below
@pytest.mark.slow
@pytest.mark.parametrize("sig,grace", [(signal.SIGKILL, 40.0)])
def test_nothing_of_the_run_survives_the_cli(tmp_path, sig, grace):
    # a quote, a space and braces in the output path: handed to Flower without pasting
    out = tmp_path / 'run "q" {x}'
    tag = uuid.uuid4().hex
    # the run's home in /tmp (the suite's $TMPDIR is too long a path for Ray's sockets):
    # Ray's session files then live in the home and go with it (found by the tag)
    proc = _start(out, "federation.rounds=500", tag=tag, tmpdir="/tmp")
    try:
        _wait_for_round(proc, out, 1)  # round 2 is being trained now
        home = _home(out)
        assert home.startswith("/tmp/fedrcl-flwr-home-"), home
        assert procs_with(home), "the run's processes should be found while it runs"
        sessions = list((Path(home) / "ray").glob("session_*/sockets"))
        assert sessions, f"Ray's session directory is not in the run's home {home}"
        assert (
            f"Ray's session files: {home}/ray (removed with the run)"
            in (out / "flower.log").read_text()
        )
        # the run's weight store (simulation.transport: shared) is in use
        (store,) = stores_of(home)
        assert store.is_dir(), f"no weight store {store} while the run trains"
        proc.send_signal(sig)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if sig == signal.SIGTERM else -signal.SIGKILL)
    left = alive(home, tag, grace)
    assert not left, f"left behind after {sig!r}: {left}"
    assert not Path(home).exists()
    assert not store.exists(), f"the weight store {store} outlived the run"
    assert OutputLock.holder(out) is None  # the lock died with the run
    assert not (out / "summary.json").exists()
    done = len(read_metrics(out))
    time.sleep(2)
    assert len(read_metrics(out)) == done < 500  # nothing trains on


# SIGINT with the other transport (``shared``): the stopped run of tests/e2e/test_resume.py
@pytest.mark.slow
@pytest.mark.parametrize("transport", ["flower"])
def test_ctrl_c_stops_a_run_as_sigterm_does(tmp_path, transport):
    """SIGINT to the CLI during round 2 stops the run with ``interrupted``, exit 130, and
    nothing of it left running, with either transport; also when the CLI started with
    SIGINT ignored, as a command started in the background of a shell script does
    (``fedrcl-flwr run ... &``): SIGINT used to be ignored then, and the run finished."""
    out = tmp_path / "run"
    tag = uuid.uuid4().hex
    args = quickstart_run_args(
        out, *SMALL, "federation.rounds=500", f"simulation.transport={transport}"
    )
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FEDRCL_TEST_TAG": tag},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        _wait_for_round(proc, out, 1)
        home = _home(out)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "fedrcl-flwr: interrupted" in stderr
    assert not alive(home, tag, 40.0)
    assert not (out / "summary.json").exists() and len(read_metrics(out)) < 500


def _watchdog(home: str) -> int:
    (pid,) = [
        p
        for p in procs_with(home)
        if b"fedrcl_flwr.launch.processes\0watch" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    return pid


@pytest.mark.slow
def test_a_run_whose_cli_and_watchdog_were_killed_is_reaped_by_the_next(tmp_path):
    """``kill -9`` of the CLI and of its watchdog (an OOM kill, a broad ``pkill``) leaves
    the run's processes, its private home and its weight store: the next run or sweep
    removes them first (``reap_stale_runs``, what ``run`` calls before it makes its own
    home), because the home's owner record names two processes that are gone."""
    out = tmp_path / "run"
    tag = uuid.uuid4().hex
    proc = _start(out, "federation.rounds=500", tag=tag, tmpdir="/tmp")
    try:
        _wait_for_round(proc, out, 1)
        home = _home(out)
        (store,) = stores_of(home)
        watchdog = _watchdog(home)
        os.kill(watchdog, signal.SIGKILL)
        proc.kill()
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(3)
    left = procs_with(f"FEDRCL_TEST_TAG={tag}")
    assert left and Path(home).is_dir() and store.is_dir()  # what the two killed left
    reaped = reap_stale_runs(Path(home).parent)
    assert Path(home) in reaped
    assert not alive(home, tag, 30.0)
    assert not Path(home).exists() and not store.exists()


def test_run_that_never_starts_times_out_cleanly(tmp_path, monkeypatch):
    """Flower issue #7953: a run that stays 'pending'. Flower cannot be made to hang on
    purpose, so the status query is made to answer 'pending' for this real run."""
    import fedrcl_flwr.runner as runner
    from fedrcl_flwr.config import apply_overrides, config_from_dict, dump_config, read_yaml
    from fedrcl_flwr.errors import RunFailed
    from fedrcl_flwr.launch.superlink import LocalSuperLink

    out = tmp_path / "run"
    out.mkdir()
    data = apply_overrides(
        read_yaml(ROOT / "experiments" / "quickstart.yaml"),
        [*SMALL, "federation.rounds=2", "simulation.startup_timeout_s=3"],
    )
    cfg = config_from_dict(data)
    dump_config(cfg, out / "config.yaml")
    homes = []
    real_start = LocalSuperLink.start

    def start(self, *a, **kw):
        homes.append(str(self.home))
        return real_start(self, *a, **kw)

    monkeypatch.setattr(LocalSuperLink, "start", start)
    from fedrcl_flwr.app import control

    monkeypatch.setattr(control.ControlClient, "status", lambda self, run_id: "pending")
    with pytest.raises(RunFailed) as ei:
        runner.run_simulation_via_flower(cfg, out, status_every_s=0.5)
    msg = str(ei.value)
    assert "\n" not in msg and "did not start: still 'pending'" in msg
    assert "startup_timeout_s=3" in msg
    assert not alive(homes[0], uuid.uuid4().hex, 30.0)
    assert not Path(homes[0]).exists()
