"""Following a submitted run from this process: its start-up phases, one line each, as
they happen (:class:`StartupProgress`: the runner's steps, the run's Flower status, the
ServerApp's start-up events of :mod:`fedrcl_flwr.run.timers`), then one line per round
recorded in ``metrics.jsonl`` (:mod:`fedrcl_flwr.run.progress`), until the run finishes,
never starts (``simulation.startup_timeout_s``) or its SuperLink dies
(:class:`RunFollower`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fedrcl_flwr.config import ExperimentConfig
from fedrcl_flwr.errors import RunFailed
from fedrcl_flwr.launch.superlink import LocalSuperLink
from fedrcl_flwr.run import timers
from fedrcl_flwr.run.progress import format_round_line, round_eta, shows_ema
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.run.run_files import SUMMARY_FILE


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


class RunFollower:
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

    def follow_to_end(self, poll_s: float, status_every_s: float) -> str:
        """:meth:`follow`, then the last rounds' lines (also of a failed run); the run's
        final status."""
        status = self.follow(poll_s, status_every_s)
        self.print_new_rounds()
        self.timing.append(("run finished", time.time() - self.t0))
        return status

    def follow(self, poll_s: float, status_every_s: float) -> str:
        """The run's final status (``finished:completed`` when it completed)."""
        status, last_check = "", 0.0
        while True:
            self.print_new_rounds()
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

    def print_new_rounds(self) -> None:
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
