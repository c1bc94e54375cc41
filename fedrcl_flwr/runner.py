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

Teardown is one mechanism, the *watchdog* of :mod:`fedrcl_flwr.launch.processes` (with the
output directory's lock, :class:`~fedrcl_flwr.launch.processes.OutputLock`), which the CLI
starts first; it stops every process of the run whatever happened, ``kill -9`` of the CLI
included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.launch.processes import (
    HOME_PREFIX,
    RUN_VAR,
    OutputLock,
    Watchdog,
    reap_stale_runs,
    teardown,
)
from fedrcl_flwr.run import timers
from fedrcl_flwr.run.results import (
    atomic_write_text,
    format_round_line,
    read_metrics,
    round_eta,
    shows_ema,
)
from fedrcl_flwr.run.run_files import (
    CONFIG_FILE,
    FLOWER_LOG,
    RUN_LOG,
    SUMMARY_FILE,
    append_file,
    new_file,
)


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
            # Ray's session files (logs, sockets, spilled objects) inside the home, so the
            # teardown removes them with it; Ray's default (``$TMPDIR/ray``) kept one
            # session directory per run forever
            if ray_sockets_fit(self.home):
                self.env["RAY_TMPDIR"] = str(self.home)
        if not verbose:
            self.env["PYTHONWARNINGS"] = "ignore"
        # the ServerApp's start-up events, for the CLI's progress lines (run/timers.py)
        self.progress_path = self.home / "progress.jsonl"
        self.env[timers.PROGRESS_VAR] = str(self.progress_path)
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "local"\n\n'
            f'[superlink.local]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        if lock is not None:
            lock.note(str(self.home))
        # the watchdog first: from here on, nothing of the run can outlive this process
        self.watchdog = Watchdog(self.home, lock)
        # then the run's weight store (simulation.transport: shared), owned by this
        # process and the watchdog, whose teardown removes it: its folder, or why there
        # is none
        self.store_root, self.store_note = "", ""
        if weight_store:
            from fedrcl_flwr.weight_store import create_store

            try:
                store = create_store(owners=[self.watchdog.proc.pid], home=self.home)
                self.store_root = str(store.root)
            except OSError as exc:
                self.store_note = f"{type(exc).__name__}: {exc}"

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


# an ANSI escape sequence (CSI: colours, cursor moves) as Flower's log lines carry them
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# Flower's own lines about the simulation's size that do not apply here: the runner sizes
# every federation itself (``num-supernodes`` from ``simulation.num_supernodes``, see
# :func:`federation_config`), so "default ... changed from 10 to 2" and the command to
# resize it would contradict the "N simulated SuperNodes" line that follows
_FLOWER_SIZE_HINTS = (
    "default simulated SuperNodes changed from",
    "To change federation size, use the following command",
    "flwr federation simulation-config",
)


def readable_log(text: str) -> str:
    """The run's log as ``run.log`` keeps it: Flower's log without ANSI escape sequences
    (colour codes a text file shows as ``^[[92m``) and without Flower's hints about the
    default federation size (:data:`_FLOWER_SIZE_HINTS`); every other line as is."""
    lines = _ANSI.sub("", text).splitlines(keepends=True)
    return "".join(r for r in lines if not any(h in r for h in _FLOWER_SIZE_HINTS))


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
    :func:`fedrcl_flwr.launch.preflight.before_run`. The run's start-up, phase by phase, goes to
    ``flower.log`` (``fedrcl-flwr timing:`` lines).

    Steps (module docstring): a private SuperLink (:class:`LocalSuperLink`, its watchdog
    first), the run submitted (:func:`_submit`), followed until it finishes
    (:class:`_RunFollower`), its log fetched, everything torn down."""
    from fedrcl_flwr.app.control import ControlClient
    from fedrcl_flwr.app.wire.transport import fallback_reason

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
    kept: list[dict] = []
    if resume:  # the records the ServerApp keeps: those up to the checkpoint's round
        done = checkpoint_round(out_dir, read_metrics(out_dir))
        kept = [r for r in read_metrics(out_dir) if int(r["round"]) <= done]
        print(resume_line(out_dir, cfg.federation.rounds, done), flush=True)
    printed = len(kept)
    control = None
    timing = [("watchdog", time.time() - t0)]
    startup = StartupProgress(t0, link.progress_path)
    try:
        startup.say("starting a private Flower SuperLink")
        # Flower's CLI modules (what ``flwr run`` needs, ~0.25 s of imports) load while
        # this process waits for the SuperLink to answer, not after
        preload = threading.Thread(target=_import_flower_cli, name="fedrcl-flwr-cli-import")
        preload.start()
        link.start()
        preload.join()
        timing.append(("superlink healthy", time.time() - t0))
        startup.say(f"SuperLink up on {link.address}; submitting the run")
        run_id = _submit(cfg, link, app, out_dir, resume=resume, dataset_entry=dataset_entry)
        control = ControlClient(link.home, link.address)
        timing.append(("run submitted", time.time() - t0))
        startup.say(
            f"run {run_id} submitted; Flower starts the simulation process, Ray and the ServerApp"
        )
        follower = _RunFollower(cfg, out_dir, link, control, run_id, printed, timing, t0)
        follower.startup = startup
        status = follower.follow(poll_s, status_every_s)
        follower._print_new_rounds()  # the last rounds' lines, also of a failed run
        timing.append(("run finished", time.time() - t0))
        logs = readable_log(control.logs(run_id))
        atomic_write_text(out_dir / RUN_LOG, logs)  # whole or absent (a full disk)
        for line in logs.splitlines():  # a tracker dropped by the ServerApp (tracking/)
            if line.startswith("[fedrcl-flwr] tracker ") and " is dropped " in line:
                print(f"fedrcl-flwr: {line.split('] ', 1)[1].strip()}", file=sys.stderr)
        if status != "finished:completed":
            raise RunFailed(
                f"{_one_line_error(logs)} (status '{status}'; details in {out_dir / RUN_LOG})"
            )
    finally:
        if control is not None:
            control.close()
        link.stop()
        timing.append(("torn down", time.time() - t0))
        drop_polling_lines(link.log_path)
        _log_timing(link.log_path, timing)
    summary_path = out_dir / SUMMARY_FILE
    if not summary_path.exists():
        raise RunFailed(f"run completed but wrote no {summary_path}")
    return json.loads(summary_path.read_text())


def _import_flower_cli() -> None:
    """Import the Flower modules :func:`_submit` and the run's Control API client use
    (``fedrcl_flwr.app.wire.flower_private``); a failure is left to the real call to report."""
    from fedrcl_flwr.app.wire import flower_private

    try:
        flower_private.cli_run()
        flower_private.control_http_client()
    except Exception:  # noqa: BLE001 - raised again, with context, where it is used
        pass


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


def checkpoint_round(out_dir: Path, records: list[dict]) -> int:
    """The round of ``out_dir``'s checkpoint (the last recorded round where it cannot be
    read: the ServerApp reads it again and says what is wrong)."""
    from fedrcl_flwr.run.checkpoint import load_checkpoint

    try:
        return int(load_checkpoint(out_dir)["round"])
    except Exception:  # noqa: BLE001 - see above
        return int(records[-1]["round"]) if records else 0


def resume_line(out_dir: Path, total_rounds: int, done: int) -> str:
    """What ``run --resume`` continues: ``resuming DIR from its checkpoint at round N:
    rounds N+1..R``."""
    todo = f"rounds {done + 1}..{total_rounds}" if done < total_rounds else "no round left"
    return f"fedrcl-flwr: resuming {out_dir} from its checkpoint at round {done}: {todo}"


class StartupProgress:
    """The run's start-up phases as they happen, one line each (``fedrcl-flwr: [  4.1s]
    ...``, seconds since the runner started): the runner's own steps (:meth:`say`), the
    run's Flower status as it changes (:meth:`status`), and the ServerApp's start-up events
    read from the run's progress file (:meth:`poll`; written by
    :func:`fedrcl_flwr.run.timers.server_event`). Ends at the first round's record."""

    WHAT = {
        "serverapp_start": "the ServerApp's process is up (Python and the project imported)",
        "serverapp_built": "the ServerApp built the data, the model and the strategy",
        "sent": "round {round} sent to {clients} clients: training (the first round also "
        "starts Ray's client workers)",
    }

    def __init__(self, t0: float, path: Path | None):
        self.t0, self.path = t0, path
        self.seen: set = set()
        self.last_status = ""
        self.done = False

    def say(self, text: str, at: float | None = None) -> None:
        if self.done:
            return
        t = (time.time() if at is None else at) - self.t0
        print(f"fedrcl-flwr: [{t:6.1f}s] {text}", flush=True)

    def status(self, status: str) -> None:
        if status and status != self.last_status and not status.startswith("finished"):
            self.last_status = status
            self.say(f"Flower: the run is {status}")

    def poll(self) -> None:
        if self.done or self.path is None:
            return
        for rec in timers.read_progress(self.path):
            event = rec["event"]
            if event in self.seen or event not in self.WHAT:
                continue
            self.seen.add(event)
            try:
                text = self.WHAT[event].format(**rec)
            except (KeyError, IndexError, ValueError):
                text = event
            self.say(text, at=float(rec.get("t", time.time())))


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
        self.kept = printed  # records kept from before a resume (not of this process)
        self.timing, self.t0 = timing, t0
        self.started = False
        self.submitted = time.time()
        self.summary_path = out_dir / SUMMARY_FILE
        self.summary_before = _mtime(self.summary_path)
        self.startup: StartupProgress | None = None

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
                if self.startup is not None and not self.started:
                    self.startup.status(status)
                self._check_started(status)
            link_proc = self.link.proc
            assert link_proc is not None  # started before the run was submitted
            if link_proc.poll() is not None:
                raise RunFailed(
                    f"the SuperLink died (exit {link_proc.returncode}); see {self.link.log_path}"
                )
            time.sleep(poll_s)

    def _print_new_rounds(self) -> None:
        if self.startup is not None:
            self.startup.poll()
        recs = read_metrics(self.out_dir)
        if len(recs) > self.printed and self.startup is not None:
            self.startup.done = True  # from here on, the round lines say how it goes
        if len(recs) > self.printed and len(self.timing) < 4:
            first = recs[self.printed]
            self.timing.append(
                (
                    "first round started",
                    time.time() - self.t0 - float(first.get("round_time_s", 0.0)),
                )
            )
        for i in range(self.printed, len(recs)):
            total = self.cfg.federation.rounds
            eta = round_eta(recs[self.kept : i + 1], total)
            print(
                format_round_line(
                    recs[i], total, shows_ema(self.cfg.evaluation.report_metric), eta_s=eta
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


# what the CLI's own status polling (ControlClient.status: ListRuns, once a second)
# leaves in the SuperLink's log: Flower's servicer line and the HTTP access line
POLLING_LINES = ("ControlServicer.ListRuns", '"POST /v1/control/list-runs ')


def drop_polling_lines(log_path: Path) -> int:
    """Remove the CLI's status polling from ``flower.log`` (:data:`POLLING_LINES`, about
    90 % of a quickstart's log) once the run is over; every other line stays, in order.
    Appends one line saying how many were dropped; returns that number."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return 0
    lines = text.splitlines(keepends=True)
    kept = [ln for ln in lines if not any(p in ln for p in POLLING_LINES)]
    dropped = len(lines) - len(kept)
    if dropped:
        kept.append(
            f"fedrcl-flwr: {dropped} lines of the CLI's run-status polling (ListRuns) "
            "left out of this log\n"
        )
        try:
            tmp = Path(log_path).with_name(Path(log_path).name + ".tmp")
            with new_file(tmp, "w") as fh:
                fh.write("".join(kept))
            os.replace(tmp, log_path)
        except OSError:
            return 0
    return dropped


def _log_timing(log_path: Path, timing: list) -> None:
    """Append the run's phases (seconds since the runner started) to ``flower.log``."""
    try:
        with append_file(log_path) as fh:
            fh.write(
                "fedrcl-flwr timing: " + ", ".join(f"{name} {t:.2f}s" for name, t in timing) + "\n"
            )
    except OSError:
        pass
