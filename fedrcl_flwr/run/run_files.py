"""The names of everything the tool writes into a run's and a sweep's directory, declared
once (standard library only, so every layer imports it: the CLI, the runner, the
ServerApp, the sweep, the report).

A run directory (``fedrcl-flwr run --out DIR``)::

    config.yaml      the resolved experiment (defaults + overrides)
    metrics.jsonl    one JSON object per evaluated round
    summary.json     written last: its appearance means every result is on disk
    model.pt         the final global model's state_dict
    accuracy.png     test and EMA accuracy per round
    checkpoint.pt    the latest checkpoint (output.checkpoint_every > 0)
    run.log          the run's log (Flower's, fetched at the end)
    flower.log       the SuperLink's output and the runner's timing line
    tracker.json     the experiment trackers' run ids (resume)
    client_state/    per-client state across rounds (MOON, FedDyn, ...)
    tensorboard/     TensorBoard event files;  wandb/  W&B's local files
    .fedrcl-flwr-dir the tool's marker (see fedrcl_flwr.run.results.write_marker)
    .fedrcl-flwr.lock  the live run's lock (fedrcl_flwr.run.processes.OutputLock)

A sweep's ``--out``: one run directory per run, plus ``_configs/<run>.yaml`` (each planned
configuration), ``_logs/<run>.log`` (each run's output), ``sweep_status.json``, the marker
and the lock; ``mlruns/`` is MLflow's file store when no tracking server is set.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.pt"
PLOT_FILE = "accuracy.png"
CHECKPOINT_FILE = "checkpoint.pt"
RUN_LOG = "run.log"
FLOWER_LOG = "flower.log"
TRACKER_STATE_FILE = "tracker.json"

CLIENT_STATE_DIR = "client_state"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
MLRUNS_DIR = "mlruns"  # MLflow's file store (left alone by --overwrite)

# Every directory the tool creates and may later delete or clear carries this file,
# holding ``fedrcl-flwr <kind>``. Nothing without it is ever removed.
MARKER_FILE = ".fedrcl-flwr-dir"
# An output directory's lock: an exclusive flock on this file (fedrcl_flwr.run.processes.OutputLock)
LOCK_FILE = ".fedrcl-flwr.lock"

# what a run writes into its output directory (``run --overwrite`` removes exactly these,
# their temporary siblings and RUN_SUBDIRS, in a directory carrying the run marker)
RUN_FILES = (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    MODEL_FILE,
    PLOT_FILE,
    CHECKPOINT_FILE,
    RUN_LOG,
    FLOWER_LOG,
    TRACKER_STATE_FILE,
)
# the files that make a directory "hold an earlier run"
RESULT_FILES = (METRICS_FILE, SUMMARY_FILE, MODEL_FILE, CHECKPOINT_FILE)
# directories a run writes (trackers' local files; an MLflow store is left alone)
RUN_SUBDIRS = (CLIENT_STATE_DIR, TENSORBOARD_DIR, WANDB_DIR)
TMP_SUFFIX = ".tmp"  # a file being written: NAME.tmp, replaced atomically
PLOT_TMP = Path(PLOT_FILE).stem + ".tmp.png"  # matplotlib needs the image suffix

# a sweep's own entries in its --out
SWEEP_STATUS_FILE = "sweep_status.json"
SWEEP_CONFIGS_DIR = "_configs"
SWEEP_LOGS_DIR = "_logs"
SWEEP_ENTRIES = (SWEEP_CONFIGS_DIR, SWEEP_LOGS_DIR, SWEEP_STATUS_FILE)

# directories below a sweep's --out or a run that hold no run (``report`` skips them)
NOT_RUN_DIRS = frozenset((SWEEP_CONFIGS_DIR, SWEEP_LOGS_DIR, MLRUNS_DIR) + RUN_SUBDIRS)


def sweep_config_path(sweep_dir: Path, run_name: str) -> Path:
    """Where a sweep keeps run ``run_name``'s planned configuration."""
    return Path(sweep_dir) / SWEEP_CONFIGS_DIR / f"{run_name}.yaml"


def sweep_log_path(sweep_dir: Path, run_name: str) -> Path:
    """Where a sweep writes run ``run_name``'s output."""
    return Path(sweep_dir) / SWEEP_LOGS_DIR / f"{run_name}.log"


class RunFileError(OSError):
    """A run file could not be written (the file system is full, read-only, ...): one
    line naming the file. What was being written is gone (no ``.tmp`` left, a torn
    record cut back): the run's files are as after the last complete write, so the run
    is resumable from its last checkpoint."""

    def __str__(self) -> str:  # the message alone (OSError would show errno and filename)
        return str(self.args[0]) if self.args else super().__str__()


def write_problem(path: Path, exc: OSError) -> RunFileError:
    """The one-line error for ``exc`` raised while writing ``path``."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why += " (free space there, then continue with fedrcl-flwr run --resume)"
    err = RunFileError(f"cannot write {path}: {why}")
    err.errno, err.filename = exc.errno, str(path)
    return err


@contextlib.contextmanager
def guarded_write(path: Path, tmp: Path | None = None, *, truncate_to: int | None = None):
    """Write ``path`` (through ``tmp``, or appending to it): on an ``OSError`` the
    temporary file is removed, an append is cut back to ``truncate_to`` bytes, and a
    :class:`RunFileError` naming ``path`` is raised instead."""
    try:
        yield
    except RunFileError:
        raise
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if truncate_to is not None:
            with contextlib.suppress(OSError):
                os.truncate(path, truncate_to)
        raise write_problem(Path(path), exc) from None


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` into ``path`` whole or not at all: through ``path.tmp`` (fsynced),
    then renamed. The file system's error (a full disk) is a :class:`RunFileError`
    naming ``path``; no ``.tmp`` is left and an earlier ``path`` stays as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with guarded_write(path, tmp):
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
