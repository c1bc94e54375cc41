"""Flower Datasets partitioners that cannot split the data are refused in one line naming
the key, before any Flower process: never Flower's arithmetic error
(``division by zero``, ``integer modulo by zero``), never a page of Flower's warnings in
front of the refusal. ``DistributionPartitioner`` is usable from YAML: its
``distribution_array`` is a list of lists of numbers."""

import numpy as np
import pytest
from helpers import assert_run_refused, tiny_config

from fedrcl_flwr.cli import main

pytest.importorskip("flwr_datasets")


def _experiment(tmp_path, spec):
    from fedrcl_flwr.config import to_dict

    exp = to_dict(tiny_config(tmp_path))  # 8 clients, 800 training samples, 4 classes
    exp["partition"] = {"scheme": "flwr_datasets", "partitioner": spec}
    return exp


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"name": "GroupedNaturalIdPartitioner", "group_size": 0},
            "'partition.partitioner.group_size' must be an integer >= 1, got 0",
        ),
        (
            {"name": "ShardPartitioner", "num_shards_per_partition": 1000},
            "'partition.partitioner.num_shards_per_partition' 1000 × 8 clients = 8000 shards "
            "for 800 training samples: a shard would hold no sample (at most 100 per client)",
        ),
        (
            {"name": "DistributionPartitioner", "num_unique_labels_per_partition": 2,
             "preassigned_num_samples_per_label": 5, "distribution_array": [[1, 2], [3]]},
            "'partition.partitioner.distribution_array' must be a list of equally long lists",
        ),
    ],
)  # fmt: skip
def test_refused_in_our_words(tmp_path, capsys, spec, message):
    exp = _experiment(tmp_path, spec)
    assert_run_refused(tmp_path, capsys, exp, "federation.rounds=1", message)
    err = capsys.readouterr().err
    assert "division by zero" not in err and "modulo by zero" not in err


def test_a_refused_split_prints_no_flower_warnings(tmp_path, capsys, recwarn):
    """Flower's DirichletPartitioner warns once per failed attempt (22 lines before the
    refusal, with pyarrow's deprecation notice); only the refusal is printed: no warning
    leaves the split."""
    spec = {"name": "DirichletPartitioner", "alpha": 0.3, "min_partition_size": 500}
    exp = _experiment(tmp_path, spec)
    assert_run_refused(tmp_path, capsys, exp, "federation.rounds=1", "max number of attempts")
    shown = [f"{w.category.__name__}: {w.message}" for w in recwarn]
    assert not any("min_partition_size" in t or "SortOptions" in t for t in shown), shown


def test_a_split_that_works_keeps_flowers_notes(tmp_path, recwarn):
    """Flower's warnings about a split it made are still shown (a deprecation notice of
    the libraries underneath is not)."""
    from fedrcl_flwr.data.partition import partition

    labels = np.repeat(np.arange(4), 50)
    spec = {"name": "PathologicalPartitioner", "num_classes_per_partition": 1}
    partition(labels, 2, "flwr_datasets", partitioner=spec, seed=0)
    texts = [str(w.message) for w in recwarn]
    assert any("will NOT be used" in t for t in texts), texts
    assert not any(issubclass(w.category, FutureWarning) for w in recwarn)


def test_distribution_partitioner_from_yaml_is_flowers(tmp_path, capsys):
    """The YAML list of lists becomes Flower's array: the split is the partitioner's own,
    index for index, and the experiment runs the ``partition`` command."""
    import yaml
    from datasets import Dataset
    from flwr_datasets.partitioner import DistributionPartitioner

    from fedrcl_flwr.data.partition import partition

    labels = np.random.default_rng(0).integers(0, 4, 800)
    table = [[1.0, 2, 3, 4], [4, 3, 2, 1], [1, 1, 1, 1], [2, 5, 2, 5]]
    args = {"num_unique_labels_per_partition": 2, "preassigned_num_samples_per_label": 5}
    ours = partition(
        labels, 8, "flwr_datasets",
        partitioner={"name": "DistributionPartitioner", **args, "distribution_array": table},
        seed=7,
    )  # fmt: skip
    flower = DistributionPartitioner(
        distribution_array=np.asarray(table), num_partitions=8, partition_by="label", seed=7, **args
    )
    flower.dataset = Dataset.from_dict({"label": labels, "x": np.arange(800) * 3 + 1})
    for i, part in enumerate(ours):
        assert np.array_equal(part, (np.asarray(flower.load_partition(i)["x"]) - 1) // 3)
    assert sorted(np.concatenate(ours).tolist()) == list(range(800))
    spec = {"name": "DistributionPartitioner", **args, "distribution_array": table}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_experiment(tmp_path, spec)))
    assert main(["partition", str(path)]) == 0, capsys.readouterr().err
