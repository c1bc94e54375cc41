"""Experiment trackers (``output.tracker: [tensorboard, wandb, mlflow]``), all fed from the
records that go to ``metrics.jsonl`` (which stays the source of truth) through one writer
interface, :class:`~fedrcl_flwr.tracking.backend.Backend`, driven by one
:class:`~fedrcl_flwr.tracking.run_tracker.RunTracker`:

* the resolved config as run parameters (TensorBoard: the YAML as text; W&B: the run's
  config; MLflow: one parameter per dotted key, plus ``config.yaml`` as an artefact);
* per evaluated round, the record's numeric entries at step = round, under the same names
  in every tracker (:func:`~fedrcl_flwr.tracking.records.scalars`):

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
starts (:func:`~fedrcl_flwr.tracking.mlflow_backend.prepare_sweep_group`).

Resume: TensorBoard rewrites the rounds after the checkpoint (``purge_step``), so it gets
each record at once. W&B and MLflow cannot take a round back, so they get a round's record
only once it is checkpointed (at once with ``output.checkpoint_every: 0``, when no resume
is possible); a resumed run continues the same W&B / MLflow run (ids in
``<run dir>/tracker.json``) and sends what the killed run had not. Each tracker thus holds
exactly the records of ``metrics.jsonl``.

Deadlines: every call to a tracker (opening it, each round, the results, closing) runs
with a deadline of ``output.tracker_timeout_s`` seconds (default 30;
:func:`~fedrcl_flwr.tracking.deadlines.call_with_deadline`).
A tracker whose call fails or does not return in time (a server that accepts the connection
and never answers) is reported on one line and dropped; the run and its files go on.
MLflow's own HTTP time-out is set to the same deadline (``MLFLOW_HTTP_REQUEST_TIMEOUT``,
unless set) and W&B's ``init_timeout`` too; a W&B run that is dropped has its service
process (``wandb-core``) stopped. W&B keeps its files under the run directory: ``dir`` is
the run directory and, unless set, ``WANDB_CACHE_DIR``, ``WANDB_CONFIG_DIR`` and
``WANDB_DATA_DIR`` are ``<run dir>/wandb/{cache,config,data}`` (nothing in ``HOME``).

The package, one module per concern: :mod:`~fedrcl_flwr.tracking.records` (the tags),
:mod:`~fedrcl_flwr.tracking.deadlines` (the deadline and the one-line drop),
:mod:`~fedrcl_flwr.tracking.backend` (the writer interface),
:mod:`~fedrcl_flwr.tracking.tensorboard_backend`, :mod:`~fedrcl_flwr.tracking.wandb_backend`,
:mod:`~fedrcl_flwr.tracking.mlflow_backend` (one per tracker),
:mod:`~fedrcl_flwr.tracking.environment` (the checks before a run) and
:mod:`~fedrcl_flwr.tracking.run_tracker` (opening the trackers and feeding them).
"""
