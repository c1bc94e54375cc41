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

The SuperLink's lifecycle is :mod:`fedrcl_flwr.launch.superlink`, the following of the run
and its progress lines :mod:`fedrcl_flwr.launch.follower`; this module submits the run,
keeps its logs and drives the steps.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.errors import RunFailed
from fedrcl_flwr.launch.follower import RunFollower, StartupProgress
from fedrcl_flwr.launch.processes import OutputLock
from fedrcl_flwr.launch.superlink import LocalSuperLink
from fedrcl_flwr.run.results import atomic_write_text, read_metrics
from fedrcl_flwr.run.run_files import (
    CONFIG_FILE,
    FLOWER_LOG,
    RUN_LOG,
    SUMMARY_FILE,
    append_file,
    new_file,
)


def find_app_dir() -> Path:
    """The Flower app directory (the project root with ``pyproject.toml``)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        raise RunFailed(
            f"cannot find the Flower app (pyproject.toml) next to {root}; install the "
            "project in editable mode: pip install -e ."
        )
    return root


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


# failures whose cause lies outside the experiment, as Ray or Flower word them, and what
# they mean for the user (appended to the one-line error)
RAY_NODE_START_TIMEOUT = "The current node timed out during startup"


def _known_cause(text: str) -> str:
    """What a failure of the runtime in ``text`` means, or ``""``. Ray waits a fixed 30 s
    (not configurable, ``ray._private.node``) for its node to register; on a machine busy
    with other work that start-up can take longer, and the run fails before any of the
    experiment ran."""
    if RAY_NODE_START_TIMEOUT in text:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        return (
            f" -- Ray's node did not start within Ray's fixed 30 s (load average now "
            f"{load:.1f} on {os.cpu_count()} CPUs): nothing of the experiment ran; start it "
            "again when the machine is less busy"
        )
    return ""


def _one_line_error(text: str) -> str:
    """The final line of the last traceback in a log (``Type: message``), or the last
    non-empty line; followed by what it means when the runtime failed for a known reason
    outside the experiment (:func:`_known_cause`)."""
    rows = [r for r in text.splitlines() if r.strip()]
    starts = [i for i, r in enumerate(rows) if "Traceback" in r]
    line = " ".join(rows[-1].split())[:600] if rows else "(no log)"
    if starts:
        block = rows[starts[-1] + 1 :]
        for r in block:
            if not r.startswith((" ", "\t")) and ":" in r:
                line = " ".join(r.split())[:600]
                break
    return line + _known_cause(text)


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
    summary. Raises :class:`~fedrcl_flwr.errors.RunFailed` when the run did not complete
    (one line; the details are in ``run.log``), including when it stays
    ``pending``/``starting`` longer than ``simulation.startup_timeout_s``.
    ``dataset_entry``: the dataset cache entry the CLI prepared (every Flower process then
    only opens it). The inputs were checked by :func:`fedrcl_flwr.launch.preflight.
    before_run`. The start-up, phase by phase, goes to ``flower.log`` (``fedrcl-flwr
    timing:`` lines). Steps (module docstring): a private SuperLink
    (:class:`LocalSuperLink`, its watchdog first), the run submitted (:func:`_submit`),
    followed until it finishes (:class:`~fedrcl_flwr.launch.follower.RunFollower`), its
    log fetched, everything torn down."""
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
    printed = _resume_point(cfg, out_dir) if resume else 0
    control = None
    timing = [("watchdog", time.time() - t0)]
    startup = StartupProgress(t0, link.progress_path)
    try:
        _start_link(link, startup, timing, t0)
        run_id = _submit(cfg, link, app, out_dir, resume=resume, dataset_entry=dataset_entry)
        control = ControlClient(link.home, link.address)
        timing.append(("run submitted", time.time() - t0))
        startup.say(
            f"run {run_id} submitted; Flower starts the simulation process, Ray and the ServerApp"
        )
        follower = RunFollower(cfg, out_dir, link, control, run_id, printed, timing, t0)
        follower.startup = startup
        status = follower.follow_to_end(poll_s, status_every_s)
        logs = _keep_run_log(control.logs(run_id), out_dir)
        if status != "finished:completed":
            raise RunFailed(
                f"{_one_line_error(logs)} (status '{status}'; details in {out_dir / RUN_LOG})"
            )
    finally:
        _tear_down(link, control, timing, t0)
    return _written_summary(out_dir)


def _written_summary(out_dir: Path) -> dict:
    """The ``summary.json`` the completed run wrote (:class:`~fedrcl_flwr.errors.RunFailed`
    when there is none)."""
    summary_path = out_dir / SUMMARY_FILE
    if not summary_path.exists():
        raise RunFailed(f"run completed but wrote no {summary_path}")
    return json.loads(summary_path.read_text())


def _tear_down(link: LocalSuperLink, control, timing: list, t0: float) -> None:
    """Close the run's Control API client, tear the run down (:meth:`LocalSuperLink.stop`)
    and leave ``flower.log`` without the status polling and with the run's phases."""
    if control is not None:
        control.close()
    link.stop()
    timing.append(("torn down", time.time() - t0))
    drop_polling_lines(link.log_path)
    _log_timing(link.log_path, timing)


def _resume_point(cfg: ExperimentConfig, out_dir: Path) -> int:
    """How many round records the resumed run keeps (those the ServerApp keeps: up to the
    checkpoint's round), after printing what it continues (:func:`resume_line`)."""
    done = checkpoint_round(out_dir, read_metrics(out_dir))
    kept = [r for r in read_metrics(out_dir) if int(r["round"]) <= done]
    print(resume_line(out_dir, cfg.federation.rounds, done), flush=True)
    return len(kept)


def _start_link(link: LocalSuperLink, startup: StartupProgress, timing: list, t0: float) -> None:
    """Start the SuperLink and wait until it answers; Flower's CLI modules (what ``flwr
    run`` needs, ~0.25 s of imports) load while this process waits, not after."""
    startup.say("starting a private Flower SuperLink")
    preload = threading.Thread(target=_import_flower_cli, name="fedrcl-flwr-cli-import")
    preload.start()
    link.start()
    preload.join()
    timing.append(("superlink healthy", time.time() - t0))
    startup.say(f"SuperLink up on {link.address}; submitting the run")


def _keep_run_log(flower_logs: str, out_dir: Path) -> str:
    """The run's log (:func:`readable_log`), written to ``run.log`` whole or not at all (a
    full disk); a tracker the ServerApp dropped (:mod:`fedrcl_flwr.tracking`) is also said
    on stderr."""
    logs = readable_log(flower_logs)
    atomic_write_text(out_dir / RUN_LOG, logs)
    for line in logs.splitlines():
        if line.startswith("[fedrcl-flwr] tracker ") and " is dropped " in line:
            print(f"fedrcl-flwr: {line.split('] ', 1)[1].strip()}", file=sys.stderr)
    return logs


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
