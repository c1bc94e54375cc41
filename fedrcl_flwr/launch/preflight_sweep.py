"""What ``sweep`` checks before it writes a file or starts a run (:func:`before_sweep`):
the sweep's directory and every run directory in it (:func:`check_sweep_dir`), then the
inputs of every run still to do (:func:`check_pending_runs`). The checks a single run
shares with them (resources, model, split, output directory) are
:mod:`fedrcl_flwr.launch.preflight`'s. A problem is one
:class:`~fedrcl_flwr.config.ConfigError` (exit 2) naming the run or the path; nothing has
been written when it is raised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedrcl_flwr.config import ExperimentConfig, config_from_dict, read_yaml
from fedrcl_flwr.config.catalog import dataset_info
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.launch.plan import PlannedRun
from fedrcl_flwr.launch.preflight import (
    _check_free_output_dir,
    _check_written_in_place,
    check_model,
    check_resources,
    check_split,
)
from fedrcl_flwr.run.run_files import (
    RESULT_FILES,
    SWEEP_CONFIGS_DIR,
    SWEEP_LOGS_DIR,
    SWEEP_STATUS_FILE,
    sweep_config_path,
    sweep_log_path,
)


def before_sweep(runs: list[PlannedRun], out_dir: Path) -> None:
    """Everything ``sweep`` checks before it writes a file: its directory and every run
    directory (:func:`check_sweep_dir`), then the inputs of every run still to do — not
    finished, and not among the finished runs an earlier version of the sweep left under
    another name (:func:`fedrcl_flwr.launch.plan.earlier_runs`) — (:func:`check_pending_runs`)."""
    from fedrcl_flwr.launch.plan import earlier_runs

    check_sweep_dir(runs, out_dir)
    check_pending_runs(runs, frozenset(earlier_runs(runs, out_dir)[0]))


def check_existing(runs: list[PlannedRun]) -> None:
    """A run directory that holds a different experiment
    (:func:`fedrcl_flwr.launch.plan.experiment_hash`; e.g. edited by hand), or results without
    the configuration that produced them, stops the sweep: nothing is overwritten or
    counted silently."""
    from fedrcl_flwr.launch.plan import experiment_hash
    from fedrcl_flwr.run.run_files import CONFIG_FILE

    for run in runs:
        cfg_file = run.out_dir / CONFIG_FILE
        if not cfg_file.exists():
            held = [f for f in RESULT_FILES if (run.out_dir / f).exists()]
            if held:
                raise ConfigError(
                    f"{run.out_dir} holds {', '.join(held)} but no "
                    f"{CONFIG_FILE}: it cannot be shown to be run "
                    f"'{run.name}' of this sweep; move it away or use "
                    "another --out"
                )
            continue
        try:
            there = config_from_dict(read_yaml(cfg_file), str(cfg_file))
        except ConfigError as exc:
            raise ConfigError(
                f"{cfg_file}: unreadable run config ({exc}); remove the directory to rerun it"
            ) from None
        if experiment_hash(there) != experiment_hash(run.cfg):
            raise ConfigError(
                f"{run.out_dir} holds a different experiment than the sweep "
                f"plans for run '{run.name}'; remove it or use another --out"
            )


def check_sweep_dir(runs: list[PlannedRun], out_dir: Path) -> None:
    """What the sweep will write and remove, checked before anything is (reads only):
    ``--out`` is (or can be) a writable directory that no other sweep or run holds, and
    no run directory is in use by a live run; every existing run directory holds this
    sweep's experiment (:func:`check_existing`); the sweep's own files there are what
    they should be (:func:`_check_sweep_entries`); each run's files and directory too
    (:func:`_check_run_entries`: for a run that will start afresh over an earlier attempt,
    a directory ``run --overwrite`` may clear, carrying the tool's marker; see
    :func:`fedrcl_flwr.run.results.overwrite_problem`)."""
    from fedrcl_flwr.launch.processes import OutputLock

    _check_free_output_dir(out_dir, "sweep directory", "another sweep or run")
    for run in runs:
        d = run.out_dir
        why = OutputLock.problem(d) if d.is_dir() and not d.is_symlink() else None
        if why:
            raise ConfigError(f"run '{run.name}': {why}")
        holder = OutputLock.holder(d) if d.is_dir() and not d.is_symlink() else None
        if holder is not None:
            raise ConfigError(
                f"run '{run.name}': {d} is in use by another run (PID "
                f"{holder}); wait for it to end or choose another --out"
            )
    check_existing(runs)
    _check_sweep_entries(out_dir)
    for run in runs:
        _check_run_entries(run, out_dir)


def _check_sweep_entries(out_dir: Path) -> None:
    """The sweep's own directories and files in ``out_dir`` are what they should be (no
    links, no file where a directory goes and no directory where a file goes)."""
    for sub in (SWEEP_CONFIGS_DIR, SWEEP_LOGS_DIR):
        p = out_dir / sub
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            raise ConfigError(
                f"{p} must be the sweep's own directory (it is a link or a "
                "file); move it away or choose another --out"
            )
    p = out_dir / SWEEP_STATUS_FILE
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise ConfigError(
            f"{p} must be a regular file (it is a link or a directory); "
            "move it away or choose another --out"
        )


def _check_run_entries(run: PlannedRun, out_dir: Path) -> None:
    """Run ``run``'s files in the sweep (its planned config, its log) are regular files
    or absent; its directory is a real directory or absent and, for a run that will start
    afresh over an earlier attempt, one ``run --overwrite`` may clear."""
    from fedrcl_flwr.run.results import overwrite_problem

    for p in (sweep_config_path(out_dir, run.name), sweep_log_path(out_dir, run.name)):
        if p.is_symlink() or (p.exists() and not p.is_file()):
            raise ConfigError(
                f"{p} must be a regular file written by the sweep (it is "
                "a link or a directory); move it away"
            )
    _check_written_in_place(sweep_log_path(out_dir, run.name))
    d = run.out_dir
    if d.is_symlink() or (d.exists() and not d.is_dir()):
        raise ConfigError(
            f"run '{run.name}': {d} is a link or a file, not a run "
            "directory; move it away or choose another --out"
        )
    if d.exists() and run.state() == "new":
        why = overwrite_problem(d)
        if why:
            raise ConfigError(f"run '{run.name}' would start afresh, but {why}")


def check_pending_runs(runs: list[PlannedRun], finished: frozenset = frozenset()) -> None:
    """What ``run`` checks before Flower starts (resources present, model builds, dataset
    present, split possible), for every run still to do (not done, and not among the run
    indices ``finished`` elsewhere), so that such an input error stops the sweep up front
    (exit 2) instead of failing its runs one by one. Datasets that are generated
    (synthetic) or downloaded are left to each run; one dataset is held in memory at a
    time."""
    last = None
    for run in runs:
        cfg = run.cfg
        if run.state() == "done" or run.index in finished:
            continue
        label = f"run '{run.name}'"
        try:
            check_resources(cfg)
        except ConfigError as exc:
            raise ConfigError(f"{label}: {exc}") from None
        check_model(cfg, label)
        if dataset_info(cfg.dataset.name).generated or cfg.dataset.download:
            continue
        key = _dataset_key(cfg)
        if key != last:  # one dataset in memory at a time
            _forget_datasets()
            last = key
        check_split(cfg, label)
    _forget_datasets()


def _dataset_key(cfg: ExperimentConfig) -> Any:
    """What decides the dataset a run loads (runs with equal keys share it)."""
    return (cfg.dataset, cfg.seed)


def _forget_datasets() -> None:
    """Drop the datasets and splits this process holds (the sweep's checks load them one
    by one; its runs load their own)."""
    from fedrcl_flwr.run import runtime

    runtime.WORKER.clear_datasets()
