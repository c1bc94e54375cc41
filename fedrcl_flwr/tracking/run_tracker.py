"""The run's trackers together: :func:`open_tracker` starts the backends ``output.tracker``
names (each under the deadline), :class:`RunTracker` feeds them the run's records,
checkpoints and results and keeps ``tracker.json`` (ids and last round sent) for a resumed
run (:func:`read_state`)."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from fedrcl_flwr.config.sections import enabled_trackers
from fedrcl_flwr.run.run_files import TRACKER_STATE_FILE as STATE_FILE
from fedrcl_flwr.tracking.backend import Backend
from fedrcl_flwr.tracking.deadlines import call_with_deadline, drop_line
from fedrcl_flwr.tracking.mlflow_backend import MlflowBackend
from fedrcl_flwr.tracking.records import scalars, summary_scalars
from fedrcl_flwr.tracking.tensorboard_backend import TensorBoardBackend
from fedrcl_flwr.tracking.wandb_backend import WandbBackend, stop_wandb_service


class RunTracker:
    """Feeds every backend the run's records (:meth:`log`), checkpoints (:meth:`flush`)
    and results (:meth:`finish`); keeps ``tracker.json`` (ids and last round sent)."""

    def __init__(
        self,
        run_dir: Path,
        backends: list[Backend],
        sent: dict,
        defer: bool,
        timeout: float = 30.0,
    ):
        self.run_dir = Path(run_dir)
        self.timeout = float(timeout)  # output.tracker_timeout_s: each call's deadline
        self.backends = backends
        self.sent = {b.name: int(sent.get(b.name, 0)) for b in backends}
        self.defer = defer  # hold records of non-rewriting backends until checkpointed
        self.pending: list[dict] = []

    def _each(self, what: str, fn) -> None:
        for b in list(self.backends):
            try:
                call_with_deadline(lambda b=b: fn(b), self.timeout)
            except Exception as exc:  # noqa: BLE001 - a mirror must not stop the run
                self.backends.remove(b)
                print(drop_line(b.name, what, exc), file=sys.stderr, flush=True)
                b.abandon(getattr(exc, "thread", None))

    def _send(self, records: Iterable[dict], rewriting: bool) -> None:
        for rec in records:
            step = int(rec["round"])
            values = scalars(rec)

            def one(b, step=step, values=values):
                if b.rewrites_after_resume == rewriting and step > self.sent[b.name]:
                    b.log_round(step, values)
                    self.sent[b.name] = step

            self._each(f"logging round {step}", one)

    def log(self, record: dict) -> None:
        """A round's record (as written to ``metrics.jsonl``)."""
        self._send([record], rewriting=True)
        self.pending.append(record)
        if not self.defer:
            self.flush(int(record["round"]))

    def flush(self, checkpointed_round: int) -> None:
        """The run is checkpointed up to this round: its records go to every backend."""
        ready = [r for r in self.pending if int(r["round"]) <= checkpointed_round]
        self.pending = [r for r in self.pending if int(r["round"]) > checkpointed_round]
        self._send(ready, rewriting=False)
        self.save_state()

    def catch_up(self, records: list[dict]) -> None:
        """Resume: the kept records (up to the checkpoint) that a backend has not had."""
        self._send(records, rewriting=False)
        self.save_state()

    def finish(self, summary: dict, files: list[Path]) -> None:
        """After the last round: the pending records, the summary and the plots; then every
        backend is closed (before ``summary.json`` is written)."""
        self.flush(1 << 62)
        values = summary_scalars(summary)
        self._each("logging the results", lambda b: b.log_results(summary, values, files))
        self.close()

    def close(self) -> None:
        self._each("closing", lambda b: b.close())
        self.backends = []

    def save_state(self) -> None:
        state = {
            b.name: {**b.state(), "last_round": self.sent[b.name]}
            for b in self.backends
            if not b.rewrites_after_resume
        }
        if not state:
            return
        from fedrcl_flwr.run.results import atomic_write_text

        old = read_state(self.run_dir)
        atomic_write_text(self.run_dir / STATE_FILE, json.dumps({**old, **state}, indent=2))


def read_state(run_dir: Path) -> dict:
    try:
        data = json.loads((Path(run_dir) / STATE_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def open_tracker(
    cfg,
    run_dir: Path,
    config_path: Path,
    *,
    resume_after: int = 0,
    kept_records: list | None = None,
) -> RunTracker | None:
    """The run's trackers (``None`` when ``output.tracker`` is empty). ``resume_after``:
    the checkpointed round a resumed run continues from (0: a new run); ``kept_records``:
    the records up to it (``metrics.jsonl`` as kept)."""
    names = enabled_trackers(cfg)
    if not names:
        return None
    import dataclasses

    config = dataclasses.asdict(cfg)
    config_yaml = Path(config_path).read_text()
    previous = read_state(run_dir) if resume_after else {}
    timeout = float(cfg.output.tracker_timeout_s)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, math.ceil(timeout))))
    makers = {
        "tensorboard": lambda: TensorBoardBackend(run_dir, config_yaml, resume_after),
        "wandb": lambda: WandbBackend(run_dir, cfg, config, previous.get("wandb", {})),
        "mlflow": lambda: MlflowBackend(
            run_dir, cfg, config, Path(config_path), previous.get("mlflow", {})
        ),
    }
    backends: list[Backend] = []
    for name in names:
        try:  # a tracker that cannot start in time is dropped; the run goes on
            backends.append(call_with_deadline(makers[name], timeout))
        except Exception as exc:  # noqa: BLE001 - a mirror must not stop the run
            print(drop_line(name, "starting", exc), file=sys.stderr, flush=True)
            if name == "wandb":
                stop_wandb_service(getattr(exc, "thread", None))
    sent = {k: int(v.get("last_round", 0)) for k, v in previous.items() if isinstance(v, dict)}
    for b in backends:
        if b.rewrites_after_resume:
            sent[b.name] = resume_after
    tracker = RunTracker(
        run_dir, backends, sent, defer=bool(cfg.output.checkpoint_every), timeout=timeout
    )
    if resume_after and kept_records:
        tracker.catch_up([r for r in kept_records if int(r["round"]) <= resume_after])
    else:
        tracker.save_state()
    return tracker
