"""FedCCL's inter-domain partitions (Sec. 3.1 / 5.1): balanced = equal sizes and equal label
mixes across domain-clients; imbalanced = Dirichlet(α) label skew inside each domain with
sizes following. Invariants on hand-built labels/domains, on every dataset kind with
domains, on the paper YAMLs, and the partition report showing domains."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from fedrcl_flwr.config import config_from_dict, load_config, read_yaml
from fedrcl_flwr.data.partition import partition
from fedrcl_flwr.data.report import (
    class_counts,
    client_domains,
    format_counts_table,
    plot_counts_heatmap,
)
from fedrcl_flwr.errors import PartitionError

ROOT = Path(__file__).resolve().parents[2]
K = 10


def _uneven(seed=0, sizes=(300, 900, 600, 450, 1200), k=K):
    """Domains of different sizes and label mixes (like Digit-5), shuffled."""
    rng = np.random.default_rng(seed)
    labels, domains = [], []
    for d, n in enumerate(sizes):
        p = rng.dirichlet(np.full(k, 5.0))
        labels.append(rng.choice(k, size=n, p=p))
        domains.append(np.full(n, d))
    labels, domains = np.concatenate(labels), np.concatenate(domains)
    order = rng.permutation(len(labels))
    return labels[order], domains[order]


def _disjoint(parts):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


def _entropy(parts, labels):
    c = class_counts(parts, labels, K).astype(float)
    p = c / c.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(-np.where(p > 0, p * np.log(p), 0.0).sum(1).mean())


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# --------------------------------------------------------------------------------------
# Balanced
# --------------------------------------------------------------------------------------


def test_balanced_equal_sizes_and_label_mixes_largest_common_size():
    labels, domains = _uneven()
    parts = partition(labels, 5, "domain", domains=domains, balanced=True, seed=0)
    _disjoint(parts)
    # independent closed form: c = min over (domain, class) of n[d, k] (one client each)
    n = np.array([[np.sum((domains == d) & (labels == k)) for k in range(K)] for d in range(5)])
    c = int(n.min())
    assert c >= 1
    counts = class_counts(parts, labels, K)
    assert np.array_equal(counts, np.full((5, K), c))
    for i, p in enumerate(parts):
        assert set(np.unique(domains[p]).tolist()) == {i}


def test_balanced_several_clients_per_domain_and_samples_per_class():
    labels, domains = _uneven()
    n = np.array([[np.sum((domains == d) & (labels == k)) for k in range(K)] for d in range(5)])
    parts = partition(labels, 10, "domain", domains=domains, balanced=True, seed=1)
    _disjoint(parts)
    counts = class_counts(parts, labels, K)
    assert np.array_equal(counts, np.full((10, K), int((n // 2).min())))
    assert [set(np.unique(domains[p]).tolist()) for p in parts] == [{i % 5} for i in range(10)]
    # a size you set
    parts = partition(
        labels, 5, "domain", domains=domains, balanced=True, samples_per_class=3, seed=0
    )
    assert np.array_equal(class_counts(parts, labels, K), np.full((5, K), 3))
    # two domains per client: the same per-class count from each owned domain
    parts = partition(
        labels, 5, "domain", domains=domains, balanced=True, domains_per_client=2, seed=0
    )
    _disjoint(parts)
    counts = class_counts(parts, labels, K)
    assert (counts == counts[0]).all() and counts[0, 0] % 2 == 0


def test_balanced_too_large_samples_per_class_names_the_limit():
    labels, domains = _uneven()
    n = np.array([[np.sum((domains == d) & (labels == k)) for k in range(K)] for d in range(5)])
    d, k = np.unravel_index(np.argmin(n), n.shape)
    with pytest.raises(
        PartitionError,
        match=rf"samples_per_class=10000 but domain {d} has "
        rf"only {n[d, k]} samples of class {k}",
    ):
        partition(
            labels, 5, "domain", domains=domains, balanced=True, samples_per_class=10000, seed=0
        )


def test_balanced_class_missing_from_a_domain_is_dropped_for_everyone():
    labels, domains = _uneven()
    labels = labels.copy()
    labels[(domains == 2) & (labels == 7)] = 3  # class 7 absent from domain 2
    with pytest.warns(UserWarning, match=r"class\(es\) \[7\]"):
        parts = partition(labels, 5, "domain", domains=domains, balanced=True, seed=0)
    counts = class_counts(parts, labels, K)
    assert (counts[:, 7] == 0).all()
    assert (counts == counts[0]).all() and counts[0, 0] > 0


# --------------------------------------------------------------------------------------
# Imbalanced
# --------------------------------------------------------------------------------------


def test_imbalanced_sizes_and_label_mixes_differ_and_favourite_class_is_whole():
    labels, domains = _uneven(sizes=(1000,) * 5)  # equal domains: any size gap is the draw
    parts = partition(labels, 5, "domain", domains=domains, balanced=False, alpha=0.5, seed=0)
    _disjoint(parts)
    sizes = np.array([len(p) for p in parts])
    assert len(set(sizes.tolist())) == 5
    counts = class_counts(parts, labels, K)
    mixes = counts / counts.sum(1, keepdims=True)
    assert min(np.abs(mixes[i] - mixes[j]).sum() for i in range(5) for j in range(i)) > 0.1
    for i, p in enumerate(parts):
        assert set(np.unique(domains[p]).tolist()) == {i}
        n_d = np.bincount(labels[domains == i], minlength=K)
        # the client's favourite class (w = 1) keeps its whole pool, the rest a fraction
        assert (counts[i] == n_d).any() and (counts[i] <= n_d).all()


def test_imbalanced_several_clients_per_domain():
    labels, domains = _uneven()
    parts = partition(labels, 15, "domain", domains=domains, balanced=False, alpha=0.5, seed=3)
    _disjoint(parts)
    assert [set(np.unique(domains[p]).tolist()) for p in parts] == [{i % 5} for i in range(15)]
    for d in range(5):  # owners share each (domain, class) pool: at most an equal share
        n_d = np.bincount(labels[domains == d], minlength=K)
        for i in range(d, 15, 5):
            assert (class_counts([parts[i]], labels, K)[0] <= -(-n_d // 3)).all()


def test_imbalanced_alpha_monotone_in_label_entropy_and_size():
    labels, domains = _uneven(sizes=(1000,) * 5)
    ent, size = [], []
    for a in (0.05, 0.5, 5.0, 100.0):
        runs = [
            partition(labels, 5, "domain", domains=domains, balanced=False, alpha=a, seed=s)
            for s in range(8)
        ]
        ent.append(np.mean([_entropy(p, labels) for p in runs]))
        size.append(np.mean([np.mean([len(x) for x in p]) for p in runs]))
    assert all(a < b for a, b in zip(ent, ent[1:])), ent
    assert all(a < b for a, b in zip(size, size[1:])), size


@pytest.mark.parametrize("balanced", [True, False])
def test_seeded(balanced):
    labels, domains = _uneven()
    a = partition(labels, 5, "domain", domains=domains, balanced=balanced, seed=4)
    assert _same(a, partition(labels, 5, "domain", domains=domains, balanced=balanced, seed=4))
    assert not _same(a, partition(labels, 5, "domain", domains=domains, balanced=balanced, seed=5))


def test_balanced_and_imbalanced_differ():
    labels, domains = _uneven()
    bal = partition(labels, 5, "domain", domains=domains, balanced=True, seed=0)
    imb = partition(labels, 5, "domain", domains=domains, balanced=False, alpha=0.5, seed=0)
    assert len({len(p) for p in bal}) == 1 and len({len(p) for p in imb}) == 5
    assert not _same(bal, imb)


# --------------------------------------------------------------------------------------
# Every dataset kind with domains
# --------------------------------------------------------------------------------------


def _check_bundle(bundle, num_clients):
    labels, domains = bundle.train_labels, bundle.train_domains
    assert domains is not None
    bal = partition(labels, num_clients, "domain", domains=domains, balanced=True, seed=0)
    imb = partition(
        labels, num_clients, "domain", domains=domains, balanced=False, alpha=0.5, seed=0
    )
    k = bundle.num_classes
    cb = class_counts(bal, labels, k)
    assert (cb == cb[0]).all() and cb[0].sum() > 0
    _disjoint(bal)
    _disjoint(imb)
    assert not _same(bal, imb)
    return bal, imb


def test_synthetic_domains_via_config():
    from fedrcl_flwr.run.runtime import client_partitions, load_bundle

    base = {
        "dataset": {
            "name": "synthetic",
            "synthetic": {
                "num_train": 600,
                "num_test": 60,
                "num_classes": 4,
                "image_size": 8,
                "num_domains": 3,
            },
        },
        "federation": {"num_clients": 3, "participation": 1.0},
    }
    cfg_b = config_from_dict({**base, "partition": {"scheme": "domain", "balanced": True}})
    cfg_i = config_from_dict(
        {**base, "partition": {"scheme": "domain", "balanced": False, "alpha": 0.5}}
    )
    bal, imb = client_partitions(cfg_b), client_partitions(cfg_i)
    labels = load_bundle(cfg_b).train_labels
    assert np.array_equal(class_counts(bal, labels, 4), np.full((3, 4), 50))
    assert len({len(p) for p in imb}) > 1
    cfg_s = config_from_dict({**base, "partition": {"scheme": "domain", "samples_per_class": 20}})
    assert [len(p) for p in client_partitions(cfg_s)] == [80, 80, 80]


def test_npz_with_domain_ids(tmp_path):
    from fedrcl_flwr.data.datasets import load_dataset

    rng = np.random.default_rng(0)
    n = 240
    np.savez(
        tmp_path / "d.npz",
        x_train=rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
        y_train=rng.integers(0, 3, n),
        d_train=np.arange(n) % 3,
        x_test=rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8),
        y_test=np.arange(12) % 3,
        d_test=np.arange(12) % 3,
    )
    b = load_dataset("npz", path=str(tmp_path / "d.npz"))
    _check_bundle(b, 3)


def test_digit5_local_npz_domains(tmp_path):
    from fedrcl_flwr.data.datasets import load_dataset

    rng = np.random.default_rng(0)
    for name, n in (("synthdigits", 60), ("mnistm", 100)):
        np.savez(
            tmp_path / f"{name}.npz",
            x_train=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            y_train=rng.permutation(np.arange(n) % 10),
            x_test=rng.integers(0, 256, (10, 28, 28), dtype=np.uint8),
            y_test=np.arange(10) % 10,
        )
    b = load_dataset("digit5", root=str(tmp_path), domains=["synthdigits", "mnistm"])
    bal, _ = _check_bundle(b, 2)
    assert [len(p) for p in bal] == [60, 60]  # 6 per class, the smaller domain's limit


def test_imagefolder_with_domains(tmp_path):
    from PIL import Image

    from fedrcl_flwr.data.datasets import load_dataset

    for dom, n in (("d1", 6), ("d2", 10)):
        for cname in ("cat", "dog"):
            folder = tmp_path / dom / cname
            folder.mkdir(parents=True)
            for i in range(n):
                a = np.full((8, 8, 3), 40 * (cname == "dog") + i, np.uint8)
                Image.fromarray(a).save(folder / f"{i}.png")
    b = load_dataset(
        "imagefolder", root=str(tmp_path), domains=["d1", "d2"], image_size=8, test_fraction=0.2
    )
    bal, _ = _check_bundle(b, 2)
    assert [len(p) for p in bal] == [10, 10]  # d1: 5 train per class


# --------------------------------------------------------------------------------------
# Paper YAMLs: balanced and imbalanced now give different splits
# --------------------------------------------------------------------------------------

FEDCCL = ROOT / "experiments" / "fedccl"
PAIRS = [
    ("table1_digit5_balanced", "table2_digit5_imbalanced"),
    ("table1_office10_balanced", "table2_office10_imbalanced"),
    ("table3_domainnet_balanced", "table3_domainnet_imbalanced"),
]


def _stand_in_split(path: Path):
    """The YAML's partition settings on synthetic stand-in data with its domain count."""
    cfg = load_config(path)
    nd = cfg.federation.num_clients // cfg.partition.domains_per_client
    labels, domains = _uneven(sizes=tuple(300 + 150 * d for d in range(nd)))
    p = cfg.partition
    return cfg, partition(
        labels,
        cfg.federation.num_clients,
        p.scheme,
        alpha=p.alpha,
        balanced=p.balanced,
        domains=domains,
        domains_per_client=p.domains_per_client,
        samples_per_class=p.samples_per_class,
        seed=cfg.seed,
    )


@pytest.mark.parametrize("bal_name,imb_name", PAIRS)
def test_paper_pairs_give_different_splits(bal_name, imb_name):
    cb, bal = _stand_in_split(FEDCCL / f"{bal_name}.yaml")
    ci, imb = _stand_in_split(FEDCCL / f"{imb_name}.yaml")
    assert cb.partition.scheme == ci.partition.scheme == "domain"
    assert cb.partition.balanced and not ci.partition.balanced and ci.partition.alpha == 0.5
    assert len({len(p) for p in bal}) == 1
    assert len({len(p) for p in imb}) == len(imb)
    assert not _same(bal, imb)


def test_table5_and_table7_files_use_the_settings_their_rows_name():
    for path in sorted(FEDCCL.glob("table[57]_*.yaml")):
        cfg = load_config(path)
        header = path.read_text().split("\nname:")[0].lower()
        assert cfg.partition.scheme == "domain", path.name
        if "imbalanced" in path.stem or cfg.partition.balanced is False:
            assert "imbalanced" in header and cfg.partition.alpha == 0.5, path.name


def test_figure5_alpha_sweep():
    files = sorted(FEDCCL.glob("figure5_domainnet_a*.yaml"))
    alphas = sorted(load_config(f).partition.alpha for f in files)
    assert alphas == [0.05, 0.1, 0.5, 1.0, 5.0]
    for f in files:
        cfg = load_config(f)
        assert cfg.partition.scheme == "domain" and cfg.partition.balanced is False
        assert cfg.dataset.name == "imagefolder" and len(cfg.dataset.domains) == 6
    # smaller alpha, more skewed label mixes on the stand-in data
    ents = []
    for f in sorted(files, key=lambda f: load_config(f).partition.alpha):
        _, parts = _stand_in_split(f)
        labels, _ = _uneven(sizes=tuple(300 + 150 * d for d in range(6)))
        ents.append(_entropy(parts, labels))
    assert ents[0] < ents[-1]


def test_inter_domain_yamls_raw_keys():
    # the partition block is explicit in every file (no reliance on defaults)
    for path in sorted(FEDCCL.glob("table[12357]_*.yaml")) + sorted(FEDCCL.glob("figure5_*.yaml")):
        raw = read_yaml(path)
        if raw["dataset"]["name"] not in ("digit5", "imagefolder"):
            continue
        assert raw["partition"]["scheme"] == "domain"
        assert "balanced" in raw["partition"], path.name


# --------------------------------------------------------------------------------------
# Report shows domains
# --------------------------------------------------------------------------------------


def test_report_names_domains_in_table_and_plot(tmp_path):
    labels, domains = _uneven()
    parts = partition(labels, 10, "domain", domains=domains, balanced=True, seed=0)
    names = ["mnist", "svhn", "usps", "synth", "mnistm"]
    doms = client_domains(parts, domains, names)
    assert doms == names * 2
    assert client_domains(parts, None) is None
    counts = class_counts(parts, labels, K)
    table = format_counts_table(counts, domains=doms)
    lines = table.splitlines()
    assert lines[0].startswith("| client | domains | size | classes | 0 |")
    assert lines[3].startswith(f"| 1 | svhn | {counts[1].sum()} | {K} |")
    two = partition(
        labels, 5, "domain", domains=domains, balanced=True, domains_per_client=2, seed=0
    )
    assert client_domains(two, domains, names)[0] == "mnist+svhn"
    out = tmp_path / "p.png"
    plot_counts_heatmap(counts, out, title="t", domains=doms)
    from PIL import Image

    w, h = Image.open(out).size
    assert out.stat().st_size > 2000 and h >= 200
    plot_counts_heatmap(counts, tmp_path / "q.png")  # without domains still works
    assert (tmp_path / "q.png").exists()


def test_cli_partition_prints_domains(tmp_path, capsys):
    from fedrcl_flwr.cli import main

    y = tmp_path / "e.yaml"
    y.write_text(
        "dataset: {name: synthetic, synthetic: {num_train: 300, num_test: 30, "
        "num_classes: 3, image_size: 8, num_domains: 3}}\n"
        "partition: {scheme: domain, balanced: true}\n"
        "federation: {num_clients: 3, participation: 1.0}\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # our code may warn about nothing; third-party deprecations (click via Flower's CLI
        # modules, imported or not depending on what ran before) are not ours to judge
        warnings.filterwarnings(
            "ignore", category=DeprecationWarning, module=r"(?!fedrcl_flwr|clients|strategies)"
        )
        rc = main(["partition", str(y), "--plot", str(tmp_path / "h.png")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| client | domains | size |" in out and "| 2 | domain2 | 99 | 3 |" in out
    assert (tmp_path / "h.png").exists()


def test_balanced_domain_split_says_how_many_images_it_used():
    """Domain 0 holds 3 + 5 images of classes 0 / 1, domain 1 holds 4 + 4: one client per
    domain, the balanced split gives each client min(3, 5, 4, 4) = 3 per class, 12 of 16."""
    from fedrcl_flwr.data.partition_schemes import by_domain, domain_split_note

    labels = np.array([0] * 3 + [1] * 5 + [0] * 4 + [1] * 4)
    domains = np.array([0] * 8 + [1] * 8)
    parts = by_domain(labels, domains, 2, 1, True, 0.5, np.random.default_rng(0))
    assert [len(p) for p in parts] == [6, 6]
    note = domain_split_note(parts, labels, domains, ["mnist", "digits"])
    assert note == (
        "the domain split uses 12 of 16 training images (per domain: mnist 6/8, digits 6/8)"
    )
    assert domain_split_note([np.arange(8), np.arange(8, 16)], labels, domains) is None
