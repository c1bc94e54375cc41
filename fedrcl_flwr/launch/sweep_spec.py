"""A sweep file: reading it, expanding it into runs, naming them and checking every one
before anything runs (:func:`plan_sweep`). :mod:`fedrcl_flwr.launch.sweep` runs the plan.

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
:func:`fedrcl_flwr.launch.plan.experiment_hash`: ``fedprox_alpha=0.1_seed=0_1f3a9c2e``).
Sweeps force ``output.checkpoint_every >= 1`` so that any run killed after its first
round continues from a checkpoint.

Safety: the sweep's ``name``, every ``label`` and every run directory name are single
safe path components (:func:`run_name_problem`); at most :data:`MAX_SWEEP_RUNS` runs; a
key set in two places (``set``/grid/variant/``seeds``) is refused.
"""

from __future__ import annotations

import itertools
import re
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
    key_problem,
    name_problem,
    parse_override,
    read_yaml,
)
from fedrcl_flwr.errors import ConfigError, shown
from fedrcl_flwr.launch.plan import PlannedRun, experiment_hash
from fedrcl_flwr.run.run_files import SWEEP_ENTRIES as RESERVED_NAMES

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
    :func:`fedrcl_flwr.launch.plan.experiment_hash`: ``fedrcl_alpha=0.1_seed=0_1f3a9c2e``.
    The hash identifies the run: a sweep that grows a grid key renames its earlier runs
    (their names lacked the key) by taking them over by hash
    (:func:`fedrcl_flwr.launch.plan.take_over_earlier_runs`), never runs them again. A
    name that would be longer than :data:`MAX_RUN_NAME_BYTES` leaves the grid values
    out."""
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
