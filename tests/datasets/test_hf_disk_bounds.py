"""``dataset.name: hf_disk`` refuses what it cannot train on up front, in one line naming
``dataset.path`` and what is wrong: an empty split, labels or a ``ClassLabel`` beyond
the class bound, a path that cannot be looked up, a folder that is not a saved
``DatasetDict`` (refused before the dataset cache fingerprints anything under it); images
of several sizes are resized by ``dataset.image_size``, as the advice says."""

import json

import numpy as np
import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.data.datasets import DatasetError, load_dataset

datasets = pytest.importorskip("datasets")


def _arrays_dict(path, n_train=8, n_test=4, label=None):
    """A DatasetDict of 8x8 RGB pixel arrays and ClassLabel(4) labels (``label`` replaces
    the last training label: a plain integer column then)."""
    rng = np.random.default_rng(0)
    y = [i % 4 for i in range(n_train)]
    cl = datasets.ClassLabel(num_classes=4) if label is None else datasets.Value("int64")
    if label is not None:
        y[-1] = label
    feats = datasets.Features({"img": datasets.Array3D((8, 8, 3), "uint8"), "label": cl})
    splits = {}
    for split, n, labels in (
        ("train", n_train, y),
        ("test", n_test, [i % 4 for i in range(n_test)]),
    ):
        x = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
        splits[split] = datasets.Dataset.from_dict({"img": x, "label": labels}, features=feats)
    datasets.DatasetDict(splits).save_to_disk(str(path))
    return path


def _partition_refused(tmp_path, capsys, dataset: dict) -> str:
    """``fedrcl-flwr partition`` of a tiny experiment on ``dataset``: exit 2, one line."""
    exp = tmp_path / "exp.yaml"
    data = {
        "name": "hf",
        "dataset": {"cache_dir": str(tmp_path / "cache"), **dataset},
        "partition": {"scheme": "iid"},
        "federation": {"num_clients": 2, "clients_per_round": 2, "rounds": 1},
    }
    exp.write_text(yaml.safe_dump(data))
    capsys.readouterr()  # the progress bars of save_to_disk
    assert main(["partition", str(exp)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("fedrcl-flwr: error: "), err
    return err


def test_an_empty_split_is_refused_as_empty(tmp_path, capsys):
    """Before: "not a dataset saved with save_to_disk (list index out of range)"."""
    path = tmp_path / "hf"
    feats = datasets.Features(
        {"img": datasets.Array3D((8, 8, 3), "uint8"), "label": datasets.ClassLabel(num_classes=4)}
    )
    x = np.zeros((6, 8, 8, 3), np.uint8)
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"img": x, "label": [0, 1, 2, 3, 0, 1]}, features=feats
            ),
            "test": datasets.Dataset.from_dict({"img": x[:0], "label": []}, features=feats),
        }
    ).save_to_disk(str(path))
    err = _partition_refused(tmp_path, capsys, {"name": "hf_disk", "path": str(path)})
    assert "split 'test' is empty" in err and "dataset.path" in err, err
    assert "save_to_disk (" not in err


def test_labels_beyond_the_class_bound_are_refused(tmp_path):
    """A label of 10**9 made a classifier of 10**9 outputs (MemoryError after a minute)."""
    path = _arrays_dict(tmp_path / "hf", label=10**6)
    with pytest.raises(DatasetError, match=r"column label: label 1000000 .*at most 100,000"):
        load_dataset("hf_disk", path=str(path))
    from fedrcl_flwr.data.sources.raw import MAX_CLASSES, int_labels

    assert MAX_CLASSES == 100_000
    with pytest.raises(DatasetError, match=r"label 1000000000 \(labels are class numbers"):
        int_labels(np.array([0, 3, 10**9]), "y")
    with pytest.raises(DatasetError, match="label 100000 "):
        int_labels(np.array([100_000.0]), "y")
    assert int_labels(np.array([99_999]), "y").tolist() == [99_999]


def test_a_classlabel_beyond_the_bound_is_refused_before_loading(tmp_path, monkeypatch):
    """``ClassLabel(num_classes=10**6)``: its names make a 20 MB ``dataset_info.json``
    that ``load_from_disk`` takes half a minute to read; refused from that file first."""
    path = _arrays_dict(tmp_path / "hf")
    for split in ("train", "test"):
        info_file = path / split / "dataset_info.json"
        info = json.loads(info_file.read_text())
        info["features"]["label"]["names"] = [str(i) for i in range(100_001)]
        info_file.write_text(json.dumps(info))
    monkeypatch.setattr(
        datasets, "load_from_disk", lambda *a, **k: pytest.fail("loaded before the check")
    )
    with pytest.raises(DatasetError, match=r"ClassLabel of column 'label' has 100,001 classes"):
        load_dataset("hf_disk", path=str(path))


def test_a_path_too_long_is_named_not_the_cache(tmp_path, capsys):
    long = str(tmp_path / ("x" * 4000))
    err = _partition_refused(tmp_path, capsys, {"name": "hf_disk", "path": long})
    assert "dataset.path" in err and "file name too long" in err, err
    assert "dataset.cache_dir" not in err and "cache" not in err.split("dataset.path")[0]
    assert len(err) < 400  # the path is cut, with its length
    assert "4,0" in err and "characters)" in err


def test_a_folder_that_is_no_dataset_is_refused_without_walking_it(tmp_path, capsys, monkeypatch):
    """``dataset.path: /`` fingerprinted the whole file system (101 s, ~1 GB) before it was
    refused; now the folder is refused before the dataset cache walks anything."""
    import os

    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f.txt").write_text("x")

    def no_walk(*a, **k):
        raise AssertionError("walked the folder")

    monkeypatch.setattr(os, "walk", no_walk)
    err = _partition_refused(tmp_path, capsys, {"name": "hf_disk", "path": str(tree)})
    assert "not a DatasetDict saved with save_to_disk (no dataset_dict.json" in err, err


def test_images_of_several_sizes_follow_dataset_image_size(tmp_path):
    """The advice "set dataset.image_size" now works: each image is resized to it as it
    is read (PIL bilinear, as an image folder's); without it the refusal says so."""
    from PIL import Image

    rng = np.random.default_rng(1)
    small = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(3)]
    big = [rng.integers(0, 256, (12, 12, 3), dtype=np.uint8) for _ in range(3)]
    feats = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=2)}
    )

    def split(arrays):
        return datasets.Dataset.from_dict(
            {
                "img": [Image.fromarray(a) for a in arrays],
                "label": [i % 2 for i in range(len(arrays))],
            },
            features=feats,
        )

    path = tmp_path / "hf"
    datasets.DatasetDict({"train": split(small + big), "test": split(small[:2])}).save_to_disk(
        str(path)
    )
    with pytest.raises(DatasetError, match="set dataset.image_size to resize each to one size"):
        load_dataset("hf_disk", path=str(path))
    b = load_dataset("hf_disk", path=str(path), image_size=8, augment=False, normalize=False)
    x = b.train.images.permute(0, 2, 3, 1).numpy()
    assert x.shape == (6, 8, 8, 3)
    assert np.array_equal(x[:3], np.stack(small))  # already 8x8: as stored
    expected = [
        np.asarray(Image.fromarray(a).resize((8, 8), Image.Resampling.BILINEAR)) for a in big
    ]
    assert np.array_equal(x[3:], np.stack(expected))
