"""The run's process primitives, below everything that starts processes (the runner, the
sweep, the pre-run checks): the output directory's lock (:class:`OutputLock`), the one
teardown mechanism (:class:`Watchdog`, a ``python -m fedrcl_flwr.launch.processes watch HOME``
process), the marker variables every process of a run carries, the private homes' owner
records and the removal of stale ones (:func:`reap_stale_runs`), and the one ``/proc``
scan (:func:`procs_with`). Standard library only (and :mod:`fedrcl_flwr.errors`, and the
weight store's owner records).

Teardown: the watchdog waits for the pipe on its stdin to close — which happens when the
CLI stops it on purpose and also when the CLI dies in any way, ``kill -9`` included — then
stops the process groups it was told of and every process *of the run*: a process whose
environment holds the run's marker variable with the run's private home as its value
(``FEDRCL_FLWR_RUN=HOME``, set on every child, and inherited by every process Flower and
Ray start, Ray's agents included; ``FEDRCL_FLWR_SWEEP=HOME`` for a sweep's runs). A
process that merely has its working directory, an open file or its command line in the
home (a shell ``cd``-ed there, a ``tail -f`` of a file there) is not the run's and is left
alone. Then it deletes the run's weight store and the home. It also holds the output
directory's lock until the last process is gone.

A private home carries an owner record (:data:`HOME_MARKER`: the PIDs of the CLI and of
its watchdog); when both were killed (``kill -9`` of the two, an OOM kill), a later run or
sweep does their teardown (:func:`reap_stale_runs`): only for a home whose record proves
it was a run's and whose processes are all gone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from fedrcl_flwr.errors import ConfigError, file_mode_kind
from fedrcl_flwr.run.run_files import LOCK_FILE
from fedrcl_flwr.weights.lifecycle import (
    SHM,
    owners_gone,
    pid_namespace,
    process_start,
    read_marker,
    remove_stale_stores,
    remove_store,
    stores_of,
)

RUN_VAR = "FEDRCL_FLWR_RUN"  # set to the run's private home on every process of the run
SWEEP_VAR = "FEDRCL_FLWR_SWEEP"  # set to the sweep's private home on every run it starts
MARKER_VARS = (RUN_VAR, SWEEP_VAR)
HOME_PREFIX = "fedrcl-flwr-home-"  # private homes (tempfile.mkdtemp): the watchdog deletes
#                                    only a directory named so
HOME_MARKER = ".fedrcl-flwr-home"  # in a private home: JSON {"pids", "namespace"}


class Watchdog:
    """The one teardown mechanism (module docstring): a ``python -m
    fedrcl_flwr.launch.processes watch HOME`` process in its own session with a pipe from this process on its stdin.
    When the pipe closes — :meth:`stop`, or this process dying in any way, ``kill -9``
    included — it SIGKILLs the process groups it was told of (:meth:`watch_group`), then
    every process whose environment carries ``HOME`` as its run's or sweep's marker
    (:func:`run_processes`), deletes the run's weight store and ``HOME`` and exits;
    ``lock`` (an :class:`OutputLock` it inherits) is released only then. ``HOME`` gets
    its owner record (:data:`HOME_MARKER`: this process and the watchdog) once the
    watchdog runs. Used by each run (``HOME`` = the run's private Flower home) and by a sweep
    (``HOME`` = the sweep's private home, set as ``FEDRCL_FLWR_SWEEP`` on every run it
    starts, each of which has its own watchdog for its Flower processes)."""

    def __init__(self, home: Path, lock: OutputLock | None = None):
        self.home = Path(home)
        # the watchdog carries none of the markers, so no other watchdog stops it
        wenv = {k: v for k, v in os.environ.items() if k not in MARKER_VARS}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fedrcl_flwr.launch.processes", "watch", str(self.home)],
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
        self.owners = [os.getpid(), self.proc.pid]
        write_owner_record(self.home, self.owners)

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

    The file is created, never opened in place to be written: :meth:`acquire` makes it
    with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (so a link or any file planted at that name is
    never written through). A lock file left by a failed, interrupted or killed run (a
    regular file, one link) is locked, checked to be still at the path, removed, and
    made anew; anything else at that name (a symbolic link, a hard-linked file, a FIFO, a
    device, a directory) is refused with one line (:class:`ConfigError`, exit 2), and
    never waited on (``O_NONBLOCK``). The lock is the ``flock``, not the file's
    existence: a newcomer locks a file and then checks that the path still names it,
    retrying otherwise, so a holder that removes its file while a newcomer opens it
    cannot let two runs in. A completed run removes its file as it releases the lock
    (``release(remove=True)``: unlinked while still held, then closed)."""

    def __init__(self, out_dir: Path, what: str = "run"):
        self.path = Path(out_dir) / LOCK_FILE
        self.fd: int | None = None
        self.what = what

    @staticmethod
    def problem(out_dir: Path) -> str | None:
        """Why ``out_dir``'s lock file cannot be the tool's (a symbolic link, a
        hard-linked file, a FIFO or anything but a regular file), or ``None``; reads
        only (``lstat``)."""
        path = Path(out_dir) / LOCK_FILE
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"{path}: cannot be read ({exc.strerror})"
        if stat.S_ISLNK(st.st_mode):
            what = "a symbolic link"
        elif not stat.S_ISREG(st.st_mode):
            what = file_mode_kind(st.st_mode)
        elif st.st_nlink > 1:
            what = f"a file with {st.st_nlink} hard links"
        else:
            return None
        return (
            f"{path} is {what}, not the tool's lock file; the tool never writes through "
            "one: move it away or choose another --out"
        )

    @staticmethod
    def holder(out_dir: Path) -> str | None:
        """The PID holding ``out_dir``'s lock, or ``None`` when it is free or the file is
        not a lock file at all (reads only; never waits)."""
        fd = _open_lock_file(Path(out_dir) / LOCK_FILE)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except OSError:
            text = os.pread(fd, 256, 0).decode(errors="replace").split()
            return text[0] if text else "?"
        finally:
            os.close(fd)

    def acquire(self) -> None:
        """Hold the lock, or :class:`ConfigError` (one line): another live run or sweep
        holds it (its PID), or the name is taken by something that is not a lock file."""
        for _ in range(1000):  # each turn: the file changed under us; never in practice
            why = self.problem(self.path.parent)
            if why:
                raise ConfigError(why)
            try:
                fd = os.open(
                    self.path,
                    os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o644,
                )
            except FileExistsError:
                self._take_over_stale()
                continue
            except OSError as exc:
                raise ConfigError(
                    f"{self.path}: cannot create the lock file ({exc.strerror})"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a newcomer's holder() check has it for an instant
                os.close(fd)
                time.sleep(0.01)
                continue
            if _names(self.path, fd):
                self.fd = fd
                self.note()
                return
            os.close(fd)  # removed by a newcomer that found it stale before we locked it
        raise ConfigError(f"{self.path}: the lock file keeps changing; try again")

    def _take_over_stale(self) -> None:
        """The file at the path is a regular file of one link: refuse if a live run holds
        it, else (left by a run that ended) remove it, holding its lock while checking
        that the path still names it, so that only one newcomer removes it."""
        fd = _open_lock_file(self.path)
        if fd is None:  # gone meanwhile, or not a lock file (the next turn says which)
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ConfigError(f"{self.path}: cannot be locked ({exc.strerror})") from None
                time.sleep(0.05)  # another newcomer may be removing it: look again
                if not _names(self.path, fd):
                    return
                text = os.pread(fd, 256, 0).decode(errors="replace").split()
                raise ConfigError(
                    f"output directory {self.path.parent} is in use by "
                    f"another {self.what} (PID {text[0] if text else '?'}); wait for it "
                    "to end or choose another --out"
                ) from None
            if _names(self.path, fd):
                os.unlink(self.path)
        finally:
            os.close(fd)

    def note(self, home: str = "") -> None:
        """Say in the lock file (this lock's own) which process holds it and which
        private home the run uses."""
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"{os.getpid()}\n{home}\n".encode(), 0)

    def release(self, remove: bool = False) -> None:
        """Release the lock; ``remove`` (a completed run) first deletes the file (if the
        path still names it)."""
        if self.fd is not None:
            if remove and _names(self.path, self.fd):
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
            os.close(self.fd)
            self.fd = None


def _open_lock_file(path: Path) -> int | None:
    """A read-only descriptor of ``path`` when it is a regular file of one link (opened
    with ``O_NOFOLLOW | O_NONBLOCK``, checked with ``fstat``), else ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        return None
    return fd


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` (not followed) is the file open as ``fd``."""
    try:
        here, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


# ------------------------------------------------------------ private homes: owners, reaping
def write_owner_record(home: Path, pids: list[int]) -> None:
    """Mark ``home`` (a private home this process made) as a run's, owned by ``pids``
    (:data:`HOME_MARKER`; written whole: a temporary file created exclusively, then
    renamed)."""
    record = {
        "pids": [[int(p), process_start(int(p))] for p in pids],
        "namespace": pid_namespace(),
    }
    tmp = Path(home) / f"{HOME_MARKER}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
        os.replace(tmp, Path(home) / HOME_MARKER)
    except OSError:  # the home is gone: nothing to mark
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def reap_stale_runs(parent: Path | None = None) -> list[Path]:
    """The teardown of earlier runs and sweeps whose CLI and watchdog were both killed
    (``kill -9`` of both, an OOM kill): for each private home in ``parent`` (the system's
    temporary directory) that carries an owner record (:data:`HOME_MARKER`) whose
    processes have all ended (:func:`~fedrcl_flwr.weights.lifecycle.owners_gone`), stop the
    processes that still carry it as their marker, delete its weight store and the home.
    Then the stale weight stores in ``/dev/shm`` (:func:`~fedrcl_flwr.weights.lifecycle.
    remove_stale_stores`). A home without a valid record (one being made, another
    tool's) or with a live owner is left alone. Returns the homes removed."""
    parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    reaped: list[Path] = []
    try:
        homes = [Path(e.path) for e in os.scandir(parent) if e.name.startswith(HOME_PREFIX)]
    except OSError:
        homes = []
    for home in homes:
        record = read_marker(home, HOME_MARKER)
        if record is not None and owners_gone(record):
            teardown(home, [])
            reaped.append(home)
    remove_stale_stores(SHM)
    return reaped


def teardown(home: Path, pgids: list[int]) -> None:
    """Stop everything of the run whose private home is ``home`` at once: SIGKILL the
    process groups (the SuperLink's holds the simulation process and its direct
    children), then every process carrying the run's marker (:func:`run_processes`)
    until none is left, and delete the run's weight store (the one whose record names
    ``home``) and the home. Nothing is waited for gracefully: the SuperLink's state lives
    in the home that is deleted, and the run's own files are written atomically
    (``metrics.jsonl`` tolerates a torn last line), so a run stopped mid-round leaves its
    directory resumable and never goes on to write results after it was stopped. The
    run's sessions are looked up once before anything is killed, so that a session whose
    leader the group kill ends is still known as the run's."""
    sessions: set[int] = set()
    run_processes(home, sessions)  # before the kill: the sessions whose leaders it ends
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _kill_run(home, sessions)
    if Path(home).name.startswith(HOME_PREFIX):  # only a private home the tool created
        remove_stores_of(home)
        shutil.rmtree(home, ignore_errors=True)


def remove_stores_of(home: Path) -> None:
    """Delete the weight stores in ``/dev/shm`` whose owner record names ``home`` (a
    store inside the home goes with it)."""
    for path in stores_of(home):
        remove_store(path, home=home)


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


def run_processes(home: str | Path, sessions: set[int] | None = None) -> list[int]:
    """PIDs (other than ours) of the processes of the run (or sweep) whose private home
    is ``home``: those whose environment holds ``FEDRCL_FLWR_RUN=HOME`` or
    ``FEDRCL_FLWR_SWEEP=HOME`` as an entry of its own (set by the tool on the processes
    it starts, inherited by theirs), and every process of a session the run started: a
    session whose leader carries the marker, or whose leader is gone while a member
    carries it (Ray renames its agents with ``setproctitle``, which overwrites the
    memory ``/proc/PID/environ`` shows; they stay in the session Flower's SuperExec
    started). A session whose leader is gone counts only when none of its live members
    started before the earliest process of the run: a session the run started holds
    nothing older than the run, while the session the run was started *from* (a
    terminal whose shell exited, ``nohup``, a CI job whose launcher left, a container
    whose session leader is outside its PID namespace: session 0) holds the CLI, its
    shell, the test runner, which are older; such a session is never the run's.
    ``sessions`` (optional) collects the run's sessions across calls, so that one whose
    leader was killed in an earlier pass is still known. A zombie (ended, not yet
    reaped by its parent) is never listed: it cannot be stopped, and a teardown waiting
    for it to vanish would wait out its time-out. Never a process only
    because its command line, working directory or open files name the home: a shell
    ``cd``-ed there or a ``tail -f`` of a file there is in a session of its own, led by
    a process without the marker."""
    entries = [f"\0{var}={home}\0".encode() for var in MARKER_VARS]
    me = os.getpid()
    session_of: dict[int, int] = {}
    started: dict[int, int] = {}  # clock ticks after boot, live processes only
    marked: set[int] = set()
    zombies: set[int] = set()
    for pid_dir in Path("/proc").glob("[0-9]*"):
        pid = int(pid_dir.name)
        try:
            fields = (pid_dir / "stat").read_bytes().rsplit(b")", 1)[1].split()
            session_of[pid] = int(fields[3])
            if fields[0] == b"Z":  # ended, not yet reaped: nothing left to stop
                zombies.add(pid)
                continue
            started[pid] = int(fields[19])
            environ = b"\0" + (pid_dir / "environ").read_bytes() + b"\0"
        except (OSError, IndexError, ValueError):
            continue
        if any(e in environ for e in entries):
            marked.add(pid)
    known = sessions if sessions is not None else set()
    if marked:
        run_began = min(started[pid] for pid in marked)
        for sid in {session_of[pid] for pid in marked} - known:
            leader_alive = sid in session_of and sid not in zombies
            if leader_alive:
                if sid in marked:
                    known.add(sid)
            elif sid > 0 and all(
                started.get(pid, run_began) >= run_began
                for pid, s in session_of.items()
                if s == sid
            ):
                known.add(sid)
    pids = marked | {pid for pid, sid in session_of.items() if sid in known}
    return sorted(pids - zombies - {me})


def procs_with(marker: str) -> list[int]:
    """PIDs (other than ours) of the processes whose environment, command line or
    working directory contains ``marker``: a broad look for tests and benchmarks (what
    a run left behind). Teardown stops only :func:`run_processes`."""
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


def _kill_run(home: Path, sessions: set[int], timeout: float = 20.0) -> None:
    """Ray may daemonise (own session) and its raylet may still be spawning workers while
    we kill: SIGKILL every process of the run (:func:`run_processes`, the run's sessions
    remembered from pass to pass in ``sessions``), and repeat until none has been seen for
    half a second (or ``timeout`` passes)."""
    deadline = time.time() + timeout
    quiet_since = None
    while time.time() < deadline:
        pids = run_processes(home, sessions)
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
