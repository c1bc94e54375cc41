"""Running a planned sweep (:func:`run_sweep`): the runs not finished yet, ``jobs`` at
once, each as its own ``run`` command (``python -m fedrcl_flwr.cli run``: the runner's
private SuperLink, free port and teardown) in a process group of its own.
:mod:`fedrcl_flwr.launch.sweep_spec` reads and expands the sweep file,
:mod:`fedrcl_flwr.launch.plan` holds the planned runs, their states, the take-over of
directories of an earlier plan (:func:`fedrcl_flwr.launch.plan.take_over_earlier_runs`)
and the dry run's listing, :mod:`fedrcl_flwr.launch.sweep_status` the ETA and the status
file's reading.

``OUT/_configs/<name>.yaml`` holds each planned configuration and ``OUT/_logs/<name>.log``
each run's output. A rerun skips runs with a ``summary.json``, resumes runs with a
``checkpoint.pt`` (``--resume``), and starts the others afresh (``run --overwrite``, which
clears only a run directory the tool created). ``OUT/sweep_status.json`` records each
run's outcome.

Safety: every path the sweep will write or remove is checked before anything is
(:func:`fedrcl_flwr.launch.preflight_sweep.check_sweep_dir`); the sweep holds ``OUT``'s lock
and its runs die with it, however it dies (:func:`run_sweep`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedrcl_flwr.config import ExperimentConfig, dump_config
from fedrcl_flwr.launch.plan import PlannedRun, _rounds_done
from fedrcl_flwr.launch.processes import (
    HOME_PREFIX,
    SWEEP_VAR,
    OutputLock,
    Watchdog,
    reap_stale_runs,
)
from fedrcl_flwr.launch.sweep_status import (
    SweepEta,
    _fmt_eta,
    _is_number,
    _log_tail,
    _read_status,
    _reported,
)
from fedrcl_flwr.run.progress import ema_note, shows_ema
from fedrcl_flwr.run.results import atomic_write_text, read_metrics
from fedrcl_flwr.run.run_files import (
    SUMMARY_FILE,
    append_file,
    sweep_config_path,
    sweep_log_path,
)
from fedrcl_flwr.run.run_files import (
    SWEEP_CONFIGS_DIR as CONFIGS_DIR,
)
from fedrcl_flwr.run.run_files import (
    SWEEP_LOGS_DIR as LOGS_DIR,
)
from fedrcl_flwr.run.run_files import (
    SWEEP_STATUS_FILE as STATUS_FILE,
)


def share_resources(cfg: ExperimentConfig, jobs: int, slot: int) -> dict:
    """Divide the machine between ``jobs`` concurrent runs: CPUs through Ray's
    ``init_num_cpus`` (unless the experiment sets it), GPUs by giving each job its own
    ``CUDA_VISIBLE_DEVICES`` when there are at least as many GPUs as jobs (otherwise the
    jobs share the GPUs, each client taking its ``simulation.num_gpus`` fraction).
    Returns the environment changes for the job."""
    env: dict[str, str] = {}
    if jobs <= 1:
        return env
    ncpu = os.cpu_count() or 1
    if cfg.simulation.init_num_cpus is None:
        cfg.simulation.init_num_cpus = max(int(cfg.simulation.num_cpus), ncpu // jobs, 1)
    if cfg.simulation.num_gpus > 0:
        try:
            import torch

            ngpu = torch.cuda.device_count()
        except Exception:  # noqa: BLE001 - no torch CUDA: leave the GPUs alone
            ngpu = 0
        if ngpu >= jobs:
            per = ngpu // jobs
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(slot * per + i) for i in range(per))
    return env


class _Job:
    def __init__(self, run: PlannedRun, proc: subprocess.Popen, slot: int, log, kept: int):
        self.run, self.proc, self.slot, self.log = run, proc, slot, log
        self.printed = kept  # last round with a progress line
        self.kept = kept  # rounds done before this launch (a resume)
        self.t0 = time.time()
        self.rounds_run = 0  # rounds recorded since the launch


def run_sweep(
    runs: list[PlannedRun],
    out_dir: Path,
    *,
    jobs: int = 1,
    verbose: bool = False,
    poll_s: float = 1.0,
) -> int:
    """Run every planned run not finished yet; returns 0, or 1 if any failed.

    The sweep holds ``out_dir``'s lock (:class:`fedrcl_flwr.launch.processes.OutputLock`: a second
    sweep there is one error naming this one's PID) and a watchdog
    (:class:`fedrcl_flwr.launch.processes.Watchdog`, the run command's teardown): every run is
    started with the sweep's private home in ``FEDRCL_FLWR_SWEEP`` and in a process group
    the watchdog knows, so when the sweep ends in any way — ``kill -9`` included — its
    runs are killed, and each run's own watchdog then stops that run's Flower and Ray
    processes. The lock is released after that teardown."""
    import tempfile

    out_dir.mkdir(parents=True, exist_ok=True)
    lock = OutputLock(out_dir, "sweep")
    lock.acquire()  # ConfigError (exit 2) naming the other sweep's PID
    reap_stale_runs()  # earlier runs and sweeps whose CLI and watchdog were both killed
    home = Path(tempfile.mkdtemp(prefix=HOME_PREFIX + "sweep-"))
    try:
        watchdog = Watchdog(home, lock)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        lock.release()
        raise
    returned = False
    try:
        rc = _SweepSession(
            runs,
            out_dir,
            jobs=jobs,
            verbose=verbose,
            poll_s=poll_s,
            watchdog=watchdog,
            env_mark={SWEEP_VAR: str(home)},
        ).execute()
        returned = True
        return rc
    finally:
        watchdog.stop()
        lock.release(remove=returned)  # as a completed run does; an interrupted one keeps it


class _SweepSession:
    """One execution of a planned sweep (:func:`run_sweep` holds the lock and the
    watchdog around it): the runs not finished yet, ``jobs`` at a time, each as a ``run``
    command of its own (``python -m fedrcl_flwr.cli run``, output to ``_logs/<run>.log``),
    one progress line per recorded round with the ETA
    (:class:`fedrcl_flwr.launch.sweep_status.SweepEta`), each run's outcome in
    ``sweep_status.json``.

    Steps: :meth:`start` (directories, the runs already done, the opening lines), then
    until nothing is queued or running: :meth:`_fill_slots` (:meth:`_launch` a queued run
    into each free slot) and :meth:`_poll` (:meth:`_progress` of each running run,
    :meth:`_ended` for those that exited); :meth:`_stop_all` on Ctrl-C / SIGTERM;
    :meth:`_close` prints the closing lines."""

    def __init__(
        self,
        runs: list[PlannedRun],
        out_dir: Path,
        *,
        jobs: int,
        verbose: bool,
        poll_s: float,
        watchdog: Any,
        env_mark: dict,
    ):
        self.runs, self.out_dir, self.jobs = runs, out_dir, jobs
        self.verbose, self.poll_s = verbose, poll_s
        self.watchdog, self.env_mark = watchdog, env_mark
        self.n = len(runs)
        self.status_path = out_dir / STATUS_FILE
        self.status: dict = {}
        self.group_env: dict = {}
        self.queue: list[PlannedRun] = []
        self.running: list[_Job] = []
        self.free_slots = list(range(jobs))
        self.failed: list[str] = []
        self.rounds_left: dict[str, int] = {}
        self.timer = SweepEta(jobs)
        self.t_start = 0.0

    def execute(self) -> int:
        """Run the sweep; 0, or 1 when a run failed."""
        self.start()
        try:
            while self.queue or self.running:
                self._fill_slots()
                time.sleep(self.poll_s)
                self._poll()
        except KeyboardInterrupt:
            self._stop_all()
            raise
        return self._close()

    # ------------------------------------------------------------------ before the runs
    def start(self) -> None:
        """The sweep's own directories and status file, the MLflow parent run of its
        groups, the runs already done marked so, the opening lines."""
        (self.out_dir / CONFIGS_DIR).mkdir(exist_ok=True)
        (self.out_dir / LOGS_DIR).mkdir(exist_ok=True)
        self.status = _read_status(self.status_path)
        from fedrcl_flwr.tracking.mlflow_backend import prepare_sweep_group

        self.group_env = prepare_sweep_group([r.cfg for r in self.runs], self.out_dir)
        for run in self.runs:
            if run.state() == "done":
                self.status[run.name] = {
                    **self.status.get(run.name, {}),
                    "status": "done",
                    "dir": str(run.out_dir),
                }
            else:
                self.queue.append(run)
        self.save_status()
        todo = self.queue
        print(
            f"fedrcl-flwr sweep: {self.n} runs, {self.n - len(todo)} finished already, "
            f"{len(todo)} to run ({self.jobs} at a time) -> {self.out_dir}",
            flush=True,
        )
        r0 = next((r for r in todo if shows_ema(r.cfg.evaluation.report_metric)), None)
        if r0 is not None:
            print(
                "fedrcl-flwr sweep: "
                + ema_note(r0.cfg.evaluation.ema, r0.cfg.evaluation.report_metric),
                flush=True,
            )
        self.rounds_left = {r.name: r.cfg.federation.rounds - _rounds_done(r) for r in todo}
        self.t_start = time.time()

    def save_status(self) -> None:
        atomic_write_text(self.status_path, json.dumps(self.status, indent=2) + "\n")

    def eta(self) -> float | None:
        return self.timer.eta(
            [max(self.rounds_left[j.run.name], 0) for j in self.running],
            [max(self.rounds_left[r.name], 0) for r in self.queue],
        )

    def _tag(self, run: PlannedRun) -> str:
        return f"run {run.index + 1}/{self.n} {run.name}"

    # ------------------------------------------------------------------ launching
    def _fill_slots(self) -> None:
        while self.queue and self.free_slots:
            job = self._launch(self.queue.pop(0))
            if job is not None:
                self.running.append(job)

    def _launch(self, run: PlannedRun) -> _Job | None:
        """Start ``run`` in the first free slot (``None``: not started, because a live
        run holds its directory: it counts as failed)."""
        holder = OutputLock.holder(run.out_dir)
        if holder is not None:  # never launched into a directory a live run holds
            msg = f"{run.out_dir} is in use by another run (PID {holder})"
            self.status[run.name] = {"status": "failed", "dir": str(run.out_dir), "error": msg}
            self.failed.append(run.name)
            self.rounds_left[run.name] = 0
            print(f"{self._tag(run)}: NOT STARTED: {msg}", file=sys.stderr, flush=True)
            self.save_status()
            return None
        slot = self.free_slots.pop(0)
        env = dict(os.environ)
        env.update(self.group_env)
        env.update(share_resources(run.cfg, self.jobs, slot))
        env.update(self.env_mark)
        resume = run.state() == "resume"
        cmd = self._command(run, resume)
        log = append_file(sweep_log_path(self.out_dir, run.name))
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        log.flush()
        # own session: a terminal's Ctrl-C reaches the sweep only, which then stops each
        # run once with SIGTERM (the run command's clean teardown); the watchdog kills the
        # session's group should the sweep die
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.watchdog.watch_group(proc.pid)
        kept = _rounds_done(run) if resume else 0
        what = f"resuming after round {kept}" if resume else "started"
        print(f"{self._tag(run)}: {what}", flush=True)
        self.status[run.name] = {"status": "running", "dir": str(run.out_dir)}
        self.save_status()
        return _Job(run, proc, slot, log, kept)

    def _command(self, run: PlannedRun, resume: bool) -> list[str]:
        """The ``run`` command of ``run`` (its planned config written to ``_configs``):
        ``--resume`` from its checkpoint, else afresh (``--overwrite`` over an attempt
        that never reached a checkpoint)."""
        cfg_path = sweep_config_path(self.out_dir, run.name)
        dump_config(run.cfg, cfg_path)
        cmd = [sys.executable, "-m", "fedrcl_flwr.cli", "run"]
        if self.verbose:
            cmd.append("--verbose")
        if resume:
            cmd += [
                "--resume",
                str(run.out_dir),
                "--set",
                f"simulation.init_num_cpus={run.cfg.simulation.init_num_cpus}"
                if run.cfg.simulation.init_num_cpus
                else "simulation.init_num_cpus=null",
            ]
        else:
            cmd += [str(cfg_path), "--out", str(run.out_dir)]
            if run.out_dir.exists():
                # started but never checkpointed: the run command clears that attempt's
                # files (only in a run directory it created; checked up front)
                cmd.append("--overwrite")
        return cmd

    # ------------------------------------------------------------------ while they run
    def _poll(self) -> None:
        for job in list(self.running):
            self._progress(job)
            rc = job.proc.poll()
            if rc is not None:
                self._ended(job, rc)

    def _progress(self, job: _Job) -> None:
        """One line per round ``job`` recorded since the last look (with the ETA)."""
        run = job.run
        show_ema = shows_ema(run.cfg.evaluation.report_metric)
        for rec in read_metrics(run.out_dir):
            if int(rec.get("round", 0)) <= job.printed:
                continue  # printed already, or kept from before a resume
            first = job.printed == job.kept
            if first:  # this launch's start-up, its first round included
                self.timer.observe_startup(time.time() - job.t0)
            self.timer.observe_round(rec.get("round_time_s"), first_of_launch=first)
            job.rounds_run += 1
            job.printed = int(rec["round"])
            total = run.cfg.federation.rounds
            prev = total - self.rounds_left[run.name]
            self.rounds_left[run.name] -= max(int(rec.get("round", prev)) - prev, 0)
            parts = [self._tag(run), f"round {rec.get('round')}/{total}"]
            if _is_number(rec.get("test_accuracy")):
                parts.append(f"acc {100 * rec['test_accuracy']:.2f}%")
            if show_ema and _is_number(rec.get("ema_accuracy")):
                parts.append(f"ema {100 * rec['ema_accuracy']:.2f}%")
            parts.append(f"ETA {_fmt_eta(self.eta())}")
            print(" | ".join(parts), flush=True)

    def _ended(self, job: _Job, rc: int) -> None:
        """``job`` exited with ``rc``: free its slot, record and print its outcome."""
        self.running.remove(job)
        self.watchdog.forget_group(job.proc.pid)
        self.free_slots.append(job.slot)
        self.free_slots.sort()
        job.log.close()
        took = time.time() - job.t0
        run = job.run
        self.rounds_left[run.name] = 0
        if rc == 0 and (run.out_dir / SUMMARY_FILE).is_file():
            self.timer.observe_finish(took, job.rounds_run)
            metric, acc = _reported(run.out_dir)
            self.status[run.name] = {
                "status": "done",
                "dir": str(run.out_dir),
                "seconds": round(took, 1),
            }
            accs = f"{metric} {100 * acc:.2f}%" if acc is not None else f"no {metric}"
            print(
                f"{self._tag(run)}: done in {took:.0f}s, {accs} | ETA {_fmt_eta(self.eta())}",
                flush=True,
            )
        else:
            log = sweep_log_path(self.out_dir, run.name)
            tail = _log_tail(log)
            self.status[run.name] = {
                "status": "failed",
                "exit_code": rc,
                "dir": str(run.out_dir),
                "error": tail,
            }
            self.failed.append(run.name)
            print(
                f"{self._tag(run)}: FAILED (exit {rc}): {tail} (log: {log})",
                file=sys.stderr,
                flush=True,
            )
        self.save_status()

    # ------------------------------------------------------------------ the end
    def _stop_all(self) -> None:
        """Interrupted: stop every running run once with SIGTERM (the run command's clean
        teardown), wait for each, record what each left."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, signal.SIG_IGN)  # let the runs tear down undisturbed
            except ValueError:
                pass
        for job in self.running:
            if job.proc.poll() is None:
                try:
                    job.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for job in self.running:
            try:
                job.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(job.proc.pid, signal.SIGKILL)
                job.proc.wait()
            job.log.close()
            run = job.run
            if (run.out_dir / SUMMARY_FILE).exists():  # finished before the signal
                self.status[run.name] = {"status": "done", "dir": str(run.out_dir)}
            else:
                self.status[run.name] = {
                    "status": "interrupted",
                    "dir": str(run.out_dir),
                    "rounds": _rounds_done(run),
                }
        self.save_status()

    def _close(self) -> int:
        took = time.time() - self.t_start
        failed = self.failed
        print(
            f"fedrcl-flwr sweep: {self.n - len(failed)}/{self.n} runs finished, "
            f"{len(failed)} failed ({took:.0f}s) -> {self.out_dir}",
            flush=True,
        )
        if failed:
            print("failed runs: " + ", ".join(failed), file=sys.stderr)
        return 1 if failed else 0
