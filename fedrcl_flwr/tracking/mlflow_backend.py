"""MLflow: one MLflow run per run directory in experiment ``output.tracker_project``,
a child of its group's parent run (tag ``fedrcl_flwr.sweep``, created before a sweep's
first run by :func:`prepare_sweep_group`); the store is ``MLFLOW_TRACKING_URI`` or a file
store ``mlruns`` (:func:`mlflow_uri`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fedrcl_flwr.config.sections import enabled_trackers
from fedrcl_flwr.run.run_files import MLRUNS_DIR, SUMMARY_FILE
from fedrcl_flwr.tracking.backend import Backend
from fedrcl_flwr.tracking.records import flat_params

SWEEP_TAG = "fedrcl_flwr.sweep"


def mlflow_uri(default_dir: Path) -> str:
    """``MLFLOW_TRACKING_URI``, else a file store ``default_dir/mlruns``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    return uri or f"file:{Path(default_dir).resolve() / MLRUNS_DIR}"


def _allow_file_store(uri: str) -> None:
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


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
