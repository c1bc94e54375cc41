"""The output directory's lock through the CLI: a symbolic link, a hard-linked file or a
FIFO planted as ``.fedrcl-flwr.lock`` (a copied or unpacked results folder, a shared
directory) is refused with one line and exit 2 by ``run``, ``run --resume`` and ``sweep``
alike, before any Flower process exists; the file it names is never truncated or
written, and a FIFO never makes the command wait."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import TINY

from fedrcl_flwr.cli import main
from fedrcl_flwr.run.run_files import LOCK_FILE

ROOT = Path(__file__).resolve().parents[2]
USERS = "the user's data\n"


def _exp(tmp_path: Path, **sections) -> Path:
    data = json.loads(json.dumps(TINY))
    data.update(sections)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _plant(out: Path, kind: str) -> Path:
    """``out``'s lock name taken by ``kind``; returns the user's file it would hit."""
    out.mkdir(parents=True, exist_ok=True)
    target = out.parent / f"users-{kind}.txt"
    target.write_text(USERS)
    lock = out / LOCK_FILE
    if kind == "symlink":
        lock.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, lock)
    else:
        os.mkfifo(lock)
    return target


def _refused(capsys, *argv) -> str:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, out, err)
    assert lines[0].startswith("fedrcl-flwr: error:") and "Traceback" not in err
    return lines[0]


@pytest.fixture
def flower(monkeypatch):
    """No Flower run may start: the stub records any the CLI would have started."""
    import fedrcl_flwr.runner as runner

    calls: list = []
    monkeypatch.setattr(runner, "run_simulation_via_flower", lambda *a, **k: calls.append(a))
    return calls


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_run_refuses_a_linked_lock_and_writes_nothing_through_it(tmp_path, capsys, flower, kind):
    out = tmp_path / "out"
    target = _plant(out, kind)
    line = _refused(capsys, "run", _exp(tmp_path), "--out", out)
    assert LOCK_FILE in line and "not the tool's lock file" in line
    assert target.read_text() == USERS and not flower
    assert sorted(os.listdir(out)) == [LOCK_FILE]


def test_resume_of_a_copied_run_directory_with_a_linked_lock_is_refused(tmp_path, capsys, flower):
    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import dump_config, load_config

    run = tmp_path / "run"
    cfg = load_config(_exp(tmp_path, output={"dir": str(run), "checkpoint_every": 1}))
    run_inprocess(cfg, run, stop_after=1)
    dump_config(cfg, run / "config.yaml")
    target = _plant(run, "symlink")
    line = _refused(capsys, "run", "--resume", run)
    assert "symbolic link" in line and target.read_text() == USERS and not flower


@pytest.mark.parametrize("kind", ["hardlink", "symlink"])
def test_sweep_refuses_a_linked_lock(tmp_path, capsys, flower, kind):
    _exp(tmp_path)
    (tmp_path / "base.yaml").write_text((tmp_path / "exp.yaml").read_text())
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": "base.yaml", "grid": {"seed": [0, 1]}}))
    out = tmp_path / "out"
    target = _plant(out, kind)
    line = _refused(capsys, "sweep", sweep, "--out", out)
    assert LOCK_FILE in line and target.read_text() == USERS and not flower


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_fifo_as_the_lock_is_refused_without_waiting(tmp_path, command):
    """As a separate process (a FIFO used to make ``run`` wait forever before it printed
    anything): exit 2, one line, well within the time limit."""
    exp = _exp(tmp_path)
    out = tmp_path / "out"
    _plant(out, "fifo")
    if command == "sweep":
        (tmp_path / "base.yaml").write_text(exp.read_text())
        target = tmp_path / "sweep.yaml"
        target.write_text(yaml.safe_dump({"base": "base.yaml", "grid": {"seed": [0, 1]}}))
    else:
        target = exp
    args = [sys.executable, "-m", "fedrcl_flwr.cli", command, str(target), "--out", str(out)]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{command}` waited on a FIFO planted as its lock")
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "a FIFO" in lines[0] and LOCK_FILE in lines[0]
