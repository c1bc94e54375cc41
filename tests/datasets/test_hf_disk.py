"""``dataset.name: hf_disk``: a Hugging Face ``DatasetDict`` saved with ``save_to_disk``,
written here by the test (offline), read with its columns named or detected."""

import numpy as np
import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.data.datasets import DatasetError, load_dataset

datasets = pytest.importorskip("datasets")


def _images(n, seed, channels=3):
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 8, channels), dtype=np.uint8)


def _save_pil(path, n_train=40, n_test=12, classes=4):
    """Images as the Image feature (PNG inside the arrow files), labels a ClassLabel."""
    from PIL import Image

    feats = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=classes)}
    )
    out = {}
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        x = _images(n, seed)
        y = np.arange(n) % 4
        out[split] = (x, y)
        ds = datasets.Dataset.from_dict(
            {"img": [Image.fromarray(a) for a in x], "label": y.tolist()}, features=feats
        )
        out[split + "_ds"] = ds
    datasets.DatasetDict({"train": out["train_ds"], "test": out["test_ds"]}).save_to_disk(path)
    return out


def test_hf_disk_reads_detected_columns_pixel_exact(tmp_path):
    path = tmp_path / "hf"
    ref = _save_pil(str(path))
    b = load_dataset("hf_disk", path=str(path), augment=False, normalize=False)
    x = b.train.images.permute(0, 2, 3, 1).numpy()
    assert np.array_equal(x, ref["train"][0])
    assert np.array_equal(b.train_labels, ref["train"][1])
    assert np.array_equal(b.test_labels, ref["test"][1])
    assert (b.num_classes, b.in_channels, b.image_size) == (4, 3, 8)
    # the ClassLabel's class count, not the largest label + 1
    _save_pil(str(tmp_path / "hf6"), classes=6)
    assert load_dataset("hf_disk", path=str(tmp_path / "hf6")).num_classes == 6


def test_hf_disk_named_columns_of_arrays_and_refusals(tmp_path):
    path = tmp_path / "hf"
    x, xt = _images(20, 2, channels=1)[..., 0], _images(6, 3, channels=1)[..., 0]
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"pic": x.tolist(), "y": [i % 3 for i in range(20)]}
            ),
            "test": datasets.Dataset.from_dict(
                {"pic": xt.tolist(), "y": [i % 3 for i in range(6)]}
            ),
        }
    )
    dd.save_to_disk(str(path))
    b = load_dataset("hf_disk", path=str(path), image_column="pic", label_column="y")
    assert b.in_channels == 1 and b.num_classes == 3 and len(b.train_labels) == 20
    assert np.array_equal(b.train.images[:, 0].numpy(), x)
    with pytest.raises(
        DatasetError, match="cannot tell the image column .*set 'dataset.image_column'"
    ):
        load_dataset("hf_disk", path=str(path))
    with pytest.raises(Exception, match="'dataset.label_column' 'lbl' is not a column"):
        load_dataset("hf_disk", path=str(path), image_column="pic", label_column="lbl")
    datasets.DatasetDict({"train": dd["train"]}).save_to_disk(str(tmp_path / "one"))
    with pytest.raises(DatasetError, match="need a DatasetDict with splits train and test"):
        load_dataset("hf_disk", path=str(tmp_path / "one"), image_column="pic", label_column="y")
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset("hf_disk", path=str(tmp_path / "none"))


def test_hf_disk_through_the_cli_with_a_pathological_split(tmp_path, capsys):
    """The experiment file's route: config check, dataset cache, split, ``--save``."""
    path = tmp_path / "hf"
    _save_pil(str(path))
    exp = tmp_path / "exp.yaml"
    data = {
        "name": "hf",
        "dataset": {"name": "hf_disk", "path": str(path)},
        "partition": {"scheme": "pathological", "classes_per_client": 1},
        "federation": {"num_clients": 4, "clients_per_round": 2, "rounds": 1},
    }
    exp.write_text(yaml.safe_dump(data))
    out = tmp_path / "split.json"
    assert main(["partition", str(exp), "--save", str(out)]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "classes per client mean 1.00" in text, text
    import json

    labels = np.arange(40) % 4  # the training labels _save_pil wrote
    saved = json.loads(out.read_text())
    assert sorted(saved) == ["0", "1", "2", "3"]
    assert all(len(set(labels[saved[c]].tolist())) == 1 for c in saved)
    # no path: one line, exit 2
    exp.write_text(yaml.safe_dump({**data, "dataset": {"name": "hf_disk"}}))
    assert main(["partition", str(exp)]) == 2
    err = capsys.readouterr().err.strip()
    assert "'dataset.path' is required when dataset.name is hf_disk" in err and "\n" not in err


def test_hf_disk_without_datasets_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    from helpers import tiny_config

    from fedrcl_flwr.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"hf_disk needs Hugging Face datasets .*\[flwr-datasets\]"
    ):
        tiny_config(tmp_path, dataset={"name": "hf_disk", "path": str(tmp_path)})
