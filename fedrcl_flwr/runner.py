"""Run an experiment as a Flower simulation through Flower's runtime.

``run_simulation()`` is deprecated, so the CLI does what ``flwr run`` users do, but owns
every process it starts:

1. a private ``FLWR_HOME`` (temporary) and a free loopback port;
2. ``flower-superlink --simulation`` without runtime dependency installation, in its own
   process group;
3. ``flwr run <app> <connection>`` with the experiment (the resolved ``config.yaml`` in
   the output directory, an absolute path) and the federation sized from the YAML
   (``--federation-config num-supernodes=... client-resources-...``);
4. polling the run's status (``flwr list --run-id``), because ``flwr run`` can exit 0
   for a failed run, while printing one line per evaluated round from ``metrics.jsonl``;
5. tearing the SuperLink, the simulation process and Ray down, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.results import format_round_line, read_metrics


class RunFailed(RuntimeError):
    pass


def find_app_dir() -> Path:
    """The Flower app directory (the project root with ``pyproject.toml``)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        raise RunFailed(
            f"cannot find the Flower app (pyproject.toml) next to {root}; install the "
            "project in editable mode: pip install -e .")
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
    nodes = s.num_supernodes or cfg.federation.num_clients
    items = [f"num-supernodes={nodes}", f"client-resources-num-cpus={int(s.num_cpus)}",
             f"client-resources-num-gpus={float(s.num_gpus)}"]
    if s.init_num_cpus:
        items.append(f"init-args-num-cpus={int(s.init_num_cpus)}")
    if s.init_num_gpus is not None:
        items.append(f"init-args-num-gpus={float(s.init_num_gpus)}")
    return " ".join(items)


def check_resources(cfg: ExperimentConfig) -> None:
    """Fail fast (instead of Ray's 'ActorPool is empty') when GPUs are requested but
    absent, or a client wants more CPUs than the machine has."""
    if cfg.simulation.num_gpus > 0:
        import torch

        if not torch.cuda.is_available():
            raise RunFailed(
                f"simulation.num_gpus={cfg.simulation.num_gpus} but no CUDA GPU is visible "
                "on this machine; set simulation.num_gpus=0 (and client.device=cpu)")
    ncpu = os.cpu_count() or 1
    cap = cfg.simulation.init_num_cpus or ncpu
    if cfg.simulation.num_cpus > cap:
        raise RunFailed(
            f"simulation.num_cpus={cfg.simulation.num_cpus} per client exceeds the "
            f"{cap} CPUs available to Ray; no client could ever be scheduled")


class LocalSuperLink:
    """A private simulation SuperLink on loopback, stopped by :meth:`stop`."""

    def __init__(self, log_path: Path, verbose: bool = False):
        self.home = Path(tempfile.mkdtemp(prefix="fedrcl-flwr-home-"))
        self.port = free_port()
        self.log_path = log_path
        self.verbose = verbose
        self.proc: Optional[subprocess.Popen] = None
        self.env = dict(os.environ)
        self.env["FLWR_HOME"] = str(self.home)
        self.env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        self.env.setdefault("RAY_DEDUP_LOGS", "1")
        self.env.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        if not verbose:
            self.env["PYTHONWARNINGS"] = "ignore"
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "local"\n\n'
            f'[superlink.local]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n')

    def start(self, timeout: float = 60.0) -> None:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [_bin("flower-superlink"), "--simulation", "--insecure", "--host", "127.0.0.1",
             "--port", str(self.port), "--disable-runtime-dependency-installation"],
            stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True, cwd=str(self.home))
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RunFailed(f"flower-superlink exited with code {self.proc.returncode}; "
                                f"see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RunFailed(f"flower-superlink did not become healthy in {timeout:.0f}s; "
                        f"see {self.log_path}")

    def flwr(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
        return subprocess.run([_bin("flwr"), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, cwd=str(self.home))

    def stop(self) -> None:
        """SIGTERM the SuperLink's process group (it contains the simulation process and
        the Ray workers it started), then SIGKILL what is left."""
        if self.proc is not None and self.proc.poll() is None:
            pgid = os.getpgid(self.proc.pid)
            for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.proc is not None:
            try:  # stragglers of the group (Ray workers) after the leader exited
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _kill_ray_of(self.home)
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self.home, ignore_errors=True)


def procs_with(marker: str) -> list[int]:
    """PIDs (other than ours) of processes whose environment contains ``marker``, e.g.
    ``FLWR_HOME=<a run's private home>``: what a run started."""
    needle = marker.encode()
    pids = []
    for pid_dir in Path("/proc").glob("[0-9]*"):
        try:
            if pid_dir.name != str(os.getpid()) and needle in (pid_dir / "environ").read_bytes():
                pids.append(int(pid_dir.name))
        except (OSError, ValueError):
            continue
    return pids


def _kill_ray_of(home: Path, timeout: float = 15.0) -> None:
    """Ray may daemonise (own session) and its raylet may still be spawning workers while
    we kill: SIGKILL every process whose environment names our private FLWR_HOME, and
    repeat until none is left (or ``timeout`` passes)."""
    deadline = time.time() + timeout
    while True:
        pids = procs_with(str(home))  # Ray's DashboardAgent has no FLWR_HOME, but the
        # app's path under the home in its PYTHONPATH
        if not pids or time.time() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


def _run_id(text: str) -> Optional[int]:
    try:
        data = json.loads(text)
        if isinstance(data, dict) and "run-id" in data:
            return int(data["run-id"])
    except (json.JSONDecodeError, ValueError, TypeError):
        pass
    m = re.search(r"run[- _]?id[^0-9]*(\d+)", text, re.IGNORECASE)
    return int(m.group(1)) if m else None


def _status(link: LocalSuperLink, run_id: int) -> str:
    res = link.flwr("list", "local", "--run-id", str(run_id), "--format", "json",
                    timeout=60)
    try:
        data = json.loads(res.stdout)
        runs = data.get("runs", [])
        if runs:
            return str(runs[0].get("status", ""))
    except (json.JSONDecodeError, AttributeError):
        pass
    return ""


def run_simulation_via_flower(cfg: ExperimentConfig, out_dir: Path, *, resume: bool = False,
                              verbose: bool = False, poll_s: float = 0.5,
                              status_every_s: float = 5.0) -> dict:
    """Run the experiment whose resolved config is ``out_dir/config.yaml``; return the
    summary. Raises :class:`RunFailed` when the run did not complete."""
    check_resources(cfg)
    app = find_app_dir()
    out_dir = out_dir.resolve()
    config_path = out_dir / "config.yaml"
    link = LocalSuperLink(out_dir / "flower.log", verbose=verbose)
    printed = 0
    if resume:
        printed = len(read_metrics(out_dir))
    try:
        link.start()
        run_config = (f'experiment="{config_path}" output-dir="{out_dir}" '
                      f'resume="{"true" if resume else "false"}" '
                      f'expected-nodes={cfg.simulation.num_supernodes or cfg.federation.num_clients}')
        res = link.flwr("run", str(app), "local", "--run-config", run_config,
                        "--federation-config", federation_config(cfg), "--format", "json")
        run_id = _run_id(res.stdout + "\n" + res.stderr)
        if res.returncode != 0 or run_id is None:
            raise RunFailed(f"flwr run failed to submit the run (exit {res.returncode}):\n"
                            f"{(res.stdout + res.stderr).strip()[-2000:]}")
        status, last_check = "", 0.0
        summary_path = out_dir / "summary.json"
        summary_before = summary_path.stat().st_mtime if summary_path.exists() else None
        while True:
            recs = read_metrics(out_dir)
            for rec in recs[printed:]:
                print(format_round_line(rec, cfg.federation.rounds), flush=True)
            printed = max(printed, len(recs))
            # each status query starts a `flwr` process (~1 s of CPU taken from training):
            # ask every status_every_s, and every second once the run has written its summary
            summary_now = summary_path.stat().st_mtime if summary_path.exists() else None
            ending = summary_now is not None and summary_now != summary_before
            if time.time() - last_check >= (1.0 if ending else status_every_s):
                status, last_check = _status(link, run_id), time.time()
                if status.startswith("finished"):
                    break
            if link.proc.poll() is not None:
                raise RunFailed(f"the SuperLink died (exit {link.proc.returncode}); "
                                f"see {link.log_path}")
            time.sleep(poll_s)
        logs = link.flwr("log", str(run_id), "local", "--show", timeout=60)
        (out_dir / "run.log").write_text(logs.stdout + logs.stderr)
        if status != "finished:completed":
            tail = _error_tail(logs.stdout + logs.stderr)
            raise RunFailed(f"run {run_id} ended with status '{status}'.\n{tail}\n"
                            f"(full log: {out_dir / 'run.log'})")
    finally:
        link.stop()
    summary_path = out_dir / "summary.json"
    if not summary_path.exists():
        raise RunFailed(f"run completed but wrote no {summary_path}")
    return json.loads(summary_path.read_text())


def _error_tail(text: str, lines: int = 12) -> str:
    """The end of the last traceback in a log (its final line names the error)."""
    rows = [r for r in text.splitlines() if r.strip()]
    starts = [i for i, r in enumerate(rows) if "Traceback" in r]
    if starts:
        block = rows[starts[-1]:]
        end = next((i for i, r in enumerate(block) if i > 0 and not r.startswith((" ", "\t"))
                    and "Traceback" not in r and ":" in r), len(block) - 1)
        block = block[: end + 1]
        return "\n".join(block[-lines:])
    return "\n".join(rows[-lines:])
