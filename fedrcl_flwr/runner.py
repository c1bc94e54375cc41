"""Run an experiment as a Flower simulation through Flower's runtime.

``run_simulation()`` is deprecated, so the CLI does what ``flwr run`` users do, but owns
every process it starts:

1. a private ``FLWR_HOME`` (temporary) and a free loopback port;
2. ``flower-superlink --simulation`` without runtime dependency installation, in its own
   process group;
3. ``flwr run <app> <connection>`` with the experiment (the resolved ``config.yaml`` in
   the output directory, an absolute path) and the federation sized from the YAML
   (``--federation-config num-supernodes=... client-resources-...``), called in this
   process (:mod:`fedrcl_flwr.app.control`: Flower's own command function, without a
   process of its own);
4. polling the run's status (``ListRuns``, what ``flwr list --run-id`` shows, through the
   same in-process Control API client), because a failed run can look like a submitted
   one, while printing one line per evaluated round from ``metrics.jsonl``;
5. tearing the SuperLink, the simulation process and Ray down, whatever happened.

Teardown is one mechanism, run by a *watchdog* process (``python -m fedrcl_flwr.runner
watch HOME``) that the CLI starts first, in its own session, with a pipe on its stdin. The
watchdog waits for that pipe to close — which happens when the CLI stops it on purpose
and also when the CLI dies in any way, ``kill -9`` included — then stops the SuperLink's
process group and every process *of the run*: any process whose environment names the
run's private home (``FEDRCL_FLWR_RUN``/``FLWR_HOME``, set on every child), whose command
line names it, or whose working directory is inside it (Ray's agents, which Ray starts
with an environment of its own, are found this way), then deletes the home. It also holds
the output directory's lock (:class:`OutputLock`) until the last process is gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from fedrcl_flwr.config import ConfigError, ExperimentConfig
from fedrcl_flwr.run import timers
from fedrcl_flwr.run.preflight import check_ray_address, check_resources  # noqa: F401 - re-exported
from fedrcl_flwr.run.results import format_round_line, read_metrics, shows_ema
from fedrcl_flwr.run.run_files import CONFIG_FILE, FLOWER_LOG, LOCK_FILE, RUN_LOG, SUMMARY_FILE


class RunFailed(RuntimeError):
    pass


def find_app_dir() -> Path:
    """The Flower app directory (the project root with ``pyproject.toml``)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        raise RunFailed(
            f"cannot find the Flower app (pyproject.toml) next to {root}; install the "
            "project in editable mode: pip install -e ."
        )
    return root


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


def federation_config(cfg: ExperimentConfig) -> str:
    s = cfg.simulation
    items = [
        f"num-supernodes={cfg.supernodes()}",
        f"client-resources-num-cpus={int(s.num_cpus)}",
        f"client-resources-num-gpus={float(s.num_gpus)}",
    ]
    if s.ray_address:  # an existing cluster: its resources are what they are
        return " ".join(items)
    if s.init_num_cpus:
        items.append(f"init-args-num-cpus={int(s.init_num_cpus)}")
    if s.init_num_gpus is not None:
        items.append(f"init-args-num-gpus={float(s.init_num_gpus)}")
    return " ".join(items)


RUN_VAR = "FEDRCL_FLWR_RUN"  # set to the run's private home on every process of the run
SWEEP_VAR = "FEDRCL_FLWR_SWEEP"  # set to the sweep's private home on every run it starts
MARKER_VARS = (RUN_VAR, SWEEP_VAR)
HOME_PREFIX = "fedrcl-flwr-home-"  # private homes (tempfile.mkdtemp): the watchdog deletes
#                                    only a directory named so


class Watchdog:
    """The one teardown mechanism (module docstring): a ``python -m fedrcl_flwr.runner
    watch HOME`` process in its own session with a pipe from this process on its stdin.
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
            [sys.executable, "-m", "fedrcl_flwr.runner", "watch", str(self.home)],
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
        self.home = Path(tempfile.mkdtemp(prefix=HOME_PREFIX))
        self.port = free_port()
        self.log_path = log_path
        self.verbose = verbose
        self.proc: subprocess.Popen | None = None
        self.env = dict(os.environ)
        self.env["FLWR_HOME"] = str(self.home)
        self.env[RUN_VAR] = str(self.home)
        self.env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        self.env.setdefault("RAY_DEDUP_LOGS", "1")
        self.env.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        # the SuperLink's executor looks for the submitted run every second by default
        self.env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
        # Ray prestarts idle workers for the first driver, but Flower's actors need
        # workers with the run's runtime env and start their own: those idle workers
        # only took CPU from the start-up (and so does the usage-stats reporter)
        self.env.setdefault("RAY_prestart_worker_first_driver", "0")
        self.env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if ray_address:  # Flower's ray.init() joins the cluster Ray finds in RAY_ADDRESS
            self.env["RAY_ADDRESS"] = ray_address
        else:
            self.env.pop("RAY_ADDRESS", None)
            # the actors of a private Ray import the ClientApp while the ServerApp starts,
            # not on round 1's first message (fedrcl_flwr/app/worker_warmup.py); a cluster's
            # workers are the cluster's: their start-up is left as the cluster runs it
            self.env.setdefault(
                "RAY_RUNTIME_ENV_HOOK", "fedrcl_flwr.app.worker_warmup.add_setup_hook"
            )
        if not verbose:
            self.env["PYTHONWARNINGS"] = "ignore"
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "local"\n\n'
            f'[superlink.local]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        if lock is not None:
            lock.note(str(self.home))
        # the watchdog first: from here on, nothing of the run can outlive this process
        self.watchdog = Watchdog(self.home, lock)
        # then the run's weight store (simulation.transport: shared), which the
        # watchdog's teardown removes with the home: its folder, or why there is none
        self.store_root, self.store_note = "", ""
        if weight_store:
            from fedrcl_flwr.weight_store import create_store

            try:
                self.store_root = str(create_store(self.home).root)
            except OSError as exc:
                self.store_note = f"{type(exc).__name__}: {exc}"

    def start(self, timeout: float = 60.0) -> None:
        self._log = open(self.log_path, "ab")
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


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (quotes, backslashes and control characters
    escaped), so any path reaches Flower's run config unchanged."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _one_line_error(text: str) -> str:
    """The final line of the last traceback in a log (``Type: message``), or the last
    non-empty line."""
    rows = [r for r in text.splitlines() if r.strip()]
    starts = [i for i, r in enumerate(rows) if "Traceback" in r]
    if starts:
        block = rows[starts[-1] + 1 :]
        for r in block:
            if not r.startswith((" ", "\t")) and ":" in r:
                return " ".join(r.split())[:600]
    return " ".join(rows[-1].split())[:600] if rows else "(no log)"


def run_simulation_via_flower(
    cfg: ExperimentConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    verbose: bool = False,
    poll_s: float = 0.25,
    status_every_s: float = 1.0,
    lock: OutputLock | None = None,
    dataset_entry: Path | None = None,
) -> dict:
    """Run the experiment whose resolved config is ``out_dir/config.yaml``; return the
    summary. Raises :class:`RunFailed` when the run did not complete (one line; the
    details are in ``run.log``), including when it stays ``pending``/``starting`` longer
    than ``simulation.startup_timeout_s``. ``dataset_entry``: the dataset cache entry the
    CLI prepared (every Flower process then only opens it). The inputs were checked by
    :func:`fedrcl_flwr.run.preflight.before_run`. The run's start-up, phase by phase, goes to
    ``flower.log`` (``fedrcl-flwr timing:`` lines).

    Steps (module docstring): a private SuperLink (:class:`LocalSuperLink`, its watchdog
    first), the run submitted (:func:`_submit`), followed until it finishes
    (:class:`_RunFollower`), its log fetched, everything torn down."""
    from fedrcl_flwr.app.control import ControlClient
    from fedrcl_flwr.app.transport import fallback_reason

    t0 = time.time()
    app = find_app_dir()
    out_dir = out_dir.resolve()
    link = LocalSuperLink(
        out_dir / FLOWER_LOG,
        verbose=verbose,
        lock=lock,
        ray_address=cfg.simulation.ray_address,
        weight_store=fallback_reason(cfg) is None,
    )
    printed = len(read_metrics(out_dir)) if resume else 0
    control = None
    timing = [("watchdog", time.time() - t0)]
    try:
        link.start()
        timing.append(("superlink healthy", time.time() - t0))
        run_id = _submit(cfg, link, app, out_dir, resume=resume, dataset_entry=dataset_entry)
        control = ControlClient(link.home, link.address)
        timing.append(("run submitted", time.time() - t0))
        follower = _RunFollower(cfg, out_dir, link, control, run_id, printed, timing, t0)
        status = follower.follow(poll_s, status_every_s)
        timing.append(("run finished", time.time() - t0))
        logs = control.logs(run_id)
        (out_dir / RUN_LOG).write_text(logs)
        if status != "finished:completed":
            raise RunFailed(
                f"{_one_line_error(logs)} (status '{status}'; details in {out_dir / RUN_LOG})"
            )
    finally:
        if control is not None:
            control.close()
        link.stop()
        timing.append(("torn down", time.time() - t0))
        _log_timing(link.log_path, timing)
    summary_path = out_dir / SUMMARY_FILE
    if not summary_path.exists():
        raise RunFailed(f"run completed but wrote no {summary_path}")
    return json.loads(summary_path.read_text())


def _submit(
    cfg: ExperimentConfig,
    link: LocalSuperLink,
    app: Path,
    out_dir: Path,
    *,
    resume: bool,
    dataset_entry: Path | None,
) -> int:
    """Submit the run to ``link`` (``flwr run``, in this process) with its run config
    (``[tool.flwr.app.config]`` keys, written to the private home) and the federation
    sized from the experiment; returns the run id."""
    from fedrcl_flwr.app.control import submit

    nodes = cfg.supernodes()
    run_config = link.home / "run-config.toml"
    run_config.write_text(
        f"experiment = {toml_string(str(out_dir / CONFIG_FILE))}\n"
        f"output-dir = {toml_string(str(out_dir))}\n"
        f"resume = {toml_string('true' if resume else 'false')}\n"
        f"expected-nodes = {int(nodes)}\n"
        f"dataset-cache = {toml_string(str(dataset_entry or ''))}\n"
        f"weight-store = {toml_string(link.store_root)}\n"
        f"weight-store-note = {toml_string(link.store_note)}\n"
    )
    run_id, output = submit(link.home, app, "local", run_config, federation_config(cfg))
    if run_id is None:
        raise RunFailed(f"flwr run failed to submit the run: {_one_line_error(output)}")
    return run_id


class _RunFollower:
    """Follows a submitted run until it finishes: prints one line per round recorded in
    ``metrics.jsonl``, asks the run's status every ``status_every_s`` seconds (``ListRuns``:
    a failed run can look like a submitted one), gives up on a run that never starts
    (``simulation.startup_timeout_s``, flwr issue #7953) or a SuperLink that died."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        out_dir: Path,
        link: LocalSuperLink,
        control: Any,
        run_id: int,
        printed: int,
        timing: list,
        t0: float,
    ):
        self.cfg, self.out_dir, self.link = cfg, out_dir, link
        self.control, self.run_id = control, run_id
        self.printed = printed  # round records printed (or kept from before a resume)
        self.timing, self.t0 = timing, t0
        self.started = False
        self.submitted = time.time()
        self.summary_path = out_dir / SUMMARY_FILE
        self.summary_before = _mtime(self.summary_path)

    def follow(self, poll_s: float, status_every_s: float) -> str:
        """The run's final status (``finished:completed`` when it completed)."""
        status, last_check = "", 0.0
        while True:
            self._print_new_rounds()
            if _mtime(self.summary_path) != self.summary_before:
                # the ServerApp writes summary.json last, after every other result: the run
                # is complete; do not wait for Flower to stop its actors and Ray (seconds)
                status = self.control.status(self.run_id)
                return status if status.startswith("finished") else "finished:completed"
            if time.time() - last_check >= status_every_s:
                status, last_check = self.control.status(self.run_id), time.time()
                if status.startswith("finished"):
                    return status
                self._check_started(status)
            link_proc = self.link.proc
            assert link_proc is not None  # started before the run was submitted
            if link_proc.poll() is not None:
                raise RunFailed(
                    f"the SuperLink died (exit {link_proc.returncode}); see {self.link.log_path}"
                )
            time.sleep(poll_s)

    def _print_new_rounds(self) -> None:
        recs = read_metrics(self.out_dir)
        if len(recs) > self.printed and len(self.timing) < 4:
            first = recs[self.printed]
            self.timing.append(
                (
                    "first round started",
                    time.time() - self.t0 - float(first.get("round_time_s", 0.0)),
                )
            )
        for rec in recs[self.printed :]:
            print(
                format_round_line(
                    rec, self.cfg.federation.rounds, shows_ema(self.cfg.evaluation.report_metric)
                ),
                flush=True,
            )
        self.started = self.started or len(recs) > self.printed
        self.printed = max(self.printed, len(recs))

    def _check_started(self, status: str) -> None:
        self.started = self.started or status == "running"
        waited = time.time() - self.submitted
        if not self.started and waited > self.cfg.simulation.startup_timeout_s:
            raise RunFailed(
                f"run {self.run_id} did not start: still '{status or 'unknown'}' after "
                f"{waited:.0f}s (simulation.startup_timeout_s="
                f"{self.cfg.simulation.startup_timeout_s:g}; a known Flower problem, "
                f"flwr issue #7953); see {self.link.log_path}"
            )


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _log_timing(log_path: Path, timing: list) -> None:
    """Append the run's phases (seconds since the runner started) to ``flower.log``."""
    try:
        with open(log_path, "a") as fh:
            fh.write(
                "fedrcl-flwr timing: " + ", ".join(f"{name} {t:.2f}s" for name, t in timing) + "\n"
            )
    except OSError:
        pass


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "watch":
    watch(sys.argv[2])
