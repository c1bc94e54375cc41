"""Experiment trackers (``output.tracker: [tensorboard, wandb, mlflow]``), all fed from the
records that go to ``metrics.jsonl`` (which stays the source of truth) through one writer
interface, :class:`Backend`, driven by one :class:`RunTracker`:

* the resolved config as run parameters (TensorBoard: the YAML as text; W&B: the run's
  config; MLflow: one parameter per dotted key, plus ``config.yaml`` as an artefact);
* per evaluated round, the record's numeric entries at step = round, under the same names
  in every tracker (:func:`scalars`):

  - ``accuracy/test``, ``accuracy/ema``, ``accuracy/val``, ``loss/test``, ``loss/val``
  - ``train/<name>``: the per-term training losses (``train_loss``, ``train_loss_rcl``, ...)
  - ``domain_accuracy/<domain>``: per-domain test accuracy
  - ``representation/<name>``: ``repr_*`` metrics (effective rank, VCI, ...)
  - ``comm/<name>``: ``*_bytes_*`` (model and signal bytes per round)
  - ``robust/<name>``: FGSM / PGD accuracy; ``privacy/<name>``: ``dp_*`` (ε, ...);
    ``client_accuracy/mean|std|worst10|best10|n``: per-client evaluation
    (``evaluation.per_client``); ``round/<name>``: clients, failures, times (and
    ``dropped``, ``late``, ``sim_round_time`` of ``federation.availability``);

* at the end, every number of ``summary.json`` as ``summary/<key>`` (nested keys joined
  with ``/``) and the run's plots (``*.png`` of the run directory) as artefacts (W&B: run
  files; MLflow: ``plots/``; TensorBoard: images), all before ``summary.json`` is written
  (its appearance still means every result of the run is on disk and in the trackers).

Backends (each an optional extra, refused at start-up without it: exit 2):

* ``tensorboard`` (alias ``output.tensorboard: true``): ``<run dir>/tensorboard/``, one
  ``torch.utils.tensorboard.SummaryWriter``; ``tensorboard --logdir <sweep --out>``
  compares every run of a sweep.
* ``wandb``: one W&B run named after the run directory in project
  ``output.tracker_project``, group ``output.tracker_group``, files under
  ``<run dir>/wandb/``. ``WANDB_MODE=offline`` works without a network (``wandb sync``
  uploads later); online mode needs an API key (checked before the run starts).
* ``mlflow``: one MLflow run in experiment ``output.tracker_project``, a child of the
  group's parent run (tag ``mlflow.parentRunId``). The store is ``MLFLOW_TRACKING_URI``
  (an ``http(s)`` server must answer when the run starts); unset, a file store in the run
  directory (``<run dir>/mlruns``; a sweep uses ``<sweep out>/mlruns`` for all its runs).
  MLflow 3 refuses file stores unless ``MLFLOW_ALLOW_FILE_STORE=true``: asking for a
  ``file:`` store sets it.

Sweeps group their runs: ``sweep`` sets ``output.tracker_group`` to the sweep's name (W&B
group) and creates the MLflow parent run (tag ``fedrcl_flwr.sweep``) before the first run
starts (:func:`prepare_sweep_group`).

Resume: TensorBoard rewrites the rounds after the checkpoint (``purge_step``), so it gets
each record at once. W&B and MLflow cannot take a round back, so they get a round's record
only once it is checkpointed (at once with ``output.checkpoint_every: 0``, when no resume
is possible); a resumed run continues the same W&B / MLflow run (ids in
``<run dir>/tracker.json``) and sends what the killed run had not. Each tracker thus holds
exactly the records of ``metrics.jsonl``.

Deadlines: every call to a tracker (opening it, each round, the results, closing) runs
with a deadline of ``output.tracker_timeout_s`` seconds (default 30; :func:`call_with_deadline`).
A tracker whose call fails or does not return in time (a server that accepts the connection
and never answers) is reported on one line and dropped; the run and its files go on.
MLflow's own HTTP time-out is set to the same deadline (``MLFLOW_HTTP_REQUEST_TIMEOUT``,
unless set) and W&B's ``init_timeout`` too; a W&B run that is dropped has its service
process (``wandb-core``) stopped. W&B keeps its files under the run directory: ``dir`` is
the run directory and, unless set, ``WANDB_CACHE_DIR``, ``WANDB_CONFIG_DIR`` and
``WANDB_DATA_DIR`` are ``<run dir>/wandb/{cache,config,data}`` (nothing in ``HOME``).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedrcl_flwr.config.sections import enabled_trackers
from fedrcl_flwr.run.run_files import MLRUNS_DIR, SUMMARY_FILE, WANDB_DIR
from fedrcl_flwr.run.run_files import TENSORBOARD_DIR as TB_DIR
from fedrcl_flwr.run.run_files import TRACKER_STATE_FILE as STATE_FILE

SWEEP_TAG = "fedrcl_flwr.sweep"


# ----------------------------------------------------------------------------- config


def mlflow_uri(default_dir: Path) -> str:
    """``MLFLOW_TRACKING_URI``, else a file store ``default_dir/mlruns``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    return uri or f"file:{Path(default_dir).resolve() / MLRUNS_DIR}"


def _allow_file_store(uri: str) -> None:
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def check_tracker_environment(cfg) -> None:
    """What a tracker needs outside the config, checked before anything runs (a
    ``ConfigError``, exit 2): W&B online needs an API key; an ``http(s)`` MLflow tracking
    server must accept a connection."""
    from fedrcl_flwr.errors import ConfigError

    names = enabled_trackers(cfg)
    if (
        "wandb" in names
        and os.environ.get("WANDB_MODE", "").lower() not in ("offline", "disabled", "dryrun")
        and not _wandb_key_present()
    ):
        raise ConfigError(
            "output.tracker includes wandb in online mode but no W&B API key "
            "is set (run `wandb login` or set WANDB_API_KEY; or "
            "WANDB_MODE=offline to log locally and `wandb sync` later)"
        )
    if "mlflow" in names:
        uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        if uri.startswith(("http://", "https://")):
            import socket
            from urllib.parse import urlparse

            u = urlparse(uri)
            port = u.port or (443 if u.scheme == "https" else 80)
            try:
                with socket.create_connection((u.hostname, port), timeout=3):
                    pass
            except OSError as exc:
                raise ConfigError(
                    f"output.tracker includes mlflow but the tracking server "
                    f"MLFLOW_TRACKING_URI={uri} does not answer "
                    f"({exc.strerror or exc})"
                ) from None


def _wandb_key_present() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        # netrc looks a None host up like any other (then its `default` entry)
        return netrc.netrc().authenticators(host) is not None  # type: ignore[arg-type]
    except (OSError, netrc.NetrcParseError):
        return False


# ----------------------------------------------------------------------------- records


def _tag(key: str) -> str:
    if key in ("test_accuracy", "ema_accuracy", "val_accuracy"):
        return f"accuracy/{key.split('_')[0]}"
    if key in ("test_loss", "val_loss"):
        return f"loss/{key.split('_')[0]}"
    if key.startswith("train_"):
        return f"train/{key}"
    if key.startswith("repr_"):
        return f"representation/{key[5:]}"
    if "bytes" in key:
        return f"comm/{key}"
    if key.startswith(("fgsm", "pgd", "robust", "clean")):
        return f"robust/{key}"
    if key.startswith("dp_"):
        return f"privacy/{key}"
    if key.startswith("client_acc_"):  # per-client evaluation (client_eval.py)
        return f"client_accuracy/{key[len('client_acc_') :]}"
    return f"round/{key}"


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def scalars(record: dict) -> dict[str, float]:
    """The record's numeric entries as ``{tag: value}`` (round excluded, non-finite and
    non-numeric values left out); ``domain_accuracy`` is expanded per domain."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "round":
            continue
        if key == "domain_accuracy" and isinstance(value, dict):
            for dom, v in value.items():
                if _num(v):
                    out[f"domain_accuracy/{dom}"] = float(v)
        elif _num(value):
            out[_tag(key)] = float(value)
    return out


def summary_scalars(summary: dict) -> dict[str, float]:
    """Every finite number of ``summary.json`` as ``summary/<key>`` (nested mappings
    joined with ``/``: ``summary/accuracy_at/500``)."""
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif _num(value):
            out[prefix] = float(value)

    for key, value in summary.items():
        walk(f"summary/{key}", value)
    return out


def flat_params(config: dict, prefix: str = "") -> dict[str, Any]:
    """The resolved config as ``{dotted key: value}`` (lists and empty mappings kept as
    values)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flat_params(v, key))
        else:
            out[key] = v
    return out


# ----------------------------------------------------------------------------- deadlines


class TrackerTimeout(TimeoutError):
    """A tracker call that did not return within ``output.tracker_timeout_s``."""


def call_with_deadline(fn, timeout: float):
    """``fn()`` in a daemon thread, waited for at most ``timeout`` seconds: its result,
    its exception re-raised, or :class:`TrackerTimeout` (the thread is abandoned: it
    blocks in the tracker's client library, whose own time-out ends it later)."""
    import threading

    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=target, name="fedrcl-tracker-call", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        exc = TrackerTimeout(f"no answer within {timeout:g}s (output.tracker_timeout_s)")
        exc.thread = t  # type: ignore[attr-defined]  # the abandoned call
        raise exc
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _drop_line(name: str, what: str, exc: BaseException) -> str:
    one = " ".join(str(exc).split())[:300]
    return (
        f"[fedrcl-flwr] tracker {name} failed while {what} and is dropped "
        f"for the rest of the run ({type(exc).__name__}: {one}); "
        "metrics.jsonl is complete"
    )


# ----------------------------------------------------------------------------- backends


class Backend:
    """The writer interface every tracker implements. ``rewrites_after_resume``: the
    backend can take back the rounds after a checkpoint (TensorBoard's ``purge_step``),
    so it gets each record at once; the others only checkpointed rounds."""

    name = ""
    rewrites_after_resume = False

    def state(self) -> dict:
        """What a resumed run needs to continue this backend's run (JSON)."""
        return {}

    def log_round(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def log_results(self, summary: dict, values: dict[str, float], files: list[Path]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def abandon(self, thread=None) -> None:
        """After a failed or timed-out call (``thread``: the abandoned call, if it is
        still running): let go of what the backend holds, without waiting on the service
        that did not answer."""


class TensorBoardBackend(Backend):
    name = "tensorboard"
    rewrites_after_resume = True

    def __init__(self, run_dir: Path, config_yaml: str, resume_after: int):
        from torch.utils.tensorboard import SummaryWriter

        from fedrcl_flwr.run.results import write_marker

        kwargs = {"purge_step": resume_after + 1} if resume_after else {}
        tb_dir = Path(run_dir) / TB_DIR
        created = not tb_dir.exists()
        self.writer = SummaryWriter(log_dir=str(tb_dir), **kwargs)
        if created:  # ours: `run --overwrite` may clear it
            tb_dir.mkdir(parents=True, exist_ok=True)
            write_marker(tb_dir, TB_DIR)
        if not resume_after:
            self.writer.add_text("config", "```yaml\n" + config_yaml + "```", 0)
        self.writer.flush()

    def log_round(self, step, values):
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def log_results(self, summary, values, files):
        step = int(summary.get("rounds") or 0)
        self.writer.add_text("summary", "```json\n" + json.dumps(summary, indent=2) + "\n```", step)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        for path in files:
            if path.suffix == ".png":
                import matplotlib.image as mpimg

                self.writer.add_image(
                    f"plots/{path.stem}", mpimg.imread(str(path)), step, dataformats="HWC"
                )
        self.writer.flush()

    def close(self):
        self.writer.close()


class WandbBackend(Backend):
    name = "wandb"

    def __init__(self, run_dir: Path, cfg, config: dict, previous: dict):
        from fedrcl_flwr.run.results import write_marker

        self.run_dir = Path(run_dir)
        self.run = None
        run_id = previous.get("id") or secrets.token_hex(6)  # W&B: [a-z0-9_-]
        if not (self.run_dir / WANDB_DIR).exists():  # ours: `run --overwrite` may clear it
            (self.run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
            write_marker(self.run_dir / WANDB_DIR, WANDB_DIR)
        for var, sub in (
            ("WANDB_CACHE_DIR", "cache"),
            ("WANDB_CONFIG_DIR", "config"),
            ("WANDB_DATA_DIR", "data"),
        ):  # W&B's own files under the run directory, not in HOME (module doc)
            if os.environ.get(var) in (None, _WANDB_DIRS_SET.get(var)):  # not the user's
                os.environ[var] = _WANDB_DIRS_SET[var] = str(self.run_dir / WANDB_DIR / sub)
        import wandb

        settings = wandb.Settings(
            init_timeout=float(cfg.output.tracker_timeout_s),
            silent=True,
            console="off",
            x_disable_stats=True,
            disable_git=True,
            save_code=False,
            x_save_requirements=False,
            x_disable_machine_info=True,
        )
        self.run = wandb.init(
            project=cfg.output.tracker_project,
            name=self.run_dir.name,
            group=cfg.output.tracker_group,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
            config=config,
            settings=settings,
        )
        self.id = run_id

    def state(self):
        return {"id": self.id}

    def log_round(self, step, values):
        self.run.log(dict(values), step=step)

    def log_results(self, summary, values, files):
        self.run.summary.update(values)
        for path in files:
            self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self):
        import wandb

        self.run.finish()
        wandb.teardown()  # the W&B service process belongs to this run's process

    def abandon(self, thread=None):
        stop_wandb_service(thread)


_WANDB_DIRS_SET: dict[str, str] = {}  # W&B directory variables this process set (per run)


def stop_wandb_service(thread=None, wait_s: float = 30.0) -> None:
    """Stop W&B's service process (``wandb-core``, a child of this process) without
    waiting on it: a dropped W&B run leaves no process behind. ``thread``: an abandoned
    call still inside W&B (it may start the service late); its service is stopped until
    the call gives up (at most ``wait_s`` seconds)."""
    import signal
    import time

    def kill_all() -> None:
        for pid in _wandb_service_pids():
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)  # our child: reaped, no zombie left
            except OSError:
                pass

    deadline = time.monotonic() + wait_s
    while True:
        kill_all()
        if thread is None or not thread.is_alive() or time.monotonic() > deadline:
            break
        thread.join(0.2)
    kill_all()
    try:
        import wandb

        wandb.teardown()  # forget the (now gone) service; quick once it is dead
    except Exception:  # noqa: BLE001 - best effort
        pass


def _wandb_service_pids() -> list[int]:
    """PIDs of this process's children running W&B's service (``wandb-core``)."""
    me = str(os.getpid())
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
            ppid = stat.rsplit(")", 1)[1].split()[1]
            if ppid == me and b"wandb" in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


_MLFLOW_KEY_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(key: str) -> str:
    """A metric / parameter name MLflow accepts (other characters become ``_``)."""
    return _MLFLOW_KEY_BAD.sub("_", key)[:250]


def _mlflow_client(uri: str):
    _allow_file_store(uri)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _mlflow_experiment(client, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # noqa: BLE001 - created by a concurrent run of the sweep meanwhile
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def mlflow_parent_run(client, experiment_id: str, group: str, *, create: bool) -> str | None:
    """The id of the group's parent run (tag ``fedrcl_flwr.sweep`` = ``group``), created
    when absent and ``create``."""
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{SWEEP_TAG}` = '{group}'", max_results=1
    )
    if found:
        return found[0].info.run_id
    if not create:
        return None
    run = client.create_run(experiment_id, run_name=group, tags={SWEEP_TAG: group})
    return run.info.run_id


class MlflowBackend(Backend):
    name = "mlflow"
    PARAM_LIMIT = 6000  # MLflow's longest parameter value

    def __init__(self, run_dir: Path, cfg, config: dict, config_path: Path, previous: dict):
        from mlflow.entities import Param

        self.uri = previous.get("tracking_uri") or mlflow_uri(run_dir)
        self.client = _mlflow_client(self.uri)
        if previous.get("run_id"):
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        exp = _mlflow_experiment(self.client, cfg.output.tracker_project)
        tags: dict[str, str | None] = {"fedrcl_flwr.run_dir": str(Path(run_dir).resolve())}
        if cfg.output.tracker_group:
            parent = mlflow_parent_run(self.client, exp, cfg.output.tracker_group, create=True)
            tags["mlflow.parentRunId"] = parent
        self.run_id = self.client.create_run(
            exp, run_name=Path(run_dir).name, tags=tags
        ).info.run_id
        params = [
            Param(mlflow_key(k), str(v)[: self.PARAM_LIMIT]) for k, v in flat_params(config).items()
        ]
        for i in range(0, len(params), 100):  # MLflow takes 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_artifact(self.run_id, str(config_path))

    def state(self):
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def _metrics(self, values: dict, step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), float(v), now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def log_round(self, step, values):
        self._metrics(values, step)

    def log_results(self, summary, values, files):
        self._metrics(values, int(summary.get("rounds") or 0))
        self.client.log_dict(self.run_id, summary, SUMMARY_FILE)
        for path in files:
            self.client.log_artifact(
                self.run_id, str(path), "plots" if path.suffix == ".png" else None
            )

    def close(self):
        self.client.set_terminated(self.run_id)


# ----------------------------------------------------------------------------- the run


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
                print(_drop_line(b.name, what, exc), file=sys.stderr, flush=True)
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
            print(_drop_line(name, "starting", exc), file=sys.stderr, flush=True)
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


def prepare_sweep_group(cfgs: list, sweep_out: Path) -> dict:
    """Before a sweep's first run: the environment its runs get (``MLFLOW_TRACKING_URI``
    = ``<sweep out>/mlruns`` when unset) and the MLflow parent run of each group."""
    env: dict = {}
    ml = [c for c in cfgs if "mlflow" in enabled_trackers(c) and c.output.tracker_group]
    if not ml:
        return env
    uri = mlflow_uri(sweep_out)
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        env["MLFLOW_TRACKING_URI"] = uri
    client = _mlflow_client(uri)
    for project, group in sorted({(c.output.tracker_project, c.output.tracker_group) for c in ml}):
        mlflow_parent_run(client, _mlflow_experiment(client, project), group, create=True)
    return env
