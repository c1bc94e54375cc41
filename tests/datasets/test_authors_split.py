"""The FedRCL authors' splits as their trainer computes them.

The references are independent transliterations of skynbe/FedRCL @ 378beb4
``datasets/cifar.py`` (the same file in geehokim/FedACG), written the way the authors
wrote them, and run the way their trainer runs them: ``utils/data.py: get_dataset`` hands
them the training set *with its transforms* (``datasets/build.py``: RandomRotation(10),
RandomCrop(32, padding=4), RandomHorizontalFlip(), ToTensor(), Normalize with
``datasets/configs.yaml``'s constants), here torchvision's real ``CIFAR10`` class reading
tiny files written in CIFAR-10's on-disk format. Nothing of the project is imported for
the references.
"""

import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torchvision import transforms
from torchvision.datasets import CIFAR10

from fedrcl_flwr.cli import main
from fedrcl_flwr.data.partition import partition
from fedrcl_flwr.data.split_file import load_split_file
from fedrcl_flwr.errors import PartitionError

# ----------------------------------------------------------------------------- the data


def _write_cifar10(root: Path, labels: np.ndarray, n_test: int = 20, seed: int = 0):
    """cifar-10-batches-py as distributed: five training pickles, a test pickle, the
    meta pickle with its ten label names (the training labels are ``labels``)."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    n = len(labels)
    x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    for b, chunk in enumerate(np.array_split(np.arange(n), 5), start=1):
        with open(d / f"data_batch_{b}", "wb") as f:
            pickle.dump(
                {
                    "batch_label": f"training batch {b} of 5",
                    "labels": [int(v) for v in labels[chunk]],
                    "data": x[chunk],
                    "filenames": [f"img{i}.png" for i in chunk],
                },
                f,
                protocol=2,
            )
    with open(d / "test_batch", "wb") as f:
        pickle.dump(
            {
                "batch_label": "testing batch 1 of 1",
                "labels": [int(v) for v in rng.integers(0, 10, n_test)],
                "data": rng.integers(0, 256, (n_test, 3072), dtype=np.uint8),
                "filenames": [f"t{i}.png" for i in range(n_test)],
            },
            f,
            protocol=2,
        )
    with open(d / "batches.meta", "wb") as f:
        pickle.dump(
            {
                "num_cases_per_batch": n // 5,
                "num_vis": 3072,
                "label_names": [
                    "airplane",
                    "automobile",
                    "bird",
                    "cat",
                    "deer",
                    "dog",
                    "frog",
                    "horse",
                    "ship",
                    "truck",
                ],
            },
            f,
            protocol=2,
        )


class _OwnFiles(CIFAR10):
    """torchvision's CIFAR10 with the official MD5s dropped (it then only checks that the
    files exist), so that it reads the tiny files; decoding is torchvision's."""

    train_list = [[name, None] for name, _ in CIFAR10.train_list]
    test_list = [[name, None] for name, _ in CIFAR10.test_list]
    meta = {**CIFAR10.meta, "md5": None}


def _their_train_set(root: Path):
    """``build_dataset(args, train=True)`` for CIFAR10: their transform chain."""
    normalize = transforms.Normalize([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010])
    chain = transforms.Compose(
        [
            transforms.RandomRotation(10),
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]
    )
    return _OwnFiles(str(root), train=True, transform=chain)


# ------------------------------------------------------------- their functions, transliterated


class _temp_seed:
    def __init__(self, seed):
        self.seed = seed

    def __enter__(self):
        self.state = np.random.get_state()
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)
        torch.cuda.manual_seed(self.seed)

    def __exit__(self, *exc):
        np.random.set_state(self.state)  # theirs restores NumPy only


def _cifar_dirichlet_balanced(dataset, n_nets, alpha=0.5):
    with _temp_seed(0):
        y_train = torch.zeros(len(dataset), dtype=torch.long)
        for a in range(len(dataset)):
            y_train[a] = dataset[a][1]
        K = len(dataset.class_to_idx)
        N = y_train.shape[0]
        net_dataidx_map = {i: np.array([], dtype="int64") for i in range(n_nets)}
        assigned_ids = []
        idx_batch = [[] for _ in range(n_nets)]
        num_data_per_client = int(N / n_nets)
        for i in range(n_nets):
            weights = torch.zeros(N)
            proportions = np.random.dirichlet(np.repeat(alpha, K))
            for k in range(K):
                idx_k = np.where(y_train == k)[0]
                weights[idx_k] = proportions[k]
            weights[assigned_ids] = 0.0
            idx_batch[i] = (
                torch.multinomial(weights, num_data_per_client, replacement=False)
            ).tolist()
            assigned_ids += idx_batch[i]
        for j in range(n_nets):
            np.random.shuffle(idx_batch[j])
            net_dataidx_map[j] = idx_batch[j]
    return net_dataidx_map


class _Labels:
    """A bare label array with the dataset interface their function reads."""

    def __init__(self, labels, num_classes=10):
        self.labels = [int(v) for v in labels]
        self.class_to_idx = {f"c{k}": k for k in range(num_classes)}

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, a):
        return None, self.labels[a]


def _cifar_iid(dataset, num_users):
    num_items = int(len(dataset) / num_users)
    dict_users, all_idxs = {}, [i for i in range(len(dataset))]
    for i in range(num_users):
        dict_users[i] = set(np.random.choice(all_idxs, num_items, replace=False))
        all_idxs = list(set(all_idxs) - dict_users[i])
    return dict_users


def _cifar_noniid(dataset, num_clients, class_per_client=1):
    num_shards = num_clients * class_per_client
    num_imgs = int(len(dataset) / num_shards)
    idx_shard = [i for i in range(num_shards)]
    dict_users = {i: np.array([], dtype="int64") for i in range(num_clients)}
    idxs = np.arange(num_shards * num_imgs)
    labels = []
    for element in dataset:
        labels.append(int(element[1]))
    labels = np.array(labels)
    idxs_labels = np.vstack((idxs, labels))
    idxs_labels = idxs_labels[:, idxs_labels[1, :].argsort()]
    idxs = idxs_labels[0, :]
    for i in range(num_clients):
        rand_set = set(np.random.choice(idx_shard, class_per_client, replace=False))
        idx_shard = list(set(idx_shard) - rand_set)
        for rand in rand_set:
            dict_users[i] = np.concatenate(
                (dict_users[i], idxs[rand * num_imgs : (rand + 1) * num_imgs]), axis=0
            )
        dict_users[i] = set(dict_users[i])
    return dict_users


def _cifar_dirichlet_unbalanced(dataset, n_nets, alpha=0.5):
    y_train = torch.zeros(len(dataset), dtype=torch.long)
    for a in range(len(dataset)):
        y_train[a] = dataset[a][1]
    min_size = 0
    K = len(dataset.class_to_idx)
    N = y_train.shape[0]
    net_dataidx_map = {i: np.array([], dtype="int64") for i in range(n_nets)}
    while min_size < 10:
        idx_batch = [[] for _ in range(n_nets)]
        for k in range(K):
            idx_k = np.where(y_train == k)[0]
            np.random.shuffle(idx_k)
            proportions = np.random.dirichlet(np.repeat(alpha, n_nets))
            proportions = np.array(
                [p * (len(idx_j) < N / n_nets) for p, idx_j in zip(proportions, idx_batch)]
            )
            proportions = proportions / proportions.sum()
            proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            idx_batch = [
                idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))
            ]
            min_size = min([len(idx_j) for idx_j in idx_batch])
        for j in range(n_nets):
            np.random.shuffle(idx_batch[j])
            net_dataidx_map[j] = idx_batch[j]
    return net_dataidx_map


# ----------------------------------------------------------------------------- the tests


def _unseen_labels(n, seed, missing=()):
    """Random labels in 0..9 (not class-balanced), without the classes in ``missing``."""
    keep = [k for k in range(10) if k not in missing]
    return np.random.default_rng(seed).choice(keep, n)


def _experiment(tmp_path, root, alpha, clients, **partition):
    exp = {
        "name": "authors_split",
        "seed": 3,  # the run seed must not matter
        "dataset": {
            "name": "cifar10",
            "root": str(root),
            "verify_md5": False,
            "rotation": 10,
            "cache_dir": str(tmp_path / "cache"),
        },
        "partition": {
            "scheme": "dirichlet",
            "alpha": alpha,
            "balanced": True,
            "seed": 0,
            **partition,
        },
        "federation": {"num_clients": clients, "rounds": 1, "clients_per_round": 1},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


@pytest.mark.parametrize(
    "n,clients,alpha,missing", [(500, 10, 0.3, ()), (600, 20, 1.0, (9,)), (480, 8, 0.1, ())]
)
def test_cli_split_is_the_authors_trainer_split(tmp_path, capsys, n, clients, alpha, missing):
    labels = _unseen_labels(n, seed=n + clients, missing=missing)
    root = tmp_path / "data"
    _write_cifar10(root, labels)
    theirs = _cifar_dirichlet_balanced(_their_train_set(root), clients, alpha=alpha)
    exp = _experiment(tmp_path, root, alpha, clients)
    rc = main(["partition", str(exp), "--save", str(tmp_path / "split.json")])
    assert rc == 0, capsys.readouterr().err
    ours = json.loads((tmp_path / "split.json").read_text())
    assert sorted(ours, key=int) == [str(c) for c in range(clients)]
    for c in range(clients):
        assert ours[str(c)] == theirs[c]  # same indices, same (shuffled) order
    # on bare labels (no transform draws) their function gives another split: the draws
    # of their trainer's transforms are what makes it theirs
    bare = _cifar_dirichlet_balanced(_Labels(labels), clients, alpha=alpha)
    assert sum(set(ours[str(c)]) == set(bare[c]) for c in range(clients)) < clients
    # the labels-only variant is their function on bare labels, the explicit option
    rc = main(
        [
            "partition",
            str(exp),
            "--set",
            "partition.generator=fedrcl_labels",
            "--save",
            str(tmp_path / "bare.json"),
        ]
    )
    assert rc == 0
    got = json.loads((tmp_path / "bare.json").read_text())
    assert [got[str(c)] for c in range(clients)] == [bare[c] for c in range(clients)]


def test_split_needs_the_datasets_class_count_not_the_largest_label():
    # K = len(class_to_idx) = 10 even when class 9 never occurs: a Dirichlet over 9
    # classes would draw other proportions
    labels = _unseen_labels(400, seed=4, missing=(9,))
    theirs = _cifar_dirichlet_balanced(_Labels(labels, 10), 8, alpha=0.5)
    ours = partition(
        labels,
        8,
        "dirichlet",
        alpha=0.5,
        balanced=True,
        seed=0,
        generator="fedrcl_labels",
        num_classes=10,
    )
    assert [p.tolist() for p in ours] == [theirs[c] for c in range(8)]
    nine = partition(
        labels, 8, "dirichlet", alpha=0.5, balanced=True, seed=0, generator="fedrcl_labels"
    )
    assert [p.tolist() for p in nine] != [theirs[c] for c in range(8)]


@pytest.mark.parametrize(
    "n,k,clients,alpha,seed",
    [(5000, 10, 20, 0.05, 0), (6000, 100, 30, 0.1, 0), (2003, 10, 7, 0.6, 3)],
)
def test_labels_variant_equals_their_function_on_bare_labels(n, k, clients, alpha, seed):
    labels = np.random.default_rng(seed + 1).permutation(np.arange(n) % k)
    ours = partition(
        labels,
        clients,
        "dirichlet",
        alpha=alpha,
        balanced=True,
        seed=0,
        generator="fedrcl_labels",
        num_classes=k,
    )
    theirs = _cifar_dirichlet_balanced(_Labels(labels, k), clients, alpha=alpha)
    assert [a.tolist() for a in ours] == [theirs[c] for c in range(clients)]
    assert all(a.dtype == np.int64 for a in ours)
    assert [len(a) for a in ours] == [n // clients] * clients


def test_authors_iid_equals_cifar_iid_and_their_released_files():
    labels = np.zeros(997, dtype=np.int64)
    for seed in (0, 5):
        np.random.seed(seed)
        theirs = _cifar_iid(_Labels(labels), 9)
        ours = partition(labels, 9, "iid", seed=seed, generator="fedrcl")
        assert [set(p.tolist()) for p in ours] == [theirs[c] for c in range(9)]
        assert all(len(p) == 997 // 9 for p in ours)
    # skynbe/FedRCL client_data/CIFAR10/balanced/iid_clients100.txt (CIFAR100's is the same
    # file): SHA-256 of the JSON list of every client's sorted indices
    ours = partition(np.zeros(50000, np.int64), 100, "iid", seed=0, generator="fedrcl")
    canon = json.dumps([sorted(p.tolist()) for p in ours])
    assert (
        hashlib.sha256(canon.encode()).hexdigest()
        == "c13566fcea91af57238b469b28c32e87584ce72a2fb5bce8abac5161dcd0d33d"
    )


def test_authors_shards_equal_cifar_noniid(tmp_path):
    labels = _unseen_labels(400, seed=7)
    root = tmp_path / "data"
    _write_cifar10(root, labels)
    for per_client in (1, 2, 5):
        np.random.seed(2)  # their initalize_random_seed(args.seed)
        theirs = _cifar_noniid(_their_train_set(root), 20, per_client)
        ours = partition(
            labels, 20, "shards", shards_per_client=per_client, seed=2, generator="fedrcl"
        )
        assert [set(p.tolist()) for p in ours] == [theirs[c] for c in range(20)]
    with pytest.raises(PartitionError, match="multiple of num_clients"):
        partition(labels, 30, "shards", shards_per_client=1, seed=0, generator="fedrcl")


def test_authors_unbalanced_dirichlet_equals_theirs():
    labels = _unseen_labels(3000, seed=9)
    np.random.seed(4)
    theirs = _cifar_dirichlet_unbalanced(_Labels(labels), 12, alpha=0.3)
    ours = partition(
        labels,
        12,
        "dirichlet",
        alpha=0.3,
        balanced=False,
        min_size=10,
        seed=4,
        generator="fedrcl",
        num_classes=10,
    )
    assert [set(p.tolist()) for p in ours] == [set(theirs[c]) for c in range(12)]


def test_generators_restore_the_global_generators_and_depend_only_on_their_seed():
    labels = _unseen_labels(3000, seed=1)
    np.random.seed(123)
    torch.manual_seed(456)
    np_before, torch_before = np.random.random(), torch.rand(1).item()
    for kw in (
        {"scheme": "dirichlet", "balanced": True},
        {"scheme": "iid", "generator": "fedrcl"},
        {"scheme": "shards", "generator": "fedrcl", "shards_per_client": 2},
    ):
        np.random.seed(123)
        torch.manual_seed(456)
        a = partition(labels, 10, alpha=0.1, seed=5, **kw)
        assert np.random.random() == np_before and torch.rand(1).item() == torch_before
        np.random.seed(999)
        torch.manual_seed(999)
        b = partition(labels, 10, alpha=0.1, seed=5, **kw)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        c = partition(labels, 10, alpha=0.1, seed=6, **kw)
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize(
    "kw,msg",
    [
        (
            {"scheme": "dirichlet", "balanced": True, "generator": "project"},
            "project has no balanced Dirichlet split",
        ),
        ({"scheme": "domain", "generator": "fedrcl"}, "fedrcl has no 'domain' split"),
        ({"scheme": "iid", "generator": "nope"}, "must be project, fedrcl, fedrcl_labels"),
    ],
)
def test_bad_generator_is_exit_2_one_line(tmp_path, capsys, kw, msg):
    exp = {
        "name": "g",
        "dataset": {"name": "synthetic", "synthetic": {"num_train": 200, "num_test": 50}},
        "partition": kw,
        "federation": {"num_clients": 4, "rounds": 1, "clients_per_round": 1},
    }
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(exp))
    assert main(["partition", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and str(path) in err[0], err


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_split_file_json_and_authors_literals_read_the_same(tmp_path):
    parts = {0: [5, 3, 9], 1: [0, 1], 2: [7]}
    js = _write(tmp_path, "s.json", json.dumps({str(k): v for k, v in parts.items()}))
    lit = _write(tmp_path, "s.txt", repr(parts))  # the authors' `{0: [10385, ...], ...}`
    for path in (js, lit):
        got = partition(np.zeros(10, int), 3, "file", path=path)
        assert [g.tolist() for g in got] == [[5, 3, 9], [0, 1], [7]]
        assert all(g.dtype == np.int64 for g in got)
    # their iid files hold sets: {0: {16406, ...}, ...}
    sets = _write(tmp_path, "iid.txt", "{0: {5, 3, 9}, 1: {0, 1}, 2: {7}}")
    got = partition(np.zeros(10, int), 3, "file", path=sets)
    assert [sorted(g.tolist()) for g in got] == [[3, 5, 9], [0, 1], [7]]


def test_authors_literal_reads_integers_with_leading_zeros(tmp_path):
    """The authors' format is scanned as digits: ``007`` is 7 (Python's parser refuses it)."""
    path = _write(tmp_path, "zeros.txt", "{0: [007, 1], 1: (3,), 2: {04}}")
    got = partition(np.zeros(10, int), 3, "file", path=path)
    assert [g.tolist() for g in got] == [[7, 1], [3], [4]]


@pytest.mark.parametrize(
    "text,msg",
    [
        ('{"0": [1, 2], "1": [2, 3]}', "index 2 is given more than once"),
        ('{"0": [1, 2], "1": [10]}', "index 10 out of range for 10"),
        ('{"0": [1, -1], "1": [3]}', "index -1 out of range"),
        ('{"0": [1, 2.5], "1": [3]}', "indices must be a list of integers"),
        ('{"0": [1, 2]}', "holds 1 clients (ids 0..0) but federation.num_clients is 2"),
        ('{"0": [1], "2": [3]}', "holds 2 clients (ids 0..2)"),
        ('{"a": [1], "1": [3]}', "client id 'a' is not an integer"),
        ('{0: [1], 1: [__import__("os").getpid()]}', "neither JSON nor a Python dict literal"),
        ("[[1], [2]]", "must map client ids to index lists"),
        ('{"0": [], "1": [3]}', "client 0 has no samples"),
        # a key given twice (Python's own literal_eval would keep the last list)
        ("{0: [1], 0: [2], 1: [3]}", "client 0 appears twice"),
        ('{"0": [1], "0": [2], "1": [3]}', "client '0' appears twice"),
        ("{0: {1, 1}, 1: {3}}", "client 0: an index is given twice"),
    ],
)
def test_split_file_validation_is_one_clear_error(tmp_path, text, msg):
    path = _write(tmp_path, "bad.txt", text)
    with pytest.raises(PartitionError) as e:
        load_split_file(path, 10, 2)
    assert msg in str(e.value) and "bad.txt" in str(e.value)


def test_missing_split_file(tmp_path):
    with pytest.raises(PartitionError, match="cannot read the split file"):
        load_split_file(str(tmp_path / "nope.txt"), 10, 2)
