"""Everything checked before a command writes a file or starts a process, in one place.

Loading a configuration already checks every key (types, the rules of
:data:`fedrcl_flwr.config.CONFIG_RULES`, the checks across keys, and the method's and
strategy's declared contract: :func:`load_experiment`). What needs more than the config —
the output location, the machine's resources, the dataset on disk, the split, the model —
is checked here, once, by the step of each command:

* :func:`before_run` (``run``): the output directory (usable, not held by a live run, not
  holding an earlier run unless ``--overwrite`` / ``--resume``, no links out of it), the
  resources, the dataset prepared into the cache, the split, the model, the checkpoint of
  a resume;
* :func:`fedrcl_flwr.launch.preflight_sweep.before_sweep` (``sweep``): the sweep's
  directory and every run directory in it, then resources, model and split of every run
  still to do (that module holds the sweep's checks);
* :func:`before_partition` (``partition``): the output files, the config, the dataset and
  the split.

A problem is one :class:`~fedrcl_flwr.config.ConfigError` (exit 2) naming the key or the
path; nothing has been written when it is raised.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fedrcl_flwr.config import ExperimentConfig, apply_overrides, config_from_dict, read_yaml
from fedrcl_flwr.errors import ConfigError
from fedrcl_flwr.run.run_files import (
    FLOWER_LOG,
    METRICS_FILE,
    RESULT_FILES,
    RUN_SUBDIRS,
    link_problem,
)

# ----------------------------------------------------------------------------- the config


def load_experiment(path: str, sets: list[str] | None, out: str | None) -> ExperimentConfig:
    """The experiment of ``path`` with the ``--set`` overrides and ``--out`` applied,
    every key checked, and the method's / strategy's parameters checked against their
    declared contract (:func:`check_components`). ``partition.path`` is made absolute
    (relative to the working directory, the same for every process of the run)."""
    data = read_yaml(path)
    overrides: list[Any] = list(sets or [])
    if out is not None:
        if not out.strip():
            raise ConfigError("--out must be a directory path, got an empty string")
        overrides.append(("output.dir", str(Path(out).expanduser().resolve())))
    if overrides:
        data = apply_overrides(data, overrides)
    source = f"{path} (with overrides)" if overrides else str(path)
    cfg = config_from_dict(data, source)
    if cfg.partition.path:  # relative to the working directory, fixed for every process
        cfg.partition.path = str(Path(cfg.partition.path).expanduser().resolve())
    check_components(cfg, source)
    return cfg


def check_components(cfg: ExperimentConfig, source: str | None = None) -> None:
    """``client.method`` / ``server.strategy`` and their parameters against the declared
    contract (:func:`fedrcl_flwr.app.validate.validate_components`, which imports the
    method's Flower client: the app layer)."""
    from fedrcl_flwr.app.validate import validate_components

    validate_components(cfg, source)


# ----------------------------------------------------------------------------- outputs


def check_output_dir(out_dir: Path, what: str = "output directory") -> None:
    """The output directory can be created and written (reads only): it is a directory
    or does not exist yet, no part of its path is a file, and the nearest existing
    ancestor is writable."""
    p = out_dir
    try:
        while not p.exists():
            if p.is_symlink():
                raise ConfigError(f"{what} {out_dir}: {p} is a dangling link")
            p = p.parent
        is_dir = p.is_dir()
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise ConfigError(
            f"{what} {str(out_dir)[:200]}: not a usable path ({exc.strerror or exc})"
        ) from None
    if not is_dir:
        where = "is a file" if p == out_dir else f"is under the file {p}"
        raise ConfigError(f"{what} {out_dir} {where}; choose another --out / output.dir")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {out_dir}: {p} is not writable")


def check_output_file(path: Path, flag: str, *, create_parent: bool = False) -> None:
    """An output file can be written (reads only): not a directory or a link to one, not
    under a file, writable; its directory exists (or, with ``create_parent``, can be
    created)."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    try:
        if p.is_dir():
            raise ConfigError(f"{flag} {path}: is a directory")
        if p.exists() and not os.access(p, os.W_OK):
            raise ConfigError(f"{flag} {path}: not writable")
        if not create_parent and not parent.exists():
            raise ConfigError(f"{flag} {path}: directory {parent} does not exist")
    except OSError as exc:
        raise ConfigError(
            f"{flag} {str(path)[:200]}: not a usable path ({exc.strerror or exc})"
        ) from None
    check_output_dir(parent, f"{flag} {path}: directory")


def check_plot_path(path: str) -> None:
    """``--plot`` names a file matplotlib can write: a known extension, in an existing
    writable directory (checked before any work)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    p = Path(path).expanduser()
    formats = Figure().canvas.get_supported_filetypes()
    ext = p.suffix.lower().lstrip(".")
    if ext not in formats:
        raise ConfigError(
            f"--plot {path}: unknown image type {p.suffix or '(none)'!r}; use "
            f"one of {', '.join('.' + f for f in sorted(formats))}"
        )
    try:
        if p.is_dir():
            raise ConfigError(f"--plot {path}: is a directory")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise ConfigError(f"--plot {path}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise ConfigError(f"--plot {path}: not writable")
    except OSError as exc:
        raise ConfigError(
            f"--plot {str(path)[:200]}: not a usable path ({exc.strerror or exc})"
        ) from None


def check_run_dir(out_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """A run may write ``out_dir``: usable (:func:`check_output_dir`), not held by a live
    run, not holding an earlier run (unless ``overwrite``, in a directory the tool
    created, or ``resume``) and without links among the run's entries (a run writes only
    inside its directory). Reads only."""
    from fedrcl_flwr.run.results import linked_run_entries, overwrite_problem

    _check_free_output_dir(out_dir, "output directory", "another run")
    if not resume:
        old = [
            f
            for f in RESULT_FILES + RUN_SUBDIRS
            if (out_dir / f).exists() or (out_dir / f).is_symlink()
        ]
        if old and not overwrite:
            raise ConfigError(
                f"output directory {out_dir} holds an earlier run "
                f"({', '.join(old)}): pass --overwrite to replace it, --resume "
                f"{out_dir} to continue it, or choose another --out"
            )
        why = overwrite_problem(out_dir)
        if why:  # a run writes (and --overwrite clears) only a directory the tool created
            raise ConfigError(f"output directory {why}" if not overwrite else f"--overwrite: {why}")
    links = [] if overwrite else linked_run_entries(out_dir)
    if links:  # writing through them would write outside the output directory
        raise ConfigError(
            f"output directory {out_dir}: {', '.join(links)} "
            f"{'is a link' if len(links) == 1 else 'are links'}; a run writes "
            "only inside its directory (remove the link, or --overwrite)"
        )
    if not overwrite:  # the files a run appends to: never through a hard link
        for name in (METRICS_FILE, FLOWER_LOG):
            _check_written_in_place(out_dir / name)


def _check_written_in_place(path: Path) -> None:
    """``path``, which the tool appends to, is absent or a regular file of one link (an
    append to a hard-linked file would write into every copy: ``cp -al`` makes them)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    why = link_problem(st)
    if why:
        raise ConfigError(
            f"{path} is {why}; the tool never writes through one (replace it by a copy "
            "of its own, e.g. cp --remove-destination, or choose another --out)"
        )


# ----------------------------------------------------------------------------- resources


def check_resources(cfg: ExperimentConfig) -> None:
    """Input checks on resources (a :class:`ConfigError`, exit 2, before anything is
    written): GPUs requested but absent, ``client.device: cuda`` without CUDA, a client
    wanting more CPUs than Ray gets (instead of Ray's 'ActorPool is empty'), a tracker's
    environment (:func:`fedrcl_flwr.tracking.environment.check_tracker_environment`), a Ray cluster
    that does not answer (:func:`check_ray_address`)."""
    import torch

    cuda = torch.cuda.is_available()
    if cfg.simulation.num_gpus > 0 and not cuda:
        raise ConfigError(
            f"simulation.num_gpus={cfg.simulation.num_gpus} but no CUDA GPU is visible "
            "on this machine; set simulation.num_gpus=0 (and client.device=cpu)"
        )
    if cfg.simulation.init_num_gpus and not cuda:
        raise ConfigError(
            f"simulation.init_num_gpus={cfg.simulation.init_num_gpus} but no CUDA GPU is "
            "visible on this machine; leave it null"
        )
    if cfg.client.device == "cuda" and not cuda:
        raise ConfigError(
            "client.device is 'cuda' but no CUDA device is visible on this "
            "machine; use client.device=auto or cpu"
        )
    if cfg.client.amp == "fp16" and not cuda:
        raise ConfigError(
            "client.amp is fp16 but no CUDA device is visible on this "
            "machine (fp16 training needs CUDA); use client.amp=bf16 or off"
        )
    from fedrcl_flwr.tracking.environment import check_tracker_environment

    check_tracker_environment(cfg)  # W&B's API key, the MLflow server answering
    if cfg.simulation.ray_address:  # the cluster's resources count, not this machine's
        if cfg.simulation.init_num_cpus or cfg.simulation.init_num_gpus is not None:
            raise ConfigError(
                "simulation.init_num_cpus / init_num_gpus size a private local "
                "Ray; with simulation.ray_address the cluster is already sized"
                " (leave them null)"
            )
        check_ray_address(cfg.simulation.ray_address)
        return
    ncpu = os.cpu_count() or 1
    cap = cfg.simulation.init_num_cpus or ncpu
    if cfg.simulation.num_cpus > cap:
        raise ConfigError(
            f"simulation.num_cpus={cfg.simulation.num_cpus} per client exceeds the "
            f"{cap} CPUs available to Ray; no client could ever be scheduled"
        )


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """A ``simulation.ray_address`` ``HOST:PORT`` where no Ray head node answers is a
    :class:`ConfigError` (before any Flower process starts): first a TCP connection,
    then Ray's own handshake — the head's GCS must answer ``GetClusterId`` (gRPC,
    ``timeout`` seconds), so an open port of something else (a web server, a database, a
    process that accepts and says nothing) is refused at once instead of stalling the run
    until ``simulation.startup_timeout_s``. (``auto`` is refused by the key's rule.)"""
    import socket

    host, _, port = address.rpartition(":")
    hint = (
        "start the cluster first (ray start --head) or leave the key null for a private local Ray"
    )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise ConfigError(
            f"simulation.ray_address={address}: no Ray head node answers there "
            f"({exc.strerror or exc}); {hint}"
        ) from None
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # a TLS cluster: the handshake would need its certificates (Ray's job)
    why = _ray_gcs_problem(address, timeout)
    if why:
        raise ConfigError(
            f"simulation.ray_address={address}: something listens there but "
            f"it is not a Ray head node (the Ray handshake failed: {why}); "
            f"give the head's GCS address (HOST:6379 by default); {hint}"
        )


def _ray_gcs_problem(address: str, timeout: float) -> str | None:
    """Why ``address`` is not a Ray head's GCS (``None`` when it answered Ray's
    ``NodeInfoGcsService.GetClusterId`` with a cluster id)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        reply = stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        name = getattr(code, "name", "error")
        return "no answer in time" if name == "DEADLINE_EXCEEDED" else name
    except Exception as exc:  # noqa: BLE001 - a garbled answer is "not Ray" too
        return type(exc).__name__
    finally:
        channel.close()
    if not reply.cluster_id:
        return "no cluster id in the answer"
    return None


# ----------------------------------------------------------------------------- data, model


def prepare_data(cfg: ExperimentConfig, source: str) -> Path:
    """Build (or check) the experiment's dataset cache entry (``fedrcl_flwr.data.cache``);
    returns its path. Input problems are one :class:`ConfigError` naming ``source``."""
    from fedrcl_flwr.data.cache.layout import CacheForeign, cache_dir, check_cache_dir
    from fedrcl_flwr.run.runtime import prepare_dataset, use_prepared_dataset

    root = cache_dir(cfg.dataset)
    why = check_cache_dir(root)
    if why:
        raise ConfigError(f"{source}: dataset.cache_dir {root}: {why}")
    try:
        # the entry's arrays are checked against their content hashes here, once; this
        # process and every process of the run then only open it
        entry = prepare_dataset(cfg, note=lambda m: print(f"fedrcl-flwr: {m}", flush=True))
        use_prepared_dataset(cfg, str(entry))
        return entry
    except CacheForeign as exc:
        raise ConfigError(f"{source}: dataset.cache_dir: {exc}") from None
    except MemoryError:
        raise ConfigError(
            f"{source}: the dataset does not fit in memory (dataset.name={cfg.dataset.name})"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{source}: dataset.cache_dir {root}: cannot write the dataset "
            f"cache ({exc.strerror or exc})"
        ) from None


def check_split(cfg: ExperimentConfig, label: str) -> list:
    """The clients' partitions (:func:`fedrcl_flwr.run.runtime.client_partitions`); an
    impossible split is one :class:`ConfigError` starting with ``label``."""
    from fedrcl_flwr.errors import PartitionError
    from fedrcl_flwr.run import runtime

    try:
        return runtime.client_partitions(cfg)
    except PartitionError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def check_model(cfg: ExperimentConfig, label: str, *, on_data: bool = False) -> None:
    """The configured model builds (``model.params`` keys, backbone, weights file: here,
    not in every Flower process): on the dataset's shapes with ``on_data`` (the dataset
    is loaded), else at nominal shapes (:func:`fedrcl_flwr.run.runtime.probe_model`)."""
    from fedrcl_flwr.run import runtime

    try:
        runtime.check_model(cfg, load_bundle(cfg, label) if on_data else None)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def load_bundle(cfg: ExperimentConfig, label: str):
    """The experiment's dataset (:func:`fedrcl_flwr.run.runtime.load_bundle`); a cache
    entry's path holding something the cache did not write (a link, other files) is one
    :class:`ConfigError` starting with ``label``, the item left in place."""
    from fedrcl_flwr.data.cache.layout import CacheForeign
    from fedrcl_flwr.run import runtime

    try:
        return runtime.load_bundle(cfg)
    except CacheForeign as exc:
        raise ConfigError(f"{label}: dataset.cache_dir: {exc}") from None


# ----------------------------------------------------------------------------- per command


def before_run(
    cfg: ExperimentConfig, source: str, out_dir: Path, *, resume: bool, overwrite: bool
) -> Path:
    """Everything ``run`` checks before it writes a file, in order (module docstring);
    returns the dataset cache entry it prepared. Every dataset (synthetic included) is
    prepared into the dataset cache and split here, before any Flower process starts: a
    missing dataset or an impossible split is one clear error, and the ServerApp and every
    ClientApp only memory-map the entry."""
    from fedrcl_flwr import client_eval

    check_run_dir(out_dir, resume=resume, overwrite=overwrite)
    try:
        check_resources(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    entry = prepare_data(cfg, source)
    parts = check_split(cfg, source)
    if cfg.partition.scheme == "domain":
        from fedrcl_flwr.data.partition_schemes import domain_split_note

        bundle = load_bundle(cfg, source)
        used = domain_split_note(
            parts, bundle.train_labels, bundle.train_domains, bundle.domain_names
        )
        if used:
            print(f"fedrcl-flwr: note: {used}", flush=True)
    note = client_eval.check_test_shares(cfg, parts, source)
    if note:
        print(f"fedrcl-flwr: note: {note}", flush=True)
    check_model(cfg, source, on_data=True)
    if resume:
        from fedrcl_flwr.app.server_app import check_resume

        check_resume(cfg, out_dir)
    return entry


def before_partition(
    experiment: str, sets: list[str] | None, plot: str | None, save: str | None
) -> tuple[ExperimentConfig, Any, list]:
    """Everything ``partition`` checks before it prints or writes: the ``--plot`` and
    ``--save`` files, the config, the dataset and the split. Returns the config, the
    dataset and the clients' partitions."""
    if plot:
        check_plot_path(plot)
    if save is not None:
        if not save.strip():
            raise ConfigError("--save must be a file path, got an empty string")
        check_output_file(Path(save).expanduser(), "--save")
    cfg = load_experiment(experiment, sets, None)
    bundle = load_bundle(cfg, experiment)
    return cfg, bundle, check_split(cfg, experiment)


def _check_free_output_dir(out_dir: Path, what: str, holder_kind: str) -> None:
    """``out_dir`` is a usable output directory (:func:`check_output_dir`) that no live
    run or sweep holds (its :class:`fedrcl_flwr.launch.processes.OutputLock`)."""
    from fedrcl_flwr.launch.processes import OutputLock

    check_output_dir(out_dir)
    why = OutputLock.problem(out_dir)  # a link, a FIFO...: never opened, never waited on
    if why:
        raise ConfigError(why)
    holder = OutputLock.holder(out_dir)
    if holder is not None:
        raise ConfigError(
            f"{what} {out_dir} is in use by {holder_kind} (PID {holder}); wait for it "
            "to end or choose another --out"
        )
