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
    .fedrcl-flwr.lock  the live run's lock (fedrcl_flwr.launch.processes.OutputLock)

A sweep's ``--out``: one run directory per run, plus ``_configs/<run>.yaml`` (each planned
configuration), ``_logs/<run>.log`` (each run's output), ``sweep_status.json``, the marker
and the lock; ``mlruns/`` is MLflow's file store when no tracking server is set.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
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
# An output directory's lock: an exclusive flock on this file, which the tool creates
# (fedrcl_flwr.launch.processes.OutputLock)
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


# ------------------------------------------------------------------ writing, never through a link
# Every file the tool writes in a run's or a sweep's directory is either made new
# (:func:`new_file`: whatever had that name is removed, then the file is created with
# O_CREAT | O_EXCL | O_NOFOLLOW, and renamed over its final name by the caller) or
# appended to (:func:`append_file`: only a regular file of one link). So a symbolic link
# or a hard link planted under one of its names (a copied or unpacked results folder, a
# shared directory) is replaced or refused, and the file it points to is never written.


def new_file(path: Path, mode: str = "wb"):
    """A new regular file at ``path``, open for writing (``mode``): what had that name
    (a stale temporary file, a link) is removed first, never what a link points to;
    then the file is created exclusively, without following a link. For the tool's
    temporary names (``NAME.tmp``), which the caller renames over ``NAME``."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, mode)


def append_file(path: Path, mode: str = "a"):
    """``path`` open for appending (created if absent): refused with a
    :class:`RunFileError` (one line) when it is a symbolic link, a hard-linked file, a
    FIFO or anything but a regular file (opened with ``O_NOFOLLOW | O_NONBLOCK``, checked
    with ``fstat``: never written through, never waited on)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunFileError(
                f"cannot write {path}: it is a symbolic link (the tool never writes "
                "through one; remove it)"
            ) from None
        raise
    st = os.fstat(fd)
    why = link_problem(st)
    if why:
        os.close(fd)
        raise RunFileError(f"cannot write {path}: it is {why} (the tool never writes through one)")
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode)


def link_problem(st: os.stat_result) -> str | None:
    """Why a file with ``st`` (from ``lstat`` or ``fstat``) may not be written in place:
    a symbolic link, a hard-linked file, anything but a regular file; ``None`` if it may."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"))
        return next((name for test, name in kinds if test(st.st_mode)), "not a regular file")
    if st.st_nlink > 1:
        return f"a file with {st.st_nlink} hard links"
    return None


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` into ``path`` whole or not at all: through ``path.tmp`` (fsynced),
    then renamed. The file system's error (a full disk) is a :class:`RunFileError`
    naming ``path``; no ``.tmp`` is left and an earlier ``path`` stays as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with guarded_write(path, tmp):
        with new_file(tmp) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
