"""The splits Flower users know: ``partition.scheme: pathological`` (k classes per client,
index-identical to Flower Datasets' ``PathologicalPartitioner`` fed our generator) and
``partition.scheme: flwr_datasets`` (any Flower Datasets partitioner, checked before a
run, identical to the partitioner run directly). Offline, in-process, on labels the tests
draw."""

import json
import os

import numpy as np
import pytest
import yaml
from helpers import TINY_SYNTHETIC, assert_run_refused, tiny_config

from fedrcl_flwr.cli import main
from fedrcl_flwr.data.partition import partition
from fedrcl_flwr.data.partition_schemes import pathological
from fedrcl_flwr.errors import ConfigError, PartitionError

pytest.importorskip("flwr_datasets")

from datasets import Dataset  # noqa: E402 - after the skip
from flwr_datasets.partitioner import (  # noqa: E402
    DirichletPartitioner,
    PathologicalPartitioner,
)


def _labels(n=600, classes=10, seed=3):
    return np.random.default_rng(seed).integers(0, classes, n)


def _flower_parts(partitioner, labels, num_clients):
    """Flower's partitions as index lists, read back through a column of its own
    (``row * 3 + 1``), not through the project's row column."""
    ds = Dataset.from_dict({"label": labels, "x": np.arange(len(labels)) * 3 + 1})
    partitioner.dataset = ds
    return [(np.asarray(partitioner.load_partition(i)["x"]) - 1) // 3 for i in range(num_clients)]


@pytest.mark.filterwarnings("ignore:Classes. .* will NOT be used")
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("seed,k", [(0, 2), (1, 3), (7, 1)])
def test_pathological_is_flowers_partitioner_fed_our_generator(seed, k, shuffle):
    labels = _labels()
    ours = partition(labels, 20, "pathological", classes_per_client=k, seed=seed)
    flower = PathologicalPartitioner(
        num_partitions=20, partition_by="label", num_classes_per_partition=k, shuffle=shuffle
    )
    flower._rng = np.random.default_rng([seed, 271828])  # the project's split generator
    theirs = _flower_parts(flower, labels, 20)
    for a, b in zip(ours, theirs):
        assert np.array_equal(a, np.sort(b))
    for p in ours:  # exactly k classes each, sorted, disjoint
        assert len(np.unique(labels[p])) == k and np.all(np.diff(p) > 0)
    allidx = np.concatenate(ours)
    assert len(allidx) == len(np.unique(allidx))


def test_pathological_seeding_and_refusals():
    labels = _labels()
    a = partition(labels, 20, "pathological", classes_per_client=2, seed=4)
    b = pathological(labels, 20, 2, np.random.default_rng([4, 271828]))
    c = partition(labels, 20, "pathological", classes_per_client=2, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    with pytest.raises(PartitionError, match=r"classes_per_client must be in 1\.\.10"):
        partition(labels, 20, "pathological", classes_per_client=11)
    few = np.repeat(np.arange(3), 2)  # 2 samples per class, 8 clients on 3 classes
    with pytest.raises(PartitionError, match="drawn by .* clients but has 2 samples"):
        partition(few, 6, "pathological", classes_per_client=3)
    with pytest.raises(PartitionError, match="no 'pathological' split"):
        partition(labels, 20, "pathological", generator="fedrcl")


def test_flwr_datasets_is_flowers_dirichlet_partitioner():
    labels = _labels(800)
    spec = {"name": "DirichletPartitioner", "alpha": 0.5, "min_partition_size": 5}
    ours = partition(labels, 10, "flwr_datasets", partitioner={**spec, "seed": 11}, seed=0)
    theirs = _flower_parts(
        DirichletPartitioner(10, "label", alpha=0.5, min_partition_size=5, seed=11), labels, 10
    )
    assert [p.tolist() for p in ours] == [p.tolist() for p in theirs]  # Flower's order too
    # no seed in the spec: the split's seed
    ours = partition(labels, 10, "flwr_datasets", partitioner=spec, seed=3)
    theirs = _flower_parts(
        DirichletPartitioner(10, "label", alpha=0.5, min_partition_size=5, seed=3), labels, 10
    )
    assert [p.tolist() for p in ours] == [p.tolist() for p in theirs]


def test_flwr_datasets_by_domain_and_offline_env(monkeypatch):
    monkeypatch.delenv("FLWR_TELEMETRY_ENABLED", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    seen = {}
    import fedrcl_flwr.data.sources.hf as hf

    real = hf.build

    def spy(*a, **kw):
        seen.update({k: os.environ.get(k) for k in ("FLWR_TELEMETRY_ENABLED", "HF_HUB_OFFLINE")})
        return real(*a, **kw)

    monkeypatch.setattr(hf, "build", spy)
    labels = _labels(90, 3)
    domains = np.repeat(np.arange(3), 30)
    parts = partition(
        labels,
        3,
        "flwr_datasets",
        partitioner={"name": "NaturalIdPartitioner", "partition_by": "domain"},
        domains=domains,
    )
    assert sorted(tuple(np.unique(domains[p])) for p in parts) == [(0,), (1,), (2,)]
    assert sorted(len(p) for p in parts) == [30, 30, 30]
    assert "FLWR_TELEMETRY_ENABLED" not in os.environ  # restored
    with pytest.raises(PartitionError, match="made 3 partitions but federation.num_clients is 4"):
        partition(
            labels,
            4,
            "flwr_datasets",
            domains=domains,
            partitioner={"name": "NaturalIdPartitioner", "partition_by": "domain"},
        )


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"name": "NoSuchPartitioner"}, "'partition.partitioner.name' 'NoSuchPartitioner' is not"),
        ({"name": "VerticalSizePartitioner"}, "is not one of"),
        (
            {"name": "DirichletPartitioner", "alpha": 0.3, "beta": 1},
            "'partition.partitioner.beta' is not an argument of DirichletPartitioner",
        ),
        ({"name": "DirichletPartitioner", "alpha": 0.3, "num_partitions": 4}, "set by the project"),
        ({"name": "DirichletPartitioner"}, "needs alpha"),
        ({"name": "DirichletPartitioner", "alpha": -1}, "(DirichletPartitioner):"),
        ({"name": "IidPartitioner", "partition_by": "x"}, "is not an argument of IidPartitioner"),
        (
            {"name": "ShardPartitioner", "partition_by": "x", "num_shards_per_partition": 2},
            "must be label or domain",
        ),
        ("DirichletPartitioner", "'partition.partitioner' must be dict or null"),
    ],
)
def test_flwr_datasets_spec_is_refused_before_a_run(tmp_path, capsys, spec, message):
    from fedrcl_flwr.config import to_dict

    exp = to_dict(tiny_config(tmp_path))
    exp["partition"].update(scheme="flwr_datasets", partitioner=spec)
    assert_run_refused(tmp_path, capsys, exp, "federation.rounds=1", message)


def test_config_checks_the_new_schemes(tmp_path):
    with pytest.raises(ConfigError, match="classes_per_client' \\(5\\) exceeds the 4 classes"):
        tiny_config(tmp_path, partition={"scheme": "pathological", "classes_per_client": 5})
    with pytest.raises(ConfigError, match="'partition.classes_per_client' must be >= 1"):
        tiny_config(tmp_path, partition={"scheme": "pathological", "classes_per_client": 0})
    with pytest.raises(ConfigError, match="'partition.partitioner' is required"):
        tiny_config(tmp_path, partition={"scheme": "flwr_datasets"})
    with pytest.raises(ConfigError, match="applies to partition.scheme flwr_datasets only"):
        tiny_config(tmp_path, partition={"partitioner": {"name": "IidPartitioner"}})


def test_spec_check_imports_no_data_module():
    """The check before a run reads flwr_datasets' signatures, never the project's data
    layer (torch): config/partitioners.py imports the standard library, the error type
    and (by name, at check time) flwr_datasets.partitioner only."""
    import ast
    from pathlib import Path

    import fedrcl_flwr.config.partitioners as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    ours = {m for m in imported if m.split(".")[0] in ("fedrcl_flwr", "torch", "datasets")}
    assert ours == {"fedrcl_flwr.errors"}, ours
    assert '"flwr_datasets.partitioner"' in Path(mod.__file__).read_text()


@pytest.mark.parametrize(
    "part",
    [
        {"scheme": "pathological", "classes_per_client": 2},
        {
            "scheme": "flwr_datasets",
            "partitioner": {"name": "ShardPartitioner", "num_shards_per_partition": 2},
        },
    ],
)
def test_partition_save_writes_the_new_schemes(tmp_path, capsys, part):
    exp = tmp_path / "exp.yaml"
    data = {
        "name": "p",
        "dataset": {"name": "synthetic", "synthetic": dict(TINY_SYNTHETIC)},
        "partition": part,
        "federation": {"num_clients": 8, "clients_per_round": 2, "rounds": 1},
    }
    exp.write_text(yaml.safe_dump(data))
    out = tmp_path / "split.json"
    assert main(["partition", str(exp), "--save", str(out)]) == 0, capsys.readouterr().err
    saved = json.loads(out.read_text())
    cfg = tiny_config(tmp_path)  # the same synthetic labels (seed 0)
    from fedrcl_flwr.run.runtime import load_bundle

    labels = load_bundle(cfg).train_labels
    expect = partition(
        labels,
        8,
        part["scheme"],
        seed=0,
        num_classes=4,
        classes_per_client=part.get("classes_per_client", 2),
        partitioner=part.get("partitioner"),
    )
    assert [saved[str(i)] for i in range(8)] == [p.tolist() for p in expect]
    if part["scheme"] == "pathological":
        assert all(len(np.unique(labels[p])) == 2 for p in expect)
    # read back as a split file: the same clients
    assert (
        main(
            [
                "partition",
                str(exp),
                "--set",
                "partition.scheme=file",
                "--set",
                f"partition.path={out}",
                "--set",
                "partition.partitioner=null",
            ]
        )
        == 0
    )


def test_a_run_gets_the_flwr_datasets_split(tiny):
    """The run's path (config -> runtime.client_partitions, cached beside the dataset):
    the clients' partitions are Flower's, read twice the same."""
    from fedrcl_flwr.run import runtime

    spec = {"name": "SizePartitioner", "partition_sizes": [50, 60, 70, 80, 100, 120, 150, 170]}
    cfg = tiny(partition={"scheme": "flwr_datasets", "partitioner": spec})
    parts = runtime.client_partitions(cfg)
    assert [len(p) for p in parts] == spec["partition_sizes"]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(800))
    runtime.WORKER.clear_datasets()
    again = runtime.client_partitions(cfg)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
