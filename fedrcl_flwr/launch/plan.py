"""A sweep's planned runs and what identifies them, shared by the sweep and the pre-run
checks (:mod:`fedrcl_flwr.launch.sweep_spec` plans them, :mod:`fedrcl_flwr.launch.sweep`
runs them; :mod:`fedrcl_flwr.launch.preflight` checks them): :class:`PlannedRun` and its
state, :func:`experiment_hash` (what a run computes), :func:`earlier_runs` (directories of
an earlier plan holding a planned experiment) and their take-over
(:func:`take_over_earlier_runs`: directories of an earlier version's names, the hash-only
``fedprox_seed=0_1f3a9c2e`` or ``method=fedavg_alpha=0.05_seed=0``, or of a sweep that grew
a grid key, are renamed to the planned name when finished or checkpointed, so nothing
finished runs again; others are left untouched, with a note), the rounds a resume keeps
(:func:`_rounds_done`) and the dry run's listing (:func:`format_plan`)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedrcl_flwr.config import ExperimentConfig, config_from_dict, dump_config, read_yaml
from fedrcl_flwr.config import flatten_keys as flat
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.launch.processes import OutputLock
from fedrcl_flwr.run.results import atomic_write_text, read_metrics
from fedrcl_flwr.run.run_files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    SUMMARY_FILE,
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


@dataclass
class PlannedRun:
    index: int
    name: str
    base: Path
    overrides: list  # [(dotted key, value)]
    cfg: ExperimentConfig
    placed_dir: Path | None = None  # the run's directory, set by _place_runs
    digest: str = ""  # its experiment_hash, computed once when planned

    @property
    def out_dir(self) -> Path:
        """The run's directory (``<sweep out>/<name>``); every run ``plan_sweep``
        returns is placed."""
        if self.placed_dir is None:
            raise RuntimeError(
                f"sweep run {self.name!r} has no directory yet (_place_runs "
                "gives each planned run one)"
            )
        return self.placed_dir

    @out_dir.setter
    def out_dir(self, value: Path) -> None:
        self.placed_dir = value

    def state(self) -> str:
        """``done``, ``resume`` (checkpoint present) or ``new``."""
        if (self.out_dir / SUMMARY_FILE).is_file():
            return "done"
        if (self.out_dir / CHECKPOINT_FILE).is_file():
            return "resume"
        return "new"


_NOT_COMPUTED = ("name", "label", "output", "simulation", "reference", "dataset.cache_dir")


def _flat_config(obj: Any, prefix: str = "") -> dict:
    """``flatten_keys(to_dict(obj))`` without copying the configuration first: the same
    dotted keys and values (sections recursed, mappings flattened, an empty mapping no
    key, lists as leaves), in a fraction of the time of ``dataclasses.asdict``."""
    out: dict = {}
    cls: type = type(obj)
    for name in _field_names(cls):
        v = getattr(obj, name)
        key = f"{prefix}.{name}" if prefix else name
        if hasattr(type(v), "__dataclass_fields__"):
            out.update(_flat_config(v, key))
        elif isinstance(v, dict):
            out.update(flat(v, key))
        else:
            out[key] = v
    return out


def _not_computed(key: str) -> bool:
    """``key`` is one of :data:`_NOT_COMPUTED` or below one."""
    head = key.split(".", 1)[0]
    if head in _NOT_COMPUTED:
        return True
    return key == "dataset.cache_dir" or key.startswith("dataset.cache_dir.")


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _json(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


@functools.lru_cache(maxsize=1)
def _default_values() -> dict:
    """The schema's defaults as dotted keys: ``(value, its JSON text)``."""
    return {k: (v, _json(v)) for k, v in _flat_config(ExperimentConfig()).items()}


def _is_default(key: str, v: Any) -> bool:
    """``v`` is ``key``'s default, judged by their JSON texts (``1`` is not ``1.0``);
    scalars of one type are compared directly (the same text when equal: ``repr`` for
    floats, so ``-0.0`` is not ``0.0``)."""
    dv, text = _default_values()[key]
    if type(v) is type(dv) and type(v) in (str, int, bool, type(None)):
        return v == dv
    if type(v) is float and type(dv) is float:
        return repr(v) == repr(dv)
    return _json(v) == text


def experiment_hash(cfg: ExperimentConfig) -> str:
    """8 hex digits of SHA-256 over what the run computes: the resolved experiment's
    values that differ from the schema's defaults, as dotted keys (so a key added to the
    schema later, at its default, changes no name), without what only names, places or
    resources a run (``name``, ``label``, ``output``, ``simulation``, ``reference``,
    ``dataset.cache_dir``). ``client.params`` count as written. Linear in the
    configuration's keys, the defaults computed once (a 3,000-run plan hashes each run
    once)."""
    defaults = _default_values()
    mine = {
        k: v
        for k, v in _flat_config(cfg).items()
        if not _not_computed(k) and (k not in defaults or not _is_default(k, v))
    }
    text = json.dumps(mine, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _dir_state(d: Path) -> str:
    if (d / SUMMARY_FILE).is_file():
        return "done"
    return "resume" if (d / CHECKPOINT_FILE).is_file() else "new"


def earlier_runs(runs: list[PlannedRun], out_dir: Path) -> tuple[dict, list]:
    """Run directories in ``out_dir`` under names this plan does not use — an earlier
    version of the sweep named runs after what varied (``method=fedavg_alpha=0.1_seed=0``),
    or a run was renamed by hand. Returns ``{run index: directory}`` for those holding a
    planned experiment (the same :func:`experiment_hash`) that is finished or
    checkpointed, not in use by a live run, whose planned directory does not exist yet;
    and the list of the other directories, which the sweep leaves alone."""
    planned = {r.out_dir.name for r in runs}
    by_hash = {(r.digest or experiment_hash(r.cfg)): r for r in runs}
    found: dict = {}
    others: list = []
    if not out_dir.is_dir():
        return found, others
    for d in sorted(out_dir.iterdir()):
        if (
            d.is_symlink()
            or not d.is_dir()
            or d.name in planned
            or d.name in (CONFIGS_DIR, LOGS_DIR)
            or not (d / CONFIG_FILE).is_file()
        ):
            continue  # (a link is never taken over: writing into it would leave --out)
        try:
            run = by_hash.get(
                experiment_hash(config_from_dict(read_yaml(d / CONFIG_FILE), str(d / CONFIG_FILE)))
            )
        except ConfigError:
            run = None
        if (
            run is None
            or run.index in found
            or run.out_dir.exists()
            or _dir_state(d) == "new"
            or OutputLock.holder(d) is not None
        ):
            others.append(d)
        else:
            found[run.index] = d
    return found, others


def take_over_earlier_runs(
    runs: list[PlannedRun], out_dir: Path, *, dry_run: bool = False
) -> list[str]:
    """Move each directory :func:`earlier_runs` matched to its planned name (a rename in
    ``out_dir``: nothing is deleted or recomputed), with its log, and its ``config.yaml``
    rewritten as planned (the same experiment: only its name, label and paths change).
    Returns the lines to print (what would be done, with ``dry_run``)."""
    found, others = earlier_runs(runs, out_dir)
    lines = []
    for index, d in sorted(found.items()):
        run = runs[index]
        lines.append(
            f"{d.name}: holds run {index + 1} ({_dir_state(d)}), "
            f"{'to be ' if dry_run else ''}renamed {run.name}"
        )
        if dry_run:
            continue
        os.rename(d, run.out_dir)
        dump_config(run.cfg, run.out_dir / CONFIG_FILE)
        old_log, new_log = sweep_log_path(out_dir, d.name), sweep_log_path(out_dir, run.name)
        if old_log.exists() and not new_log.exists():
            os.rename(old_log, new_log)
        status_path = out_dir / STATUS_FILE
        try:
            status = json.loads(status_path.read_text())
        except (OSError, ValueError):
            status = None
        if isinstance(status, dict) and d.name in status:
            status.pop(d.name)
            atomic_write_text(status_path, json.dumps(status, indent=2) + "\n")
    if others:
        lines.append(
            f"{len(others)} other run director{'y' if len(others) == 1 else 'ies'} "
            f"in {out_dir} left untouched (not planned by this sweep, e.g. "
            f"{others[0].name}); `fedrcl-flwr report {out_dir}` reads them too: "
            "move them elsewhere if they are not part of this study"
        )
    return lines


def _rounds_done(run: PlannedRun) -> int:
    """What a resume keeps: the rounds up to the checkpoint (read through the one safe
    loader, :func:`fedrcl_flwr.run.checkpoint.load_checkpoint`: data only, never code)."""
    from fedrcl_flwr.errors import CheckpointError
    from fedrcl_flwr.run.checkpoint import load_checkpoint

    if not read_metrics(run.out_dir) or not (run.out_dir / CHECKPOINT_FILE).is_file():
        return 0
    try:
        done = load_checkpoint(run.out_dir)["round"]
    except CheckpointError:  # unreadable checkpoint: `run --resume` will say why
        return 0
    return done if isinstance(done, int) and not isinstance(done, bool) and done >= 0 else 0


_FLOW_TEXT: dict[str, str] = {}  # repr of a value -> its flow YAML (format_plan)


def _flow(v: Any) -> str:
    """``v`` as one line of flow YAML; memoised by ``repr`` (equal reprs of plain YAML
    values are equal values), so a plan of thousands of runs dumps each value once."""
    key = repr(v)
    text = _FLOW_TEXT.get(key)
    if text is None:
        if len(_FLOW_TEXT) > 100_000:
            _FLOW_TEXT.clear()
        text = _FLOW_TEXT[key] = (
            yaml.safe_dump(v, default_flow_style=True, width=10**6)
            .strip()
            .removesuffix("\n...")
            .strip()
        )
    return text


def format_plan(runs: list[PlannedRun], out_dir: Path) -> str:
    lines = [f"{len(runs)} runs -> {out_dir}"]
    common = (
        [
            kv
            for kv in runs[0].overrides
            if all(any(_flow(kv) == _flow(o) for o in r.overrides) for r in runs)
        ]
        if len(runs) > 1
        else []
    )
    if common:
        lines.append("every run: " + ", ".join(f"{k}={_flow(v)}" for k, v in common))
    for run in runs:
        st = run.state()
        if st == "resume":
            st = f"resume after round {_rounds_done(run)}"
        ov = ", ".join(
            f"{k}={_flow(v)}"
            for k, v in run.overrides
            if not any(_flow((k, v)) == _flow(c) for c in common)
        )
        lines.append(f"{run.index + 1:>4}. {run.name}  [{st}]  {run.base.name}: {ov}")
    return "\n".join(lines)
