"""Every registry is walked, so that a forgotten registration fails here
(CONTRIBUTING.md): each client file's method and each strategy file's server rule is
registered under its own name and documented; each dataset of the catalog has its entry
in the data layer's table (a reader, its augmentation, torchvision's files where it is
torchvision's, its cache key), reaches its reader and is documented; each partition scheme
has a builder; each model builds, follows
the model interface and is documented. Walked from the code (the files, the registries),
never from a list written here. In-process, about two seconds (importing the clients
imports Flower)."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import write_saved_dataset_dict

from clients import CLIENTS
from fedrcl_flwr.augment import AugmentSpec
from fedrcl_flwr.config.catalog import DATASET_NAMES, DATASETS, SCHEME_NAMES
from fedrcl_flwr.config.schema import DatasetConfig
from fedrcl_flwr.data.cache.keys import entry_key
from fedrcl_flwr.data.cache.layout import KEY_LEN
from fedrcl_flwr.data.datasets import DatasetError, default_augment
from fedrcl_flwr.data.partition import SCHEMES, partition
from fedrcl_flwr.data.sources.table import SOURCES, DataSource, read_source
from fedrcl_flwr.data.sources.torchvision_files import LAYOUTS, torchvision_files
from fedrcl_flwr.errors import ConfigError, PartitionError
from fedrcl_flwr.models import MODELS, build_model
from fedrcl_flwr.models.interface import FeatureModel
from strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _classes_defined_in(package: str, base_name: str, attr: str) -> dict[str, str]:
    """``{attr value: "module:Class"}`` of the classes each ``package/*.py`` file defines
    that subclass ``package.base.<base_name>`` and set ``attr`` themselves."""
    base = getattr(importlib.import_module(f"{package}.base"), base_name)
    found = {}
    for path in sorted((ROOT / package).glob("*.py")):
        try:  # a class reads its declared parameters from the registry when it is defined
            module = importlib.import_module(f"{package}.{path.stem}")
        except ConfigError as exc:
            pytest.fail(f"{package}/{path.name} is not registered in {package}/__init__.py ({exc})")
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and cls.__module__ == module.__name__
                and issubclass(cls, base)
                and cls is not base
                and attr in vars(cls)
            ):
                found[getattr(cls, attr)] = f"{module.__name__}:{cls.__name__}"
    return found


def _test_doubles() -> set[str]:
    from helpers import TEST_DOUBLES

    return set(TEST_DOUBLES["client.method"])


def test_every_client_file_is_registered_under_its_method():
    files = _classes_defined_in("clients", "FederatedClient", "method")
    files.pop("base", None)  # FederatedClient's own placeholder name
    wrong = {
        m: t
        for m, t in files.items()
        if m not in _test_doubles() and (m not in CLIENTS.builtin or CLIENTS.target(m) != t)
    }
    assert not wrong, f"client classes not registered in clients/__init__.py as: {wrong}"
    assert set(CLIENTS.builtin) <= set(files), set(CLIENTS.builtin) - set(files)


def test_every_strategy_file_is_registered_under_its_name():
    files = _classes_defined_in("strategies", "FederatedStrategy", "name")
    wrong = {
        n: t for n, t in files.items() if n not in STRATEGIES.builtin or STRATEGIES.target(n) != t
    }
    assert not wrong, f"strategy classes not registered in strategies/__init__.py as: {wrong}"
    assert set(STRATEGIES.builtin) <= set(files), set(STRATEGIES.builtin) - set(files)


def test_every_method_and_strategy_is_documented():
    """In the overview table of ``docs/configuration.md`` (its parameter tables are
    checked against the classes' declarations by ``tests/project/test_docs.py``); the
    README names the papers' methods and points there, it keeps no list to update."""
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    overview = text[text.index("## Methods and server optimizers") : text.index("## Every key")]
    missing = [
        f"{r.key} {n}"
        for r in (CLIENTS, STRATEGIES)
        for n in sorted(r.builtin)
        if f"`{n}`" not in overview
    ]
    assert not missing, missing


def test_every_dataset_of_the_catalog_is_in_the_data_layer_table(tmp_path):
    """The two tables a dataset is declared in, the catalog's DATASETS (config) and the
    data layer's SOURCES, name the same datasets in the same order; each entry states its
    augmentation (``None``, scaled to the image size, only for 3-channel images that are
    not torchvision's), has torchvision's files exactly where the catalog names a
    torchvision class, and gives a cache key (its fingerprint and its own key fields)."""
    import torchvision.datasets as tvd

    assert list(SOURCES) == list(DATASETS)
    for name, info in DATASETS.items():
        source = SOURCES[name]
        assert isinstance(source, DataSource), name
        assert isinstance(source.augment, AugmentSpec) or (
            source.augment is None and info.channels == 3 and info.torchvision is None
        ), name
        assert isinstance(default_augment(name, 32), AugmentSpec), name
        assert (source.torchvision is None) == (info.torchvision is None), name
        assert source.torchvision is LAYOUTS.get(name), name  # the layouts' one table
        if info.torchvision is not None:
            assert hasattr(tvd, info.torchvision), name
            folder, files = torchvision_files(name, tmp_path)
            assert folder.is_relative_to(tmp_path) and files, name
            assert all(isinstance(f, str) and f for f, _ in files), name
        path = tmp_path / "x.npz"
        if name == "hf_disk":  # checked to be a saved DatasetDict before it is fingerprinted
            path = tmp_path / "saved"
            write_saved_dataset_dict(path)
        d = DatasetConfig(name=name, root=str(tmp_path), path=str(path))
        assert len(entry_key(d, 0)) == KEY_LEN, name


def test_every_dataset_of_the_catalog_has_a_reader(tmp_path):
    """Each name reaches its own reader: a missing file is that reader's DatasetError
    naming where it looked, never "unknown dataset"; the synthetic one is generated."""
    for name in DATASET_NAMES:
        try:
            tr, te, _, _ = read_source(
                name,
                str(tmp_path / "none"),
                path=str(tmp_path / "none.npz"),
                download=False,
                image_size=8,
                synthetic={"num_train": 40, "num_test": 20, "image_size": 8},
                seed=0,
                domains=[],
                test_fraction=0.2,
                verify_md5=True,
            )
        except DatasetError as exc:
            assert "unknown dataset" not in str(exc), f"{name}: {exc}"
        else:
            assert len(tr.y) and len(te.y), name


def test_every_dataset_is_documented():
    text = (DOCS / "datasets.md").read_text(encoding="utf-8")
    config = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = [n for n in DATASET_NAMES if f"`{n}`" not in text or n not in config]
    assert not missing, missing


def test_every_partition_scheme_has_a_builder(tmp_path):
    """Each scheme of the catalog reaches its own function: on 40 labelled samples every
    scheme gives 4 disjoint clients covering what it assigns ("file" reads a saved split)."""
    labels = np.repeat(np.arange(4), 10)
    domains = np.tile(np.arange(2), 20)
    split = tmp_path / "split.json"
    split.write_text('{"0": [0, 1], "1": [2, 3], "2": [4, 5], "3": [6, 7]}')
    assert list(SCHEMES) == list(SCHEME_NAMES)  # the data layer's table, the catalog's order
    for scheme in SCHEME_NAMES:
        try:
            parts = partition(
                labels,
                4,
                scheme,
                alpha=1.0,
                min_size=1,
                domains=domains,
                path=str(split),
                seed=0,
                num_classes=4,
                partitioner={"name": "IidPartitioner"},  # flwr_datasets (extra in [test])
            )
        except PartitionError as exc:  # pragma: no cover - the failure message
            pytest.fail(f"partition.scheme {scheme}: {exc}")
        flat = np.concatenate(parts)
        assert len(parts) == 4 and len(flat) == len(set(flat.tolist())) > 0, scheme
    text = (DOCS / "datasets.md").read_text(encoding="utf-8")
    assert all(f"`{s}`" in text for s in SCHEME_NAMES), SCHEME_NAMES


# what a model needs to build without downloads (test_backbone.py covers its backbones)
_MODEL_PARAMS = {"backbone_mlp": {"backbone": "resnet18"}}
# models whose unpadded convolutions need more than the 16 px used for the others
_MODEL_SIZES = {"feduv_simplecnn": 32}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_builds_follows_the_interface_and_is_documented(name):
    model = build_model(
        name,
        num_classes=3,
        in_channels=3,
        image_size=_MODEL_SIZES.get(name, 16),
        params=_MODEL_PARAMS.get(name),
    )
    assert isinstance(model, FeatureModel)
    assert re.search(rf"\b{name}\b", (DOCS / "configuration.md").read_text(encoding="utf-8"))


def test_the_messages_asking_for_domains_name_every_domain_dataset(tmp_path):
    """The config check, the split and Flower Datasets' ``partition_by: domain`` each
    refuse a dataset without domains naming the ones that have them, from the catalog
    (a new domain dataset reaches all three messages by its ``DatasetInfo``)."""
    from helpers import tiny_config

    want = [f"{n} with {d.domains_from}" if d.domains_from else n for n, d in DATASETS.items()]
    want = [w for w, d in zip(want, DATASETS.values()) if d.domains]
    assert len(want) >= 4
    with pytest.raises(ConfigError) as err:
        tiny_config(tmp_path, dataset={"name": "cifar10"}, partition={"scheme": "domain"})
    messages = [str(err.value)]
    with pytest.raises(PartitionError) as err2:
        partition(np.zeros(40, np.int64), 4, "domain", domains=None)
    messages.append(str(err2.value))
    from fedrcl_flwr.data.sources.hf import flwr_datasets_split

    with pytest.raises(PartitionError) as err3:
        spec = {"name": "NaturalIdPartitioner", "partition_by": "domain"}
        flwr_datasets_split(spec, np.zeros(40, np.int64), 4, 0, domains=None)
    messages.append(str(err3.value))
    for message in messages:
        assert all(w in message for w in want), (message, want)
