"""A client's round of local training, as :meth:`clients.base.FederatedClient.train_round`
runs it: the round's start (partition, data, seeds, the model with the received weights:
:func:`start_round`), the shared training loop on the round's batches
(:func:`train_on_round_data`) and the :class:`~fedrcl_flwr.protocol.FitReport` of what it
did (:func:`fit_report`). The
loop itself (optimiser, schedules, AMP) is :func:`fedrcl_flwr.training.train_local`, shared
by every method."""

from __future__ import annotations

import time

import numpy as np
import torch

from clients.client_data import round_partition_id
from fedrcl_flwr.accel import use_channels_last
from fedrcl_flwr.protocol import FitInstructions, FitReport
from fedrcl_flwr.run import runtime, timers
from fedrcl_flwr.training import TrainStats, batch_size_for, local_train_settings, train_local


def start_round(client, ins: FitInstructions, parameters) -> int:
    """The round's partition, data, RNG seeds and model (loaded with ``parameters``), then
    the method's :meth:`~clients.base.FederatedClient.on_round_start`; returns the
    client's seed for the round."""
    client.run_round = ins.run_round
    client.partition_id = round_partition_id(
        client.fixed_data, client.default_partition_id, ins.partition_id
    )
    timers.note(round=client.run_round, partition=client.partition_id)
    with timers.stage("data"):
        client.data = client.local_data(client.partition_id)
    seed = runtime.client_seed(client.cfg.seed, client.run_round, client.partition_id)
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    with timers.stage("load"):
        client.model = client._model()
        client._load_received(client.model, parameters)
    client.on_round_start(ins)
    return seed


def train_on_round_data(client, ins: FitInstructions, seed: int) -> TrainStats:
    """The shared training loop on the round's batches (``fedrcl_flwr.training``): the
    method's loss terms plus the server strategy's
    (:meth:`~clients.base.FederatedClient.strategy_terms`), with the method's hooks."""
    c = client.cfg.client
    model, data = client.round_model(), client.round_data()
    bs = batch_size_for(data.size, c.batch_size, c.iterations_per_epoch)
    batches = runtime.make_batches(
        data.dataset,
        data.indices,
        bs,
        seed,
        device=client.device,
        last_batch=client.last_batch(),
    )
    channels_last = use_channels_last(c.channels_last, client.device, model)
    if channels_last:  # the pooled model keeps it; set_weights preserves the layout
        model.to(memory_format=torch.channels_last)
    settings = local_train_settings(
        c, client.run_round, rounds=client.cfg.federation.rounds, channels_last=channels_last
    )
    terms = client.loss_terms() + client.strategy_terms(ins)
    with timers.stage("train"):
        return train_local(
            model,
            batches,
            terms,
            settings,
            client.device,
            transform=client.batch_transform(),
            forward=client.forward(),
            params=client.trainable_parameters(),
        )


def fit_report(client, stats: TrainStats, started: float) -> FitReport:
    """The round's report before :meth:`~clients.base.FederatedClient.on_round_end`: the
    losses and steps of ``stats``, the time since ``started`` (``time.time()``), the node
    and, every ``evaluation.local_representation_every`` rounds, the local model's
    representation metrics (:meth:`~clients.base.FederatedClient.local_representation`)."""
    report = FitReport(
        partition_id=client.partition_id,
        # a client that took no step (client.drop_last, fewer samples than a batch)
        # has no training loss
        train_loss=stats.loss if stats.steps else None,
        steps=stats.steps,
        fit_time_s=time.time() - started,
        node=runtime.node_name(),
        term_losses=dict(stats.terms) if stats.steps else {},
    )
    every = client.cfg.evaluation.local_representation_every
    if every and client.run_round % every == 0:
        report.local_repr = client.local_representation()
    return report
