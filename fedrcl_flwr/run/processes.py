"""The run's process primitives, below everything that starts processes (the runner, the
sweep, the pre-run checks): the output directory's lock (:class:`OutputLock`), the one
teardown mechanism (:class:`Watchdog`, a ``python -m fedrcl_flwr.run.processes watch HOME``
process), the marker variables every process of a run carries, and the one ``/proc`` scan
(:func:`procs_with`). Standard library only (and :mod:`fedrcl_flwr.errors`).

Teardown: the watchdog waits for the pipe on its stdin to close — which happens when the
CLI stops it on purpose and also when the CLI dies in any way, ``kill -9`` included — then
stops the process groups it was told of and every process *of the run*: any process whose
environment names the run's private home (``FEDRCL_FLWR_RUN``/``FLWR_HOME``, set on every
child), whose command line names it, or whose working directory is inside it (Ray's agents,
which Ray starts with an environment of its own, are found this way), then deletes the
home. It also holds the output directory's lock until the last process is gone.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.run.run_files import LOCK_FILE

RUN_VAR = "FEDRCL_FLWR_RUN"  # set to the run's private home on every process of the run
SWEEP_VAR = "FEDRCL_FLWR_SWEEP"  # set to the sweep's private home on every run it starts
MARKER_VARS = (RUN_VAR, SWEEP_VAR)
HOME_PREFIX = "fedrcl-flwr-home-"  # private homes (tempfile.mkdtemp): the watchdog deletes
#                                    only a directory named so


class Watchdog:
    """The one teardown mechanism (module docstring): a ``python -m
    fedrcl_flwr.run.processes watch HOME`` process in its own session with a pipe from this process on its stdin.
    When the pipe closes — :meth:`stop`, or this process dying in any way, ``kill -9``
    included — it SIGKILLs the process groups it was told of (:meth:`watch_group`), then
    every process whose environment, command line or working directory names ``HOME``,
    deletes ``HOME`` and exits; ``lock`` (an :class:`OutputLock` it inherits) is released
    only then. Used by each run (``HOME`` = the run's private Flower home) and by a sweep
    (``HOME`` = the sweep's private home, set as ``FEDRCL_FLWR_SWEEP`` on every run it
    starts, each of which has its own watchdog for its Flower processes)."""

    def __init__(self, home: Path, lock: OutputLock | None = None):
        self.home = Path(home)
        # the watchdog carries none of the markers, so no other watchdog stops it
        wenv = {k: v for k, v in os.environ.items() if k not in MARKER_VARS}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fedrcl_flwr.run.processes", "watch", str(self.home)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=wenv,
            cwd="/",
            pass_fds=(lock.fd,) if lock is not None and lock.fd is not None else (),
        )
        assert self.proc.stdin is not None  # stdin=PIPE
        self.pipe: IO[bytes] = self.proc.stdin

    def _tell(self, line: str) -> None:
        try:
            self.pipe.write((line + "\n").encode())
            self.pipe.flush()
        except (OSError, ValueError):
            pass

    def watch_group(self, pgid: int) -> None:
        """Kill process group ``pgid`` at teardown."""
        self._tell(f"pgid {int(pgid)}")

    def forget_group(self, pgid: int) -> None:
        """Process group ``pgid`` has ended: do not signal it (its id may be reused)."""
        self._tell(f"forget {int(pgid)}")

    def stop(self, timeout: float = 90.0) -> bool:
        """Close the pipe and wait while the watchdog tears down; ``True`` when it ended
        cleanly (exit 0, ``HOME`` gone)."""
        try:
            self.pipe.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # should not happen
            return False
        return self.proc.returncode == 0 and not self.home.exists()


class OutputLock:
    """An output directory is owned by one live run: an exclusive ``flock`` on
    ``DIR/.fedrcl-flwr.lock``, which the kernel releases when the last process holding it
    (the CLI, then its watchdog) is gone, however it died. The file names the holder's PID
    (and the run's private home, for tests and for people hunting processes).

    A run that completed removes the file as it releases the lock (``release(remove=
    True)``: unlinked while still held, then closed); a failed, interrupted or killed run
    leaves it, naming the PID and home it had. The lock is the ``flock``, not the file's
    existence: :meth:`acquire` locks the file and then checks that the path still names
    the file it locked, retrying otherwise, so a holder that unlinks the file while a
    newcomer opens it cannot let two runs in."""

    def __init__(self, out_dir: Path, what: str = "run"):
        self.path = Path(out_dir) / LOCK_FILE
        self.fd: int | None = None
        self.what = what

    @staticmethod
    def holder(out_dir: Path) -> str | None:
        """The PID holding ``out_dir``'s lock, or ``None`` when it is free (reads only)."""
        path = Path(out_dir) / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except OSError:
            text = path.read_text(errors="replace").split()
            return text[0] if text else "?"
        finally:
            os.close(fd)

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                pid = self.holder(self.path.parent) or "?"
                raise ConfigError(
                    f"output directory {self.path.parent} is in use by "
                    f"another {self.what} (PID {pid}); wait for it to end or "
                    "choose another --out"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # its holder removed that file as it finished: lock the new one
        self.fd = fd
        self.note()

    def note(self, home: str = "") -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"{os.getpid()}\n{home}\n".encode(), 0)

    def release(self, remove: bool = False) -> None:
        """Release the lock; ``remove`` (a completed run) first deletes the file."""
        if self.fd is not None:
            if remove:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
            os.close(self.fd)
            self.fd = None


def teardown(home: Path, pgids: list[int]) -> None:
    """Stop everything of the run whose private home is ``home`` at once: SIGKILL the
    process groups (the SuperLink's holds the simulation process and its direct
    children), then every process of the run (:func:`procs_with` the home) until none is
    left, and delete the home and the run's weight store. Nothing is waited for gracefully: the SuperLink's state
    lives in the home that is deleted, and the run's own files are written atomically
    (``metrics.jsonl`` tolerates a torn last line), so a run stopped mid-round leaves its
    directory resumable and never goes on to write results after it was stopped."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _kill_run(home)
    if Path(home).name.startswith(HOME_PREFIX):  # only a private home the tool created
        from fedrcl_flwr.weight_store import remove_store

        remove_store(home)
        shutil.rmtree(home, ignore_errors=True)


def watch(home: str) -> None:
    """The watchdog's main: read ``pgid N`` / ``forget N`` lines until stdin closes, then
    tear down (:class:`Watchdog`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the teardown first
    pgids: list[int] = []
    for line in sys.stdin.buffer:
        parts = line.decode(errors="replace").split()
        if len(parts) == 2 and parts[1].isdigit():
            if parts[0] == "pgid":
                pgids.append(int(parts[1]))
            elif parts[0] == "forget" and int(parts[1]) in pgids:
                pgids.remove(int(parts[1]))
    teardown(Path(home), pgids)


def procs_with(marker: str) -> list[int]:
    """PIDs (other than ours) of the processes tied to ``marker`` (e.g. a run's private
    home): its environment, its command line or its working directory contains it. The
    one /proc scan used by teardown, tests and benchmarks."""
    needle = marker.encode()
    me = str(os.getpid())
    pids = []
    for pid_dir in Path("/proc").glob("[0-9]*"):
        if pid_dir.name == me:
            continue
        try:
            hit = (
                needle in (pid_dir / "environ").read_bytes()
                or needle in (pid_dir / "cmdline").read_bytes()
                or marker in os.readlink(pid_dir / "cwd")
            )
            if hit:
                pids.append(int(pid_dir.name))
        except (OSError, ValueError):
            continue
    return pids


def _kill_run(home: Path, timeout: float = 20.0) -> None:
    """Ray may daemonise (own session) and its raylet may still be spawning workers while
    we kill: SIGKILL every process of the run, and repeat until none has been seen for a
    second (or ``timeout`` passes)."""
    deadline = time.time() + timeout
    quiet_since = None
    while time.time() < deadline:
        pids = procs_with(str(home))
        if not pids:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since >= 0.5:
                return
        else:
            quiet_since = None
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "watch":
    watch(sys.argv[2])
