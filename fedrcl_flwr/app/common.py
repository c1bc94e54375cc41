"""Reading the experiment from Flower's run config (shared by ServerApp and ClientApp).

Run-config keys (declared in ``pyproject.toml`` under ``[tool.flwr.app.config]``):

* ``experiment`` - YAML path, absolute or relative to the app directory
* ``overrides``  - ``;``-separated dotted ``key=value`` pairs applied on top
* ``output-dir`` - absolute output directory (empty: ``output.dir`` from the YAML)
* ``resume``     - ``true`` to continue the run found in the output directory
* ``expected-nodes`` - deployment: how many SuperNodes the server waits for (0 = any)
* ``dataset-cache`` - the dataset cache entry the CLI prepared (``fedrcl-flwr run``): the
  ServerApp and ClientApps only open it (empty: each process opens or builds its entry)
* ``weight-store`` / ``weight-store-note`` - the run's weight store folder the CLI created
  (``simulation.transport: shared``), or why none could be (``fedrcl_flwr/app/wire/transport.py``)
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from fedrcl_flwr.config import ExperimentConfig, load_config

APP_DIR = Path(__file__).resolve().parents[2]


def resolve_experiment_path(path: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = APP_DIR / p
    return p


def _load(path: str, overrides: str) -> ExperimentConfig:
    """The experiment parsed once per process and file content (``runtime.WORKER``): a
    file rewritten since (another run in the same directory) is parsed again."""
    import hashlib

    from fedrcl_flwr.run.runtime import WORKER

    p = resolve_experiment_path(path)
    try:
        version = hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError:
        version = None  # load_config reports it
    items = [s.strip() for s in overrides.split(";") if s.strip()]
    return WORKER.get("configs", (str(p), overrides, version), lambda: load_config(p, items))


def config_from_run_config(run_config: dict) -> ExperimentConfig:
    """The run's experiment; with a ``dataset-cache`` entry, this process's dataset is
    that prepared entry (:func:`fedrcl_flwr.run.runtime.use_prepared_dataset`)."""
    cfg = _load(
        str(run_config.get("experiment", "experiments/quickstart.yaml")),
        str(run_config.get("overrides", "")),
    )
    entry = str(run_config.get("dataset-cache", "") or "")
    if entry:
        from fedrcl_flwr.run.runtime import use_prepared_dataset

        use_prepared_dataset(cfg, entry)
    return cfg


def output_dir_from_run_config(run_config: dict, cfg: ExperimentConfig) -> Path:
    out = str(run_config.get("output-dir", "") or "")
    return Path(out).expanduser() if out else cfg.output_dir().resolve()


def quiet(verbose: bool = False) -> None:
    """Silence library noise unless FEDRCL_VERBOSE=1."""
    if verbose or os.environ.get("FEDRCL_VERBOSE") == "1":
        return
    warnings.filterwarnings("ignore")
    for name in ("flwr", "ray"):
        logging.getLogger(name).setLevel(logging.WARNING)
