"""Flower ClientApp: builds the configured method's client for each message.

Data: a node-config ``data-path`` (an ``.npz`` file with x_train/y_train/x_test/y_test
or an image-folder tree) makes the client train on that local data (real devices);
otherwise it trains on the partition the server assigns (simulation), falling back to
the node-config ``partition-id``.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.client import ClientApp
from flwr.common import Context

from clients import client_class
from clients.client_data import LocalData
from fedrcl_flwr.app.common import (
    config_from_run_config,
    output_dir_from_run_config,
    quiet,
)
from fedrcl_flwr.protocol import tag_partition
from fedrcl_flwr.run import runtime, timers
from fedrcl_flwr.run.run_files import CLIENT_STATE_DIR


def _device_data(path: str, cfg) -> LocalData:
    """The node's own training data, loaded once per process (``runtime.WORKER``)."""
    return runtime.WORKER.get("device_data", path, lambda: _load_device_data(path, cfg))


def _load_device_data(path: str, cfg) -> LocalData:
    from fedrcl_flwr.data.datasets import load_dataset

    name = "npz" if path.endswith(".npz") else "imagefolder"
    d = cfg.dataset
    bundle = load_dataset(
        name,
        root=path,
        path=path,
        download=False,
        augment=d.augment,
        normalize=d.normalize,
        image_size=d.image_size,
        seed=cfg.seed,
        rotation=d.rotation,
        crop_pad=d.crop_pad,
        flip=d.flip,
        pad_fill=d.pad_fill,
    )
    return LocalData(
        bundle.train, np.arange(len(bundle.train_labels)), bundle.train_labels, bundle.num_classes
    )


def _name_ray_node() -> None:
    """On a Ray cluster of several nodes, clients report ``host:<Ray node id>`` (two nodes
    on one host differ only in that); elsewhere the host name (``runtime.node_name``)."""
    import sys

    if "ray" not in sys.modules:
        return
    try:
        import socket

        import ray

        if ray.is_initialized() and len(ray.nodes()) > 1:
            node = ray.get_runtime_context().get_node_id()
            runtime.set_node_name(f"{socket.gethostname()}:{node[:8]}")
    except Exception:  # noqa: BLE001 - the host name is a fine fallback
        pass


def client_fn(context: Context):
    with timers.stage("construct"):
        return _build_client(context)


def _build_client(context: Context):
    quiet()
    if runtime.WORKER.node is None:
        _name_ray_node()
    cfg = config_from_run_config(context.run_config)
    torch.set_num_threads(max(1, int(cfg.simulation.num_cpus)))
    node = context.node_config
    local = None
    if node.get("data-path"):
        local = _device_data(str(node["data-path"]), cfg)
    pid = node.get("partition-id")
    if node.get("state-dir"):
        state_dir = str(node["state-dir"])
    else:
        state_dir = str(output_dir_from_run_config(context.run_config, cfg) / CLIENT_STATE_DIR)
    cls = client_class(cfg.client.method)
    return cls(
        cfg,
        local_data=local,
        partition_id=int(pid) if pid is not None else None,
        state_dir=state_dir,
    ).to_client()


def timed(message, context, call_next):
    """ClientApp mod (the outermost): the message's timer record when ``FEDRCL_TIMERS``
    is set (:mod:`fedrcl_flwr.run.timers`); otherwise the message goes straight on."""
    if not timers.enabled():
        return call_next(message, context)
    timers.begin(created_at=message.metadata.created_at, node=context.node_id)
    try:
        return call_next(message, context)
    finally:
        timers.end()


def name_errors(message, context, call_next):
    """ClientApp mod: an exception leaves the ClientApp as ``RuntimeError("Type: message")``
    (one line), because Flower's simulation keeps only ``str(exception)`` and drops the
    type; the server shows the first such line when every client failed. An exception
    of a client's round (``clients/base.py`` sets its ``partition_id``) names the
    partition in front (:func:`fedrcl_flwr.protocol.tag_partition`): the server counts
    each client's failures."""
    try:
        return call_next(message, context)
    except Exception as exc:  # noqa: BLE001 - re-raised with its type in the message
        one = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        pid = getattr(exc, "partition_id", None)
        if isinstance(pid, int) and pid >= 0:
            one = tag_partition(pid, one)
        raise RuntimeError(one) from exc


def privacy_mods(message, context, call_next):
    """ClientApp mod: the run's ``privacy`` section picks Flower's own mods for this
    message. ``privacy.dp.mode: client``: ``fixedclipping_mod`` clips the update to the
    norm the server's ``DifferentialPrivacyClientSideFixedClipping`` sends;
    ``privacy.secagg``: ``secaggplus_mod`` runs the SecAgg+ stages and masks the (clipped)
    model, in that order (clipping is the innermost, as Flower requires). Otherwise the
    message goes straight on."""
    from functools import partial

    cfg = config_from_run_config(context.run_config)
    chain = call_next
    dp = cfg.privacy.dp
    if dp is not None and dp.mode == "client":
        from flwr.client.mod import fixedclipping_mod

        chain = partial(_through, fixedclipping_mod, call_next)
    if cfg.privacy.secagg:
        from flwr.client.mod import secaggplus_mod

        return secaggplus_mod(message, context, chain)
    return chain(message, context)


def _through(mod, call_next, message, context):
    return mod(message, context, call_next)


app = ClientApp(client_fn=client_fn, mods=[timed, name_errors, privacy_mods])
