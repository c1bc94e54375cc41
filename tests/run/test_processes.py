"""The run's process primitives (``fedrcl_flwr/launch/processes.py``): the output
directory's lock is created, never opened in place (a link, a hard link, a FIFO at its
name is refused with one line, at once, and the file it names is left untouched);
teardown stops only the run's own processes (those carrying its marker), never a shell
``cd``-ed into the private home or a ``tail -f`` of a file there; a later run removes an
earlier run's home, store and processes only when that run's owners are all gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.launch.processes import (
    HOME_MARKER,
    HOME_PREFIX,
    RUN_VAR,
    OutputLock,
    reap_stale_runs,
    teardown,
)
from fedrcl_flwr.run.run_files import LOCK_FILE
from fedrcl_flwr.weights.lifecycle import pid_namespace, process_start


# ------------------------------------------------------------------------------ the lock
def _planted(out: Path, kind: str) -> Path:
    """``out``'s lock name taken by ``kind``; returns the user's file it points to (or
    the planted entry itself)."""
    out.mkdir(parents=True, exist_ok=True)
    target = out.parent / f"user-{kind}.txt"
    target.write_text("the user's data\n")
    lock = out / LOCK_FILE
    if kind == "symlink":
        lock.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "directory":
        lock.mkdir()
    return target


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "directory"])
def test_the_lock_refuses_what_is_not_its_own_file_at_once_and_writes_nothing(tmp_path, kind):
    out = tmp_path / "out"
    target = _planted(out, kind)
    outcome: list = []

    def acquire():
        try:
            OutputLock(out).acquire()
            outcome.append("acquired")
        except ConfigError as exc:
            outcome.append(str(exc))

    worker = threading.Thread(target=acquire, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), f"acquire() blocked on a {kind}"
    assert len(outcome) == 1 and "not the tool's lock file" in outcome[0], outcome
    assert "\n" not in outcome[0]
    assert target.read_text() == "the user's data\n"  # never truncated or written
    assert OutputLock.holder(out) is None  # reads only, never waits
    assert OutputLock.problem(out) is not None


def test_a_lock_file_left_by_an_ended_run_is_replaced_not_written_in_place(tmp_path):
    """A stale lock file (a regular file of one link: a killed run's) is removed and the
    lock made anew, a new file: what was written in the old one is never touched."""
    out = tmp_path / "out"
    out.mkdir()
    stale = out / LOCK_FILE
    stale.write_text("12345\n/tmp/old-home\n")
    kept = os.open(stale, os.O_RDONLY)  # a reader holding the old file
    try:
        lock = OutputLock(out)
        lock.acquire()
        assert os.pread(kept, 100, 0) == b"12345\n/tmp/old-home\n"
        assert os.fstat(kept).st_ino != os.stat(stale).st_ino
        assert (out / LOCK_FILE).read_text().split()[0] == str(os.getpid())
        with pytest.raises(ConfigError, match=f"PID {os.getpid()}"):
            OutputLock(out).acquire()
        lock.release(remove=True)
        assert not stale.exists()
    finally:
        os.close(kept)


# ------------------------------------------------------------------------------ teardown
SLEEP = "import time; time.sleep(120)"


def _sleeper(*, env_home: Path | None = None, cwd: Path | None = None, argv=None, session=False):
    env = {k: v for k, v in os.environ.items() if k != RUN_VAR}
    if env_home is not None:
        env[RUN_VAR] = str(env_home)
    argv = argv or [sys.executable, "-c", SLEEP]
    return subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=session
    )


def _dead(proc, timeout=20.0) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_teardown_stops_the_runs_processes_and_no_one_elses(tmp_path):
    """A process carrying the run's marker is stopped, and so is every process of a
    session the run started (one whose environment no longer shows the marker, as Ray's
    agents after ``setproctitle``); a shell whose working directory is the private home
    (in a session of its own), a ``tail -f`` of a file there (its command line names the
    home) and a process carrying another home's marker are not."""
    home = tmp_path / f"{HOME_PREFIX}teardown"
    home.mkdir()
    (home / "progress.jsonl").write_text("")
    pid_file = tmp_path / "child.pid"
    other = tmp_path / f"{HOME_PREFIX}other"
    run = _sleeper(env_home=home)
    # a session led by a run process, with a member whose environment lacks the marker
    leader = _sleeper(
        env_home=home,
        session=True,
        argv=[
            sys.executable,
            "-c",
            "import os, subprocess, sys, time; "
            f"c = subprocess.Popen([sys.executable, '-c', {SLEEP!r}], env={{}}); "
            f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(120)",
        ],
    )
    shell = _sleeper(cwd=home, session=True)
    tail = _sleeper(argv=["tail", "-f", str(home / "progress.jsonl")])
    neighbour = _sleeper(env_home=other)
    try:
        deadline = time.time() + 30
        while not pid_file.exists() and time.time() < deadline:
            time.sleep(0.1)
        member = int(pid_file.read_text())
        time.sleep(0.5)  # every process has started (its environment is in /proc)
        teardown(home, [])
        assert _dead(run) and _dead(leader), "the run's processes survived its teardown"
        assert not Path(f"/proc/{member}").exists() or _zombie(member)
        assert shell.poll() is None and tail.poll() is None and neighbour.poll() is None
        assert not home.exists()
    finally:
        for p in (run, leader, shell, tail, neighbour):
            if p.poll() is None:
                p.kill()
                p.wait()


# A launcher in a session of its own starts two processes (each writes its PID), then
# exits: the session's leader is gone, as when a CI job's or a terminal's shell exited
# and left the tool running in its session.
_LEAVE_A_SESSION = """
import os, subprocess, sys, time
first, second, out = sys.argv[1], sys.argv[2], sys.argv[3]
marked = {**os.environ, "FEDRCL_FLWR_RUN": sys.argv[4]}
plain = {k: v for k, v in os.environ.items() if k != "FEDRCL_FLWR_RUN"}
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
pids = []
for kind in (first, second):
    pids.append(subprocess.Popen(sleep, env=marked if kind == "marked" else plain).pid)
    time.sleep(0.1)  # a later start, tick for tick
open(out, "w").write(" ".join(map(str, pids)))
"""


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not _zombie(pid)


@pytest.mark.parametrize(
    ("first", "second", "second_is_the_runs"),
    [
        # the session the run was started from: its shell is older than the run
        ("plain", "marked", False),
        # a session the run started, whose leader died: Ray's renamed agents in it
        ("marked", "plain", True),
    ],
)
def test_a_session_without_its_leader_is_the_runs_only_if_nothing_in_it_is_older(
    tmp_path, first, second, second_is_the_runs
):
    """A session whose leader is gone is the run's only when none of its processes
    started before the run's earliest process. The session a run was started from holds
    older processes (the shell, the test runner, the CI job); teardown once killed them
    all whenever that session's leader had exited."""
    home = tmp_path / f"{HOME_PREFIX}leaderless"
    home.mkdir()
    out = tmp_path / "pids"
    launcher = subprocess.Popen(
        [sys.executable, "-c", _LEAVE_A_SESSION, first, second, str(out), str(home)],
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != RUN_VAR},
    )
    launcher.wait(30)  # the leader is gone (reaped)
    older, younger = (int(x) for x in out.read_text().split())
    marked, plain = (older, younger) if first == "marked" else (younger, older)
    try:
        time.sleep(0.3)  # both environments are in /proc
        teardown(home, [])
        deadline = time.time() + 10
        while _alive(marked) and time.time() < deadline:
            time.sleep(0.05)
        assert not _alive(marked), "the run's marked process survived its teardown"
        if second_is_the_runs:
            assert not _alive(plain), "a process of a session the run started survived"
        else:
            assert _alive(plain), "teardown killed a process older than the run"
    finally:
        for pid in (older, younger):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_zombie_of_the_run_is_not_waited_for(tmp_path):
    """A process of the run that ended but was not reaped yet (its parent has not waited
    for it) is no longer listed: it cannot be stopped, and a teardown that waited for it
    to vanish would wait out its whole time-out."""
    from fedrcl_flwr.launch.processes import run_processes

    home = tmp_path / f"{HOME_PREFIX}zombie"
    home.mkdir()
    proc = _sleeper(env_home=home, session=True)  # a session the run started
    sessions: set[int] = set()  # remembered from pass to pass, as the teardown does
    try:
        deadline = time.time() + 30
        while proc.pid not in run_processes(home, sessions) and time.time() < deadline:
            time.sleep(0.05)
        assert proc.pid in run_processes(home, sessions) and proc.pid in sessions
        os.kill(proc.pid, signal.SIGKILL)  # not waited for: a zombie of this process
        deadline = time.time() + 30
        while not _zombie(proc.pid) and time.time() < deadline:
            time.sleep(0.05)
        assert _zombie(proc.pid) and Path(f"/proc/{proc.pid}").exists()
        assert proc.pid not in run_processes(home, sessions)
    finally:
        proc.kill()
        proc.wait()


def _stale_home(parent: Path, name: str, pids: list, namespace: str | None = None) -> Path:
    home = parent / f"{HOME_PREFIX}{name}"
    home.mkdir()
    record = {"pids": pids, "namespace": namespace or pid_namespace()}
    (home / HOME_MARKER).write_text(json.dumps(record))
    return home


def test_a_later_run_reaps_a_run_whose_cli_and_watchdog_were_killed(tmp_path, monkeypatch):
    """A home whose owner record names only ended processes: its processes (those
    carrying its marker), its weight store and the home go. A home with a live owner, one
    of another PID namespace and one without a record (another tool's, or one being made)
    stay, and so do their processes."""
    from fedrcl_flwr.weights import lifecycle

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(lifecycle, "SHM", shm)
    import fedrcl_flwr.launch.processes as processes

    monkeypatch.setattr(processes, "SHM", shm)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    dead = [int(gone.stdout), 1]
    me = [os.getpid(), process_start(os.getpid())]
    stale = _stale_home(tmp_path, "stale", [dead, [int(gone.stdout) + 0, None]])
    live = _stale_home(tmp_path, "live", [dead, me])
    foreign = _stale_home(tmp_path, "foreign", [dead], namespace="1" + pid_namespace())
    unmarked = tmp_path / f"{HOME_PREFIX}unmarked"
    unmarked.mkdir()
    store = lifecycle.create_store(home=stale)
    # the store's owners are this process: make them the dead run's, as the CLI's were
    record = json.loads((store.root / lifecycle.STORE_MARKER).read_text())
    record["pids"] = [dead]
    (store.root / lifecycle.STORE_MARKER).write_text(json.dumps(record))
    orphan = _sleeper(env_home=stale)
    kept = _sleeper(env_home=live)
    try:
        time.sleep(0.5)
        assert reap_stale_runs(tmp_path) == [stale]
        assert _dead(orphan), "the dead run's process was not stopped"
        assert not stale.exists() and not store.root.exists()
        assert live.is_dir() and foreign.is_dir() and unmarked.is_dir()
        assert kept.poll() is None
    finally:
        for p in (orphan, kept):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
