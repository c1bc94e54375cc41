"""Domains from the user's own files: an npz's ``domain_names`` name its ``d_train`` ids;
an ``hf_disk`` dataset's ``dataset.domain_column`` gives each image its domain, domains of
different image sizes resized to one ``dataset.image_size``; bad values refused in one
line naming the key and the file, exit 2."""

import numpy as np
import pytest
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.data.datasets import DatasetError, load_dataset


def _npz(path, **extra):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (12, 6, 6), dtype=np.uint8),
        "y_train": np.arange(12) % 2,
        "x_test": rng.integers(0, 256, (6, 6, 6), dtype=np.uint8),
        "y_test": np.arange(6) % 2,
        "d_train": (np.arange(12) // 2) % 3,
        "d_test": np.arange(6) % 3,
    }
    arrays.update(extra)
    np.savez(path, **arrays)
    return str(path)


def test_npz_domain_names_name_the_domains(tmp_path):
    p = _npz(tmp_path / "d.npz", domain_names=np.array(["mnist", "usps", "svhn"]))
    b = load_dataset("npz", path=p)
    assert b.domain_names == ["mnist", "usps", "svhn"]
    assert np.array_equal(b.train_domains, (np.arange(12) // 2) % 3)
    assert load_dataset("npz", path=_npz(tmp_path / "plain.npz")).domain_names == []


@pytest.mark.parametrize(
    "names, message",
    [
        (np.array(["a", "b"]), "2 names for domain ids up to 2"),
        (np.array(["a", "a", "b"]), "a name twice"),
        (np.array(["a", "", "b"]), "an empty"),
        (np.array([1, 2, 3]), "must be a 1-D array of strings"),
    ],
)
def test_npz_bad_domain_names_refused(tmp_path, names, message):
    p = _npz(tmp_path / "bad.npz", domain_names=names)
    with pytest.raises(DatasetError, match=message):
        load_dataset("npz", path=p)


def test_npz_domain_names_without_domain_ids_refused_in_one_line(tmp_path, capsys):
    p = tmp_path / "nod.npz"
    x = np.zeros((4, 4, 4), np.uint8)
    y = np.arange(4) % 2
    np.savez(p, x_train=x, y_train=y, x_test=x, y_test=y, domain_names=np.array(["a", "b"]))
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "npz",
                "dataset": {"name": "npz", "path": str(p), "cache_dir": str(tmp_path / "c")},
                "partition": {"scheme": "iid"},
                "federation": {"num_clients": 2, "clients_per_round": 2, "rounds": 1},
            }
        )
    )
    assert main(["partition", str(exp)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"fedrcl-flwr: error: {p}: domain_names without d_train (the domain id of each image)"
    )


def _save_two_sizes(path, domain_feature=None, test_domains=("digits", "mnist")):
    """Two domains as an MNIST + scikit-learn digits mix would be: 'mnist' images 12x12,
    'digits' images 4x4 (PIL ``Image`` feature), in one saved DatasetDict."""
    from PIL import Image

    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(1)
    out = {}
    for split, doms in (("train", ("mnist", "digits") * 4), ("test", test_domains)):
        imgs, labels = [], []
        for i, dom in enumerate(doms):
            side = 12 if dom == "mnist" else 4
            imgs.append(Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8)))
            labels.append((i // 2) % 2)
        feats = {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(num_classes=2),
            "source": domain_feature or datasets.Value("string"),
        }
        values = list(doms)
        if domain_feature is not None:
            values = [domain_feature.str2int(v) for v in doms]
        out[split] = datasets.Dataset.from_dict(
            {"image": imgs, "label": labels, "source": values},
            features=datasets.Features(feats),
        )
    datasets.DatasetDict(out).save_to_disk(str(path))
    return str(path)


def test_hf_disk_domain_column_of_strings_with_two_image_sizes(tmp_path):
    p = _save_two_sizes(tmp_path / "hf")
    with pytest.raises(DatasetError, match="set dataset.image_size"):
        load_dataset("hf_disk", path=p, domain_column="source")
    b = load_dataset("hf_disk", path=p, domain_column="source", image_size=8)
    assert b.domain_names == ["digits", "mnist"]  # sorted string values
    assert b.train_domains.tolist() == [1, 0] * 4
    assert b.test_domains.tolist() == [0, 1]
    assert tuple(b.train.images.shape) == (8, 1, 8, 8)
    # without the key the same folder is one domain, as before
    assert load_dataset("hf_disk", path=p, image_size=8).train_domains is None


def test_hf_disk_domain_column_classlabel_keeps_its_names(tmp_path):
    datasets = pytest.importorskip("datasets")
    feat = datasets.ClassLabel(names=["mnist", "digits", "usps"])
    p = _save_two_sizes(tmp_path / "hf", domain_feature=feat)
    b = load_dataset("hf_disk", path=p, domain_column="source", image_size=8)
    assert b.domain_names == ["mnist", "digits", "usps"]
    assert b.train_domains.tolist() == [0, 1] * 4


def test_hf_disk_domain_column_refusals(tmp_path):
    p = _save_two_sizes(tmp_path / "hf", test_domains=("svhn",))
    with pytest.raises(DatasetError, match=r"test domain\(s\) \['svhn'\] never occur"):
        load_dataset("hf_disk", path=p, domain_column="source", image_size=8)
    with pytest.raises(DatasetError, match="'dataset.domain_column' 'dom' is not a column"):
        load_dataset("hf_disk", path=p, domain_column="dom", image_size=8)
    with pytest.raises(DatasetError, match="is also the image or label column"):
        load_dataset("hf_disk", path=p, domain_column="label", label_column="label")
    with pytest.raises(DatasetError, match="cannot tell the label column"):  # not taken twice
        load_dataset("hf_disk", path=p, domain_column="label", image_size=8)


def test_domain_split_on_hf_disk_needs_the_domain_column(tmp_path, capsys):
    pytest.importorskip("datasets")  # without it, the missing package is said first
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "hf",
                "dataset": {"name": "hf_disk", "path": str(tmp_path / "hf")},
                "partition": {"scheme": "domain"},
                "federation": {"num_clients": 2, "clients_per_round": 2, "rounds": 1},
            }
        )
    )
    assert main(["partition", str(exp)]) == 2
    err = capsys.readouterr().err.strip()
    assert "'partition.scheme' domain on hf_disk needs 'dataset.domain_column'" in err
    assert str(exp) in err and "\n" not in err


def test_domain_split_by_hf_disk_domain_column_end_to_end(tmp_path, capsys):
    """``partition`` on an hf_disk domain column: one client per named domain."""
    p = _save_two_sizes(tmp_path / "hf")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "hf",
                "dataset": {
                    "name": "hf_disk",
                    "path": p,
                    "domain_column": "source",
                    "image_size": 8,
                    "cache_dir": str(tmp_path / "c"),
                },
                "partition": {"scheme": "domain"},
                "federation": {"num_clients": 2, "clients_per_round": 2, "rounds": 1},
            }
        )
    )
    assert main(["partition", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "digits" in out and "mnist" in out, out


def test_domain_column_on_another_dataset_refused(tmp_path, capsys):
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "npz",
                "dataset": {"name": "npz", "path": str(tmp_path / "d.npz"), "domain_column": "d"},
                "partition": {"scheme": "iid"},
                "federation": {"num_clients": 2, "clients_per_round": 2, "rounds": 1},
            }
        )
    )
    assert main(["partition", str(exp)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"fedrcl-flwr: error: {exp}: 'dataset.domain_column' names a column of an hf_disk "
        "dataset, not of 'npz' (npz: d_train / d_test and domain_names)"
    )
