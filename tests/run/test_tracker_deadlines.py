"""Every call to a tracker has a deadline (``output.tracker_timeout_s``). A
tracker server that accepts the connection and never answers (a local TCP server on the
loopback, started by the test, that stops itself) is dropped with one line and the run goes
on (the run's tracker writer, in process), W&B leaving no
``wandb-core`` process of this test behind. W&B keeps its files under the run directory,
nothing in ``HOME``."""

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest

from fedrcl_flwr.config import dump_config
from fedrcl_flwr.tracking.backend import Backend
from fedrcl_flwr.tracking.deadlines import call_with_deadline
from fedrcl_flwr.tracking.run_tracker import RunTracker, open_tracker


@contextlib.contextmanager
def silent_server(lifetime_s: float = 60.0):
    """A loopback TCP server that accepts every connection and never answers; it closes
    everything after ``lifetime_s`` or when the block ends. Yields its port."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    stop = threading.Event()
    held: list = []

    def serve():
        deadline = time.monotonic() + lifetime_s
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = srv.accept()
                held.append(conn)  # keep it open, say nothing
            except OSError:
                continue
        for c in held:
            c.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(5)


def _children() -> set[int]:
    """PIDs of this process's children."""
    import os

    me, out = str(os.getpid()), set()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                out.add(int(d.name))
        except (OSError, IndexError):
            continue
    return out


def test_a_call_past_its_deadline_drops_only_that_tracker(tmp_path, capsys):
    class Hangs(Backend):
        name = "mlflow"

        def __init__(self):
            self.release = threading.Event()

        def log_round(self, step, values):
            self.release.wait(30)

    class Works(Backend):
        name = "tensorboard"
        rewrites_after_resume = True

        def __init__(self):
            self.steps = []

        def log_round(self, step, values):
            self.steps.append(step)

    hang, ok = Hangs(), Works()
    t = RunTracker(tmp_path, [hang, ok], {}, defer=False, timeout=0.3)
    t0 = time.monotonic()
    t.log({"round": 1, "test_accuracy": 0.5})
    t.log({"round": 2, "test_accuracy": 0.6})
    hang.release.set()
    assert time.monotonic() - t0 < 10
    assert t.backends == [ok] and ok.steps == [1, 2]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tracker mlflow failed while logging round 1" in err[0]
    assert "TrackerTimeout: no answer within 0.3s (output.tracker_timeout_s)" in err[0]
    with pytest.raises(ZeroDivisionError):  # errors pass through unchanged
        call_with_deadline(lambda: 1 / 0, 5)


def test_mlflow_server_that_never_answers_is_dropped_and_the_run_goes_on(
    tiny, tmp_path, monkeypatch, capsys
):
    """The run's tracker writer against an MLflow server that accepts and never answers:
    dropped at the deadline with one line, and the run's records and results still go
    through it. Before the fix the run hung in MLflow's retries (no round after 240 s)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")  # the abandoned call ends too
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with silent_server() as port:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        cfg = tiny(output={"tracker": ["mlflow"], "tracker_timeout_s": 1.0})
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        dump_config(cfg, run_dir / "config.yaml")
        t0 = time.monotonic()
        tracker = open_tracker(cfg, run_dir, run_dir / "config.yaml")
        assert tracker is not None
        tracker.log({"round": 1, "test_accuracy": 0.5})
        tracker.finish({"rounds": 1, "final_accuracy": 0.5}, [])
        assert time.monotonic() - t0 < 60
    assert tracker.backends == []
    err = [ln for ln in capsys.readouterr().err.splitlines() if "tracker" in ln]
    assert len(err) == 1, err
    assert "tracker mlflow failed while starting and is dropped" in err[0]
    assert "no answer within 1s" in err[0]


def _wandb_env(monkeypatch, tmp_path) -> Path:
    """W&B with a fresh HOME and none of its directory variables set."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, "x")  # recorded, so that the test's end restores them
        monkeypatch.delenv(var)
    return home


def test_wandb_against_a_silent_server_is_dropped_and_leaves_no_process(
    tiny, tmp_path, monkeypatch, capsys
):
    """Before the fix W&B failed the whole run after 148 s."""
    pytest.importorskip("wandb")
    home = _wandb_env(monkeypatch, tmp_path)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    before = _children()
    with silent_server() as port:
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
        cfg = tiny(output={"tracker": ["wandb"], "tracker_timeout_s": 1.0})
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        dump_config(cfg, run_dir / "config.yaml")
        t0 = time.monotonic()
        tracker = open_tracker(cfg, run_dir, run_dir / "config.yaml")
        assert time.monotonic() - t0 < 60
    assert tracker is not None and tracker.backends == []
    err = [ln for ln in capsys.readouterr().err.splitlines() if "tracker" in ln]
    assert len(err) == 1 and "tracker wandb failed while starting and is dropped" in err[0]
    deadline = time.monotonic() + 10
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {p: (Path(f"/proc/{p}/stat").read_text()[:80]) for p in _children() - before}
    assert not left, left  # no wandb-core (or anything else) left
    assert not list(home.iterdir())


def test_wandb_files_stay_under_the_run_directory(tiny, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    home = _wandb_env(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = tiny(output={"tracker": ["wandb"]})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dump_config(cfg, run_dir / "config.yaml")
    tracker = open_tracker(cfg, run_dir, run_dir / "config.yaml")
    assert tracker is not None and [b.name for b in tracker.backends] == ["wandb"]
    tracker.log({"round": 1, "test_accuracy": 0.5})
    tracker.finish({"rounds": 1, "final_accuracy": 0.5}, [])
    import os

    for var, sub in (
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_DATA_DIR", "data"),
    ):
        assert os.environ[var] == str(run_dir / "wandb" / sub)
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert not list(home.iterdir()), list(home.rglob("*"))
