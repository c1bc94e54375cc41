"""A private simulation SuperLink on loopback, from start to teardown
(:class:`LocalSuperLink`): its private ``FLWR_HOME`` (temporary), a free port, the
environment every process of the run inherits (the run's marker variable, Ray's session
files inside the home where its sockets fit: :func:`ray_sockets_fit`), its watchdog first
(:class:`~fedrcl_flwr.launch.processes.Watchdog`), the run's weight store
(:mod:`fedrcl_flwr.weights`), then ``flower-superlink --simulation`` in its own process
group, waited for until it answers ``/health``. :meth:`LocalSuperLink.stop` has the
watchdog tear everything down."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from fedrcl_flwr.errors import RunFailed
from fedrcl_flwr.launch.processes import (
    HOME_PREFIX,
    RUN_VAR,
    OutputLock,
    Watchdog,
    reap_stale_runs,
    teardown,
)
from fedrcl_flwr.run import timers
from fedrcl_flwr.run.run_files import append_file


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    exe = Path(sys.executable).parent / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if not found:
        raise RunFailed(f"'{name}' not found: is flwr installed in this environment?")
    return found


# Ray's sockets are ``<RAY_TMPDIR>/ray/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store``
# (``ray._private.node``) and an AF_UNIX path has at most 107 bytes
RAY_SOCKET_TAIL = len("/ray/session_2026-11-28_07-22-05_619201_/sockets/plasma_store")
AF_UNIX_PATH_MAX = 107


def _pid_digits() -> int:
    try:
        return len(Path("/proc/sys/kernel/pid_max").read_text().strip())
    except OSError:
        return 7  # Linux's largest pid_max, 4194304


def ray_sockets_fit(home: Path) -> bool:
    """Whether a private Ray can keep its session directory under ``home``
    (``RAY_TMPDIR=home``): its socket paths must fit in an AF_UNIX address."""
    tail = RAY_SOCKET_TAIL + _pid_digits()
    return len(os.fsencode(str(home))) + tail <= AF_UNIX_PATH_MAX


def ray_session_note(env: dict, home: Path) -> str:
    """One line for ``flower.log``: where the private Ray keeps its session files."""
    if env.get("RAY_ADDRESS"):
        return "Ray: joining the cluster at " + env["RAY_ADDRESS"]
    if env.get("RAY_TMPDIR") == str(home):
        return f"Ray's session files: {home}/ray (removed with the run)"
    where = f"{env['RAY_TMPDIR']}/ray" if env.get("RAY_TMPDIR") else "$TMPDIR/ray or /tmp/ray"
    return (
        f"Ray's session files: {where}, kept "
        "after the run: the run's private home is too long a path for Ray's sockets "
        f"(at most {AF_UNIX_PATH_MAX - RAY_SOCKET_TAIL - _pid_digits()} bytes; a shorter "
        "TMPDIR keeps them in the run's home)"
    )


def superlink_environment(
    home: Path, ray_address: str | None = None, verbose: bool = False
) -> dict[str, str]:
    """The environment of the SuperLink and of every process it starts, for the private
    home ``home``: this process's, with Flower's home and the run's marker variable set,
    Flower's runtime dependency installation off, Ray joining ``ray_address`` or private
    (its idle workers not prestarted, its actors warmed up while the ServerApp starts, its
    session files in the home where the sockets fit), warnings off unless ``verbose``, and
    the path of the ServerApp's start-up events."""
    env = dict(os.environ)
    env["FLWR_HOME"] = str(home)
    env[RUN_VAR] = str(home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env.setdefault("RAY_DEDUP_LOGS", "1")
    env.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # the SuperLink's executor looks for the submitted run every second by default
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
    # Ray prestarts idle workers for the first driver, but Flower's actors need
    # workers with the run's runtime env and start their own: those idle workers
    # only took CPU from the start-up (and so does the usage-stats reporter)
    env.setdefault("RAY_prestart_worker_first_driver", "0")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray_address:  # Flower's ray.init() joins the cluster Ray finds in RAY_ADDRESS
        env["RAY_ADDRESS"] = ray_address
    else:
        env.pop("RAY_ADDRESS", None)
        # the actors of a private Ray import the ClientApp while the ServerApp starts,
        # not on round 1's first message (fedrcl_flwr/app/worker_warmup.py); a cluster's
        # workers are the cluster's: their start-up is left as the cluster runs it
        env.setdefault("RAY_RUNTIME_ENV_HOOK", "fedrcl_flwr.app.worker_warmup.add_setup_hook")
        # Ray's session files (logs, sockets, spilled objects) inside the home, so the
        # teardown removes them with it; Ray's default (``$TMPDIR/ray``) kept one
        # session directory per run forever
        if ray_sockets_fit(home):
            env["RAY_TMPDIR"] = str(home)
    if not verbose:
        env["PYTHONWARNINGS"] = "ignore"
    # the ServerApp's start-up events, for the CLI's progress lines (run/timers.py)
    env[timers.PROGRESS_VAR] = str(home / "progress.jsonl")
    return env


class LocalSuperLink:
    """A private simulation SuperLink on loopback, stopped by :meth:`stop` (or, if this
    process dies first, by its watchdog)."""

    def __init__(
        self,
        log_path: Path,
        verbose: bool = False,
        lock: OutputLock | None = None,
        ray_address: str | None = None,
        weight_store: bool = False,
    ):
        reap_stale_runs()  # earlier runs whose CLI and watchdog were both killed
        self.home = Path(tempfile.mkdtemp(prefix=HOME_PREFIX))
        self.port = free_port()
        self.log_path = log_path
        self.verbose = verbose
        self.proc: subprocess.Popen | None = None
        self.env = superlink_environment(self.home, ray_address, verbose)
        self.progress_path = Path(self.env[timers.PROGRESS_VAR])
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "local"\n\n'
            f'[superlink.local]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        if lock is not None:
            lock.note(str(self.home))
        # the watchdog first: from here on, nothing of the run can outlive this process
        self.watchdog = Watchdog(self.home, lock)
        self.store_root, self.store_note = self._weight_store() if weight_store else ("", "")

    def _weight_store(self) -> tuple[str, str]:
        """The run's weight store (``simulation.transport: shared``), owned by this
        process and the watchdog, whose teardown removes it: its folder, or why there is
        none."""
        from fedrcl_flwr.weights.lifecycle import create_store

        try:
            store = create_store(owners=[self.watchdog.proc.pid], home=self.home)
        except OSError as exc:
            return "", f"{type(exc).__name__}: {exc}"
        return str(store.root), ""

    def start(self, timeout: float = 60.0) -> None:
        self._log = append_file(self.log_path, "ab")
        self._log.write(f"fedrcl-flwr: {ray_session_note(self.env, self.home)}\n".encode())
        self._log.flush()
        timers.server_event("superlink_launch")  # where Flower's own start-up begins
        self.proc = subprocess.Popen(
            [
                _bin("flower-superlink"),
                "--simulation",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            cwd=str(self.home),
        )
        self.watchdog.watch_group(self.proc.pid)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RunFailed(
                    f"flower-superlink exited with code {self.proc.returncode}; see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RunFailed(
            f"flower-superlink did not become healthy in {timeout:.0f}s; see {self.log_path}"
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Close the watchdog's pipe and wait while it tears the run down."""
        clean = self.watchdog.stop()
        if getattr(self, "_log", None):
            self._log.close()
        if not clean:  # should not happen: do it here instead
            teardown(self.home, [self.proc.pid] if self.proc is not None else [])
