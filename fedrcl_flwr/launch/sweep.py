"""Sweeps: a paper table (methods x settings x seeds) as one resumable command.

A sweep file::

    base: experiments/fedrcl/table1_cifar10_a0.3.yaml   # or a list of YAMLs (one per setting)
    grid: {client.method: [fedavg, fedprox, fedrcl], partition.alpha: [0.05, 0.3]}
    seeds: [0, 1, 2]
    variants:                    # optional: hand-picked runs (combined with the grid)
      - {client.method: fedavg}
      - {client.method: fedprox, client.params: {mu: 0.001}}
    set: {federation.rounds: 3}  # optional: fixed overrides for every run

``base`` paths are relative to the sweep file, else to the working directory. The runs are
``bases x variants x product(grid) x seeds``; each run's configuration is the base YAML
with, in order, ``set``, the variant, the grid point, ``seed`` and the command line's
``--set`` applied as dotted overrides (``fedrcl_flwr.config.apply_overrides``). A variant
may carry a ``label`` (then every variant must), used in run names instead of its values.

Every run is validated before anything runs (one bad combination: one line naming the
sweep file and the run, exit 2). A labelled variant's runs carry the label in their
configuration (``label``: what ``report`` and ``plot`` call their row). Each run directory
is ``OUT/<name>``, ``<name>`` = the label (else the method), the grid values that vary,
the seed and a short hash of the resolved experiment (:func:`run_name`,
:func:`experiment_hash`: ``fedprox_alpha=0.1_seed=0_1f3a9c2e``). The hash identifies the
run: directories under other names holding a planned experiment (names of an earlier
version: the hash-only ``fedprox_seed=0_1f3a9c2e``, ``method=fedavg_alpha=0.05_seed=0``;
a sweep that grew a grid key) are renamed to the planned name when finished or
checkpointed (:func:`take_over_earlier_runs`), so nothing finished runs again; others are
left untouched, with a note. Runs go through the
``run`` command (``python -m fedrcl_flwr.cli run``: the runner's private SuperLink, free
port and teardown), ``jobs`` of them at once; ``OUT/_configs/<name>.yaml`` holds each
planned configuration and ``OUT/_logs/<name>.log`` each run's output. A rerun skips runs
with a ``summary.json``, resumes runs with a ``checkpoint.pt`` (``--resume``), and starts
the others afresh (``run --overwrite``, which clears only a run directory the tool
created); sweeps force ``output.checkpoint_every >= 1`` so that any run killed after its
first round continues from a checkpoint. ``OUT/sweep_status.json`` records each run's
outcome.

Safety (issue 21): the sweep's ``name``, every ``label`` and every run directory name are
single safe path components (:func:`run_name_problem`); at most :data:`MAX_SWEEP_RUNS`
runs; a key set in two places (``set``/grid/variant/``seeds``) is refused; every path the
sweep will write or remove is checked before anything is (:func:`fedrcl_flwr.launch.preflight.check_sweep_dir`); the
sweep holds ``OUT``'s lock and its runs die with it, however it dies (:func:`run_sweep`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedrcl_flwr.config import (
    MAX_NAME_BYTES,
    ExperimentConfig,
    _shorten,
    apply_overrides,
    config_from_dict,
    dump_config,
    key_problem,
    name_problem,
    parse_override,
    read_yaml,
)
from fedrcl_flwr.errors import ConfigError, shown
from fedrcl_flwr.launch.plan import PlannedRun, _dir_state, earlier_runs, experiment_hash
from fedrcl_flwr.launch.processes import (
    HOME_PREFIX,
    SWEEP_VAR,
    OutputLock,
    Watchdog,
    reap_stale_runs,
)
from fedrcl_flwr.run.results import (
    atomic_write_text,
    ema_note,
    read_metrics,
    reported_value,
    shows_ema,
)
from fedrcl_flwr.run.run_files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    SUMMARY_FILE,
    append_file,
    sweep_config_path,
    sweep_log_path,
)
from fedrcl_flwr.run.run_files import (
    SWEEP_CONFIGS_DIR as CONFIGS_DIR,
)
from fedrcl_flwr.run.run_files import (
    SWEEP_ENTRIES as RESERVED_NAMES,
)
from fedrcl_flwr.run.run_files import (
    SWEEP_LOGS_DIR as LOGS_DIR,
)
from fedrcl_flwr.run.run_files import (
    SWEEP_STATUS_FILE as STATUS_FILE,
)

SWEEP_KEYS = ("base", "grid", "seeds", "variants", "set", "name")
# a sweep file may plan at most this many runs (a typo in a grid is refused at once
# instead of planning for hours); FedRCL Table 1, the largest paper table, is 450 runs
MAX_SWEEP_RUNS = 10_000
# a run directory's name: at most this many bytes (the file system allows 255, and the
# sweep adds ``.yaml`` / ``.log`` / ``.tmp`` to it)
MAX_RUN_NAME_BYTES = 200


def _fmt_value(v: Any) -> str:
    if isinstance(v, (dict, list)):
        if not v:
            return "none"
        text = yaml.safe_dump(v, default_flow_style=True, width=10**6).strip()
        text = text[1:-1]
    elif v is None:
        text = "null"
    elif isinstance(v, bool):
        text = "true" if v else "false"
    else:
        text = str(v)
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text.replace(": ", "-")).rstrip("-") or "x"


def run_name(cfg: ExperimentConfig, shown: list | tuple = (), digest: str | None = None) -> str:
    """A run directory's name: the variant label (else the method, prefixed by a server
    optimizer other than fedavg), the grid values ``shown`` (``[(short key, value)]``:
    the grid keys with more than one value, :func:`shown_grid_values`), the seed and
    :func:`experiment_hash`: ``fedrcl_alpha=0.1_seed=0_1f3a9c2e``. The hash identifies
    the run: a sweep that grows a grid key renames its earlier runs (their names lacked
    the key) by taking them over by hash (:func:`take_over_earlier_runs`), never runs them
    again. A name that would be longer than :data:`MAX_RUN_NAME_BYTES` leaves the grid
    values out."""
    from fedrcl_flwr.report.reading import method_label

    what = cfg.label or method_label(
        {"client": {"method": cfg.client.method}, "server": {"strategy": cfg.server.strategy}}
    )
    digest = experiment_hash(cfg) if digest is None else digest
    tail = f"seed={cfg.seed}_{digest}"
    values = "".join(f"{k}={_fmt_value(v)}_" for k, v in shown)
    name = f"{_fmt_value(what)}_{values}{tail}"
    if len(name.encode()) > MAX_RUN_NAME_BYTES:
        name = f"{_fmt_value(what)}_{tail}"
    return name


def shown_grid_keys(grid: dict, labelled: bool) -> list[tuple[str, str]]:
    """``[(grid key, short name)]`` of the grid keys a run name shows: those with more
    than one value, except ``seed`` and (without variant labels, where the name is the
    method already) ``client.method`` / ``server.strategy``; a key is shortened to its
    last component unless two shown keys would share it."""
    named = () if labelled else ("client.method", "server.strategy")
    keys = [k for k, v in grid.items() if len(v) > 1 and k != "seed" and k not in named]
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return [(k, s if last.count(s) == 1 else k) for k, s in zip(keys, last)]


def _as_list(value: Any, key: str, source: str) -> list:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{source}: '{key}' must be a non-empty list")
    return value


def _mapping(value: Any, key: str, source: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise ConfigError(f"{source}: '{key}' must be a mapping of dotted config keys")
    for k in value:  # '../x' is no key (it would be read as the key '')
        why = key_problem(k)
        if why:
            raise ConfigError(f"{source}: '{key}' key {shown(k)} {why}")
    return value


def run_name_problem(name: Any, max_bytes: int = MAX_RUN_NAME_BYTES) -> str | None:
    """Why ``name`` cannot name a run directory of a sweep (``None`` when it can): one
    safe path component (:func:`fedrcl_flwr.config.name_problem`), not hidden (no leading
    ``.``) and not one of the sweep's own names (``_configs``, ``_logs``,
    ``sweep_status.json``)."""
    why = name_problem(name, max_bytes)
    if why:
        return why
    if name.startswith("."):
        return "may not start with '.'"
    if name in RESERVED_NAMES:
        return f"is a name the sweep uses for its own files ({', '.join(RESERVED_NAMES)})"
    return None


def _overlaps(a: str, b: str) -> bool:
    """Dotted keys ``a`` and ``b`` set the same value (equal, or one inside the other)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _resolve_base(text: Any, sweep_path: Path) -> Path:
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{sweep_path}: 'base' must be a YAML path or a list of them")
    p = Path(text).expanduser()
    for cand in [p] if p.is_absolute() else [sweep_path.parent / p, Path.cwd() / p]:
        if cand.is_file():
            return cand.resolve()
    raise ConfigError(
        f"{sweep_path}: base experiment '{text}' not found (relative to the "
        "sweep file or the working directory)"
    )


@dataclass
class SweepSpec:
    """A sweep file, read and checked part by part (:func:`read_sweep_spec`)."""

    path: Path
    bases: list[Path]
    grid: dict
    fixed: dict  # the file's ``set``
    variants: list[dict]
    seeds: list[int] | None
    name: Any  # the sweep's name: ``name`` (named_in_file) or the file's stem
    named_in_file: bool

    @property
    def src(self) -> str:
        return str(self.path)

    def variant_keys(self) -> list[tuple[str, list[str]]]:
        """``(where, keys)`` of each variant (``label`` is not a key)."""
        return [
            (f"variants[{i}]", [k for k in v if k != "label"]) for i, v in enumerate(self.variants)
        ]

    def size(self) -> int:
        n = (
            len(self.bases)
            * len(self.variants)
            * (len(self.seeds) if self.seeds is not None else 1)
        )
        for vs in self.grid.values():
            n *= len(vs)
        return n


def plan_sweep(
    sweep_path: str | Path,
    out: str | Path | None = None,
    sets: list[str] | None = None,
    *,
    check_components: bool = True,
) -> tuple[list[PlannedRun], Path]:
    """Expand and validate a sweep file; returns the runs and the output directory.
    Steps: read and check the file (:func:`read_sweep_spec`), refuse a key set in two
    places, a plan over :data:`MAX_SWEEP_RUNS` runs and a ``--set`` of a key the sweep
    varies, then expand every run (each config checked, :func:`_expand`) and give each
    its directory (:func:`_place_runs`)."""
    spec = read_sweep_spec(Path(sweep_path))
    _check_one_place_per_key(spec)
    if spec.size() > MAX_SWEEP_RUNS:
        raise ConfigError(
            f"{spec.src}: plans {spec.size()} runs (bases x variants x grid x "
            f"seeds), more than {MAX_SWEEP_RUNS}; split it into several sweeps"
        )
    cli_sets = _cli_sets(spec, sets)
    _check_sweep_name(spec)
    out_dir = Path(out) if out else Path("runs") / "sweeps" / str(spec.name)
    out_dir = out_dir.expanduser().resolve()
    runs = _expand(spec, cli_sets, check_components)
    _place_runs(runs, spec, out_dir)
    return runs, out_dir


def read_sweep_spec(sweep_path: Path) -> SweepSpec:
    """The sweep file's parts, each checked on its own: known keys, ``base`` (files that
    exist, no file name twice), ``grid`` / ``set`` (mappings of dotted keys, each grid key
    a non-empty list), ``variants`` (mappings; labels on all or none, each a safe name),
    ``seeds`` (distinct integers in [0, 2**32))."""
    spec = read_yaml(sweep_path)
    src = str(sweep_path)
    unknown = sorted(set(spec) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(
            f"{src}: unknown sweep key '{unknown[0]}' (allowed: {', '.join(SWEEP_KEYS)})"
        )
    if "base" not in spec:
        raise ConfigError(f"{src}: 'base' (the experiment YAML) is required")
    bases_raw = spec["base"] if isinstance(spec["base"], list) else [spec["base"]]
    bases = [_resolve_base(b, sweep_path) for b in _as_list(bases_raw, "base", src)]
    if len({b.stem for b in bases}) != len(bases):
        raise ConfigError(f"{src}: 'base' lists the same file name twice")
    grid = _mapping(spec.get("grid"), "grid", src)
    for k, vs in grid.items():
        _as_list(vs, f"grid.{k}", src)
    fixed = _mapping(spec.get("set"), "set", src)
    variants = _variants(spec.get("variants"), src)
    seeds = spec.get("seeds")
    if seeds is not None:
        seeds = _as_list(seeds, "seeds", src)
        if not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**32 for s in seeds
        ):
            raise ConfigError(f"{src}: 'seeds' must be a list of integers in [0, 2**32)")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"{src}: 'seeds' lists a seed twice")
    return SweepSpec(
        sweep_path,
        bases,
        grid,
        fixed,
        variants,
        seeds,
        spec["name"] if "name" in spec else sweep_path.stem,
        "name" in spec,
    )


def _variants(variants: Any, src: str) -> list[dict]:
    """``variants`` (default: one variant that changes nothing): a list of mappings, all
    labelled or none, each label a safe directory name."""
    variants = _as_list([{}] if variants is None else variants, "variants", src)
    labelled = [isinstance(v, dict) and "label" in v for v in variants]
    if any(labelled) and not all(labelled):
        raise ConfigError(f"{src}: give every variant a 'label', or none")
    for i, v in enumerate(variants):
        _mapping(v, f"variants[{i}]", src)
        if "label" in v:
            label = v["label"]
            why = (
                "must be a string"
                if not isinstance(label, (str, int)) or isinstance(label, bool)
                else run_name_problem(str(label), MAX_NAME_BYTES)
            )
            if why:
                raise ConfigError(
                    f"{src}: variants[{i}].label {why} (it names run "
                    f"directories), got {_shorten(label)}"
                )
    return variants


def _check_one_place_per_key(spec: SweepSpec) -> None:
    """One place per key: a key set twice would be decided by the order of application
    (set < variant < grid < seeds), silently; refuse it instead."""
    src, grid = spec.src, spec.grid
    for where, keys in spec.variant_keys():
        for vk in keys:
            for gk in grid:
                if _overlaps(vk, gk):
                    raise ConfigError(
                        f"{src}: 'grid.{gk}' and {where} '{vk}' set the "
                        "same key (the grid would silently win); vary it in "
                        "one place only"
                    )
    for fk in spec.fixed:
        for where, keys in [("grid", list(grid))] + spec.variant_keys():
            hit = next((k for k in keys if _overlaps(fk, k)), None)
            if hit is not None:
                raise ConfigError(
                    f"{src}: 'set.{fk}' and {where} '{hit}' set the same key "
                    f"('set' is for what every run shares; the {where.split('[')[0]}"
                    " would silently win); keep it in one place"
                )
    if spec.seeds is not None:
        for where, keys in [("grid", list(grid)), ("set", list(spec.fixed))] + spec.variant_keys():
            if any(_overlaps(k, "seed") for k in keys):
                raise ConfigError(
                    f"{src}: {where} sets 'seed' and 'seeds' is given (seeds "
                    "would silently win); use one of them"
                )


def _cli_sets(spec: SweepSpec, sets: list[str] | None) -> list[tuple[str, Any]]:
    """The command line's ``--set`` overrides; a key the sweep varies is refused."""
    cli_sets = [parse_override(s) for s in (sets or [])]
    varying_keys = set(spec.grid) | {k for _, keys in spec.variant_keys() for k in keys}
    if spec.seeds is not None:
        varying_keys.add("seed")
    for k, _ in cli_sets:
        if any(_overlaps(k, vk) for vk in varying_keys):
            raise ConfigError(
                f"--set {k}: the sweep {spec.src} varies this key (grid/"
                "variants/seeds); edit the sweep file instead"
            )
    return cli_sets


def _check_sweep_name(spec: SweepSpec) -> None:
    """The sweep's name (``name``, else the file's) is one safe directory name."""
    why = run_name_problem(spec.name, MAX_NAME_BYTES)
    if not why:
        return
    if spec.named_in_file:
        raise ConfigError(
            f"{spec.src}: 'name' {why} (it names the sweep's directory and "
            f"runs), got {_shorten(spec.name)}"
        )
    raise ConfigError(
        f"{spec.src}: the file's name {why}, got {_shorten(spec.name)}; "
        "set 'name' in the sweep file"
    )


def _expand(spec: SweepSpec, cli_sets: list, check_components: bool) -> list[PlannedRun]:
    """Every run, in the order ``bases x variants x grid x seeds``: the base YAML with
    ``set``, the variant, the grid point, the seed and ``--set`` applied, checked as a
    config (and, with ``check_components``, against the method's contract)."""
    grid_keys = list(spec.grid)
    combos = list(itertools.product(*[spec.grid[k] for k in grid_keys])) if grid_keys else [()]
    shown_keys = shown_grid_keys(spec.grid, any("label" in v for v in spec.variants))
    runs: list[PlannedRun] = []
    fixed_items = list(spec.fixed.items())
    for base in spec.bases:
        base_data = read_yaml(base)
        for variant in spec.variants:
            vitems = [(k, v) for k, v in variant.items() if k != "label"]
            for combo in combos:
                for seed in spec.seeds if spec.seeds is not None else [None]:
                    ov = fixed_items + vitems + list(zip(grid_keys, combo))
                    if seed is not None:
                        ov.append(("seed", seed))
                    ov += cli_sets
                    data = apply_overrides(base_data, ov)
                    if "label" in variant:  # how report / plot name the run's row
                        data["label"] = str(variant["label"])
                    what = ", ".join(f"{k}={v}" for k, v in ov if (k, v) not in fixed_items)
                    where = f"{spec.src}: run {len(runs) + 1} ({what}; base {base.name})"
                    cfg = config_from_dict(data, where)
                    if check_components:
                        from fedrcl_flwr.launch.preflight import check_components as validate

                        validate(cfg, where)
                    point = dict(zip(grid_keys, combo))
                    shown = [(short, point[k]) for k, short in shown_keys]
                    digest = experiment_hash(cfg)
                    run = PlannedRun(len(runs), run_name(cfg, shown, digest), base, ov, cfg)
                    run.digest = digest
                    runs.append(run)
    return runs


def _place_runs(runs: list[PlannedRun], spec: SweepSpec, out_dir: Path) -> None:
    """Each run's directory ``out_dir/<name>`` (a safe name; two runs of the same
    experiment are refused), set in its config with what a sweep adds: the sweep's name
    as the tracker group (W&B / MLflow) and a checkpoint every round at least (every run
    resumable)."""
    seen: dict[str, int] = {}
    for run in runs:
        why = run_name_problem(run.name)
        if why:
            raise ConfigError(
                f"{spec.src}: run {run.index + 1}'s directory name {why}, got "
                f"{_shorten(run.name)}; give the variants short labels"
            )
        same = run.digest or experiment_hash(run.cfg)
        if same in seen:
            raise ConfigError(
                f"{spec.src}: runs {seen[same] + 1} and {run.index + 1} are "
                f"the same experiment ('{run.name}': they differ at most in "
                "name, label, output, simulation or reference, which do not "
                "change what a run computes); remove the duplicate"
            )
        seen[same] = run.index
        run.out_dir = out_dir / run.name
        run.cfg.output.dir = str(run.out_dir)
        if run.cfg.output.tracker_group is None and {"wandb", "mlflow"} & set(
            run.cfg.output.tracker
        ):  # the sweep groups its runs in W&B / MLflow
            run.cfg.output.tracker_group = str(spec.name)
        if run.cfg.output.checkpoint_every < 1:
            run.cfg.output.checkpoint_every = 1  # resumable from round 1 on


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


class SweepEta:
    """The time a sweep has left, from what this sweep measured itself (issue #25: an
    estimate from the whole elapsed time over the rounds done counted every run's
    start-up against one round, 4 h 17 min for a 16-minute sweep).

    Measured: ``r``, the seconds per round (each record's ``round_time_s``, the mean of
    the latest ``window``, leaving out a run's first round after a (re)start, which
    includes Ray's actor start: 32 s against 0.8 s seen); each run's time from launch to
    its first recorded round; and, once runs have finished, each one's whole time and
    rounds. A run costs its *overhead* (whole time − rounds · r: Flower's and Ray's start,
    writing the results, tearing down) plus its rounds; the part before its first round
    is (launch → first round) − r, the rest is its end. With ``jobs`` runs at a time,
    each progressing one round per ``r``: ``ETA = max(work / jobs, longest run in
    flight)``, work = per run in flight its rounds left and its end, per queued run its
    overhead and rounds. None until a round other than a first one is recorded."""

    def __init__(self, jobs: int, window: int = 50):
        self.jobs = max(int(jobs), 1)
        self.window = window
        self.rounds: list[float] = []
        self.to_first: list[float] = []  # launch -> first round recorded
        self.finished: list[tuple] = []  # (whole seconds, rounds run)

    def observe_round(self, seconds: Any, first_of_launch: bool = False) -> None:
        if not first_of_launch and isinstance(seconds, (int, float)) and seconds >= 0:
            self.rounds.append(float(seconds))

    def observe_startup(self, seconds: float) -> None:
        """A run's first round was recorded ``seconds`` after its launch."""
        self.to_first.append(max(float(seconds), 0.0))

    def observe_finish(self, seconds: float, rounds: int) -> None:
        """A run ended ``seconds`` after its launch, having run ``rounds`` rounds."""
        self.finished.append((float(seconds), int(rounds)))

    def round_s(self) -> float | None:
        recent = self.rounds[-self.window :]
        return sum(recent) / len(recent) if recent else None

    def eta(self, in_flight: list[int], queued: list[int]) -> float | None:
        """``in_flight``: rounds left of each running run; ``queued``: rounds of each
        run not started yet."""
        if not in_flight and not queued:
            return 0.0
        r = self.round_s()
        if r is None:
            return None

        def mean(xs: list) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        start = max(mean(self.to_first) - r, 0.0)
        if self.finished:
            whole = mean([max(t - n * r, 0.0) for t, n in self.finished])
            end = max(whole - start, 0.0)
        else:
            whole, end = start, 0.0
        work = sum(n * r + end for n in in_flight) + sum(whole + n * r for n in queued)
        return max(work / self.jobs, max(in_flight, default=0) * r + end)


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


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
    one progress line per recorded round with the ETA (:class:`SweepEta`), each run's
    outcome in ``sweep_status.json``.

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


def _read_status(path: Path) -> dict:
    """``sweep_status.json`` as a mapping (empty when absent or unreadable: it is rebuilt
    from the runs)."""
    try:
        status = json.loads(path.read_text()) if path.is_file() else {}
    except (ValueError, OSError, RecursionError):
        return {}
    return status if isinstance(status, dict) else {}


def _is_number(v: Any) -> bool:
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _reported(run_dir: Path) -> tuple[str, float | None]:
    """The metric a finished run reports (its summary's ``report_metric``: the study's,
    a domain mean for an inter-domain run) and its value (``None`` if absent or
    unreadable: only shown on the progress line)."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_bytes()[: 1 << 20])
    except (ValueError, OSError, RecursionError):
        return "final", None
    if not isinstance(summary, dict):
        return "final", None
    metric = summary.get("report_metric")
    metric = metric if isinstance(metric, str) and metric else "final"
    value = reported_value(summary, metric)
    return metric, float(value) if value is not None and _is_number(value) else None


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


def _log_tail(path: Path) -> str:
    try:
        rows = [r.strip() for r in path.read_text().splitlines() if r.strip()]
    except OSError:
        return ""
    errs = [r for r in rows if r.startswith("fedrcl-flwr:") and ("error" in r or "failed" in r)]
    return (errs[-1] if errs else (rows[-1] if rows else ""))[:300]


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
