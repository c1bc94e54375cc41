"""What a client measures besides training: per-client evaluation (``evaluation.per_client``,
``fedrcl_flwr/client_eval.py``: the global model, optionally fine-tuned, on each named
partition's local test data; :func:`evaluate_client`) and the representation metrics of
its local model after training (:func:`local_representation`; FedRCL Figs. 2-3 measure
local models)."""

from __future__ import annotations

import torch

from fedrcl_flwr import client_eval
from fedrcl_flwr.protocol import EvaluateInstructions, EvaluateReport
from fedrcl_flwr.run import runtime


def evaluate_client(client, parameters, config) -> tuple[float, int, dict]:
    """:meth:`clients.base.FederatedClient.evaluate`: the mean loss, the number of test
    samples and ``client_eval`` (JSON: partition id -> [correct, samples, loss sum]) of
    every partition the message names (a real device: its own data)."""
    ins = EvaluateInstructions.from_config(config)
    bundle = runtime.load_bundle(client.cfg) if client.fixed_data is None else None
    model = client._model()
    report = EvaluateReport(
        {
            client.data_id(pid): _evaluate_partition(
                client, model, bundle, parameters, pid, ins.run_round
            )
            for pid in _evaluated_partitions(client, ins)
        }
    )
    return float(report.mean_loss), int(report.num_samples), report.to_metrics()


def _evaluated_partitions(client, ins: EvaluateInstructions) -> list[int]:
    """A real device: its own data; simulation: the partitions the server named."""
    if client.fixed_data is not None:
        return [client.data_id(0)]
    if ins.partition_ids is not None:
        return list(ins.partition_ids)
    pid = ins.partition_id if ins.partition_id is not None else client.default_partition_id
    return [int(pid) if pid is not None else -1]


def _evaluate_partition(
    client, model: torch.nn.Module, bundle, parameters, pid: int, run_round: int
) -> tuple[int, int, float]:
    """``(correct, samples, loss sum)`` of the global model ``parameters`` (fine-tuned
    first when ``finetune_steps``) on partition ``pid``'s local test data."""
    from fedrcl_flwr.evaluation import evaluate_model

    cfg = client.cfg
    steps = cfg.evaluation.per_client.finetune_steps
    whole = client.partition_data(pid)
    dataset, test_idx = client_eval.local_test(
        cfg, client.data_id(pid), whole.indices, whole.dataset, bundle
    )
    runtime.set_weights(model, parameters)
    if steps:
        train = client.local_data(pid)
        client_eval.finetune(
            model,
            train.dataset,
            train.indices,
            cfg,
            run_round,
            client.data_id(pid),
            steps,
            client.device,
        )
    res = evaluate_model(
        model, dataset, client.device, indices=test_idx, batch_size=cfg.evaluation.batch_size
    )
    return (
        int(round(res.accuracy * res.num_samples)),
        res.num_samples,
        res.loss * res.num_samples,
    )


def local_representation(client) -> dict:
    """:meth:`clients.base.FederatedClient.local_representation`: on the test set in
    simulation, on the client's own (un-augmented) data for a client with fixed local
    data; the ``repr_`` prefix dropped."""
    from torch.utils.data import Subset

    from fedrcl_flwr.representation import representation_record

    if client.fixed_data is None:
        data = runtime.load_bundle(client.cfg).test
    else:
        local = client.round_data()
        plain = local.dataset.plain() if hasattr(local.dataset, "plain") else local.dataset
        data = Subset(plain, local.indices.tolist())
    rec = representation_record(client.round_model(), data, client.device)
    return {k[len("repr_") :]: v for k, v in rec.items()}
