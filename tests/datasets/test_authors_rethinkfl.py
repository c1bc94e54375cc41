"""FPL's code (WenkeHuang/RethinkFL @ 74201b3) as its trainer runs it, against ours:
the Digits and Office-Caltech domain-skew splits client for client, the
Office-Caltech train / test rule, FPL's loss and its FINCH server step.

The references are independent transliterations of their files, written the way they
wrote them (``utils/training.py: train``, ``datasets/utils/federated_dataset.py:
partition_digits_domain_skew_loaders`` / ``partition_office_domain_skew_loaders_new``,
``datasets/officecaltech.py: ImageFolder_Custom``, ``models/fpl.py``), run on tiny files
in the real on-disk formats read by torchvision's own classes (MNIST idx files, USPS
bz2, SVHN .mat, ImageFolder trees). Nothing of the project is imported for them.
"""

import bz2
import json
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import yaml

from fedrcl_flwr.cli import main

# ----------------------------------------------------------------------------- the files


def write_mnist(root: Path, n_train: int, n_test: int, seed: int = 0) -> None:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + x.tobytes()
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + y.tobytes())


def write_usps(folder: Path, n_train: int, n_test: int, seed: int = 1) -> None:
    """libsvm lines ``label idx:value ...`` (label 1..10, values in [-1, 1]), bz2."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name, n in (("usps.bz2", n_train), ("usps.t.bz2", n_test)):
        lines = []
        for _ in range(n):
            v = rng.integers(0, 256, 256) / 255 * 2 - 1
            feats = " ".join(f"{j + 1}:{a:.6f}" for j, a in enumerate(v))
            lines.append(f"{int(rng.integers(1, 11))} {feats}\n")
        (folder / name).write_bytes(bz2.compress("".join(lines).encode()))


def write_svhn(folder: Path, n_train: int, n_test: int, seed: int = 2) -> None:
    from scipy.io import savemat

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name, n in (("train_32x32.mat", n_train), ("test_32x32.mat", n_test)):
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        y = rng.integers(1, 11, (n, 1)).astype(np.uint8)  # 10 = digit 0
        savemat(folder / name, {"X": x, "y": y})


def write_image_tree(folder: Path, counts: list, size: int, ext: str, seed: int) -> None:
    """``folder/<class>/<i>.<ext>``, ``counts[c]`` images of class ``c``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, n in enumerate(counts):
        d = folder / str(c)
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            a = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(a).save(d / f"img{i:03d}.{ext}")


def write_digits(root: Path) -> dict:
    """Their four Digits domains under ``root`` in both layouts: theirs (USPS and SVHN
    files directly in ``data_path()``) and ours (``usps/``, ``svhn/``), same bytes."""
    write_mnist(root, 300, 30)
    write_usps(root / "usps", 200, 20)
    write_svhn(root / "svhn", 250, 25)
    for f in ("usps.bz2", "usps.t.bz2"):
        (root / f).write_bytes((root / "usps" / f).read_bytes())
    for f in ("train_32x32.mat", "test_32x32.mat"):
        (root / f).write_bytes((root / "svhn" / f).read_bytes())
    write_image_tree(root / "syn" / "train", [22] * 10, 32, "png", 3)
    write_image_tree(root / "syn" / "val", [3] * 10, 32, "png", 4)
    return {"mnist": 300, "usps": 200, "svhn": 250, "syn": 220}


def write_office(root: Path) -> None:
    """``root/Office_Caltech_10/<domain>/<class>/*.jpg``, unequal classes."""
    for k, dom in enumerate(("caltech", "amazon", "webcam", "dslr")):
        counts = [12 + (3 * c + k) % 7 for c in range(10)]
        write_image_tree(root / "Office_Caltech_10" / dom, counts, 40, "jpg", 10 + k)


# ------------------------------------------------------------- their path, transliterated


def their_digits_train_sets(root: Path) -> dict:
    """``MyDigits(...).dataset`` / ``ImageFolder_Custom(...).imagefolder_obj``: the
    objects their partition function indexes, and the labels it reads from each."""
    from torchvision.datasets import MNIST, SVHN, USPS, ImageFolder

    svhn = SVHN.__new__(SVHN)  # their SVHN(root, 'train', ..., download=True) minus the MD5
    svhn.root, svhn.split, svhn.transform, svhn.target_transform = str(root), "train", None, None
    import scipy.io as sio

    m = sio.loadmat(str(root / "train_32x32.mat"))
    svhn.data = np.transpose(m["X"], (3, 2, 0, 1))
    svhn.labels = m["y"].astype(np.int64).squeeze()
    np.place(svhn.labels, svhn.labels == 10, 0)
    return {
        "mnist": MNIST(str(root), True, None, None, False).targets,
        "usps": USPS(str(root), True, None, None, False).targets,
        "svhn": svhn.labels,
        "syn": ImageFolder(str(root) + "/" + "syn" + "/train/").targets,
    }


def their_domains(seed: int, parti_num: int, domains_list: list, office: bool) -> list:
    """utils/training.py ``train``, ``rand_dataset`` (after main's set_random_seed)."""
    np.random.seed(seed)
    max_num = 10
    is_ok = False
    while not is_ok:
        if office:
            selected_domain_list = np.random.choice(
                domains_list, size=parti_num - len(domains_list), replace=True, p=None
            )
            selected_domain_list = list(selected_domain_list) + domains_list
        else:
            selected_domain_list = np.random.choice(
                domains_list, size=parti_num, replace=True, p=None
            )
        result = dict(Counter(selected_domain_list))
        for k in result:
            if result[k] > max_num:
                is_ok = False
                break
        else:
            is_ok = True
    return list(selected_domain_list)


def their_digits_split(ylens: dict, selected: list, percent: dict) -> list:
    """partition_digits_domain_skew_loaders: (domain, selected_idx) per client."""
    ini_len_dict, not_used_index_dict = {}, {}
    for name in selected:
        if name not in not_used_index_dict:
            not_used_index_dict[name] = np.arange(ylens[name])
            ini_len_dict[name] = ylens[name]
    out = []
    for name in selected:
        idxs = np.random.permutation(not_used_index_dict[name])
        selected_idx = idxs[0 : int(percent[name] * ini_len_dict[name])]
        not_used_index_dict[name] = idxs[int(percent[name] * ini_len_dict[name]) :]
        out.append((name, selected_idx))
    return out


def their_office_train(root: Path, name: str):
    """ImageFolder_Custom(train=True): the ImageFolder and its train_index_list."""
    from torchvision.datasets import ImageFolder

    obj = ImageFolder(str(root) + "/" + "Office_Caltech_10/" + name + "/")
    train_index_list, test_index_list = [], []
    for i in range(len(obj.samples)):
        if i % 10 <= 7:
            train_index_list.append(i)
        else:
            test_index_list.append(i)
    return obj, train_index_list, test_index_list


def their_office_split(root: Path, selected: list, percent: dict) -> list:
    """partition_office_domain_skew_loaders_new."""
    train_datasets = [their_office_train(root, n) + (n,) for n in selected]
    ini_len_dict, not_used_index_dict, all_labels_list = {}, {}, []
    for obj, tr, _, name in train_datasets:
        all_train_index = np.array(tr)
        if name not in not_used_index_dict:
            not_used_index_dict[name] = np.arange(len(all_train_index))
            ini_len_dict[name] = len(all_train_index)
        all_labels_list.append(np.unique(np.array(obj.targets)[all_train_index]))
    all_labels_array = np.array(all_labels_list)
    out = []
    for index, (obj, tr, _, name) in enumerate(train_datasets):
        idxs = np.random.permutation(not_used_index_dict[name])
        selected_idx = idxs[0 : int(percent[name] * ini_len_dict[name])]
        train_labels = np.array(obj.targets)[np.array(tr)]
        selected_labels = train_labels[selected_idx]
        show_up_num = np.zeros(len(all_labels_array[index]))
        for i in range(len(selected_labels)):
            show_up_num[selected_labels[i]] += 1
        not_used_labels = np.where(show_up_num == 0)[0]
        for i in range(len(not_used_labels)):
            not_used_label = not_used_labels[i]
            not_used_label_idx = np.where(train_labels == not_used_label)[0]
            add_index = not_used_label_idx[np.random.randint(len(not_used_label_idx))]
            used_label = train_labels[selected_idx]
            prob_del_place = np.where(show_up_num >= 2)[0]
            del_index = np.random.randint(len(prob_del_place))
            del_label = prob_del_place[del_index]
            prob_del_selected = np.where(used_label == del_label)[0]
            del_index_selected = prob_del_selected[np.random.randint(len(prob_del_selected))]
            selected_idx = selected_idx[selected_idx != selected_idx[del_index_selected]]
            selected_idx = np.append(selected_idx, add_index)
            show_up_num[del_label] -= 1
            show_up_num[not_used_label] += 1
        not_select_index = np.array(idxs)
        for i in range(len(selected_idx)):
            not_select_index = not_select_index[not_select_index != selected_idx[i]]
        not_used_index_dict[name] = not_select_index
        out.append((name, selected_idx))
    return out


# ---------------------------------------------------------------------------------- ours


def _experiment(tmp: Path, dataset: dict, partition: dict, num_clients: int) -> Path:
    cfg = {
        "name": "rethinkfl_split",
        "seed": 0,
        "dataset": {**dataset, "cache_dir": str(tmp / "cache")},
        "partition": partition,
        "model": {"name": "resnet10_bn", "params": {"nf": 4}},
        "federation": {"num_clients": num_clients, "rounds": 1},
        "client": {"method": "fedavg", "device": "cpu"},
        "output": {"dir": str(tmp / "runs")},
    }
    p = tmp / "exp.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _our_split(exp: Path, tmp: Path, seed: int) -> list:
    out = tmp / f"split{seed}.json"
    assert main(["partition", str(exp), "--set", f"seed={seed}", "--save", str(out)]) == 0
    data = json.loads(out.read_text())
    return [np.asarray(data[str(c)]) for c in range(len(data))]


def _as_domain_local(parts: list, sizes: list, names: list) -> list:
    """Our global training indices as (domain name, sorted local indices)."""
    offsets = np.cumsum([0, *sizes])
    out = []
    for p in parts:
        d = int(np.searchsorted(offsets, p[0], side="right") - 1)
        assert (p >= offsets[d]).all() and (p < offsets[d + 1]).all()
        out.append((names[d], np.sort(p - offsets[d])))
    return out


DIGITS = ["mnist", "usps", "svhn", "syn"]
OFFICE = ["caltech", "amazon", "webcam", "dslr"]


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    sizes = write_digits(root)
    return root, sizes


@pytest.mark.parametrize("seed,clients,frac", [(0, 20, 0.04), (3, 7, 0.1)])
def test_digits_split_client_for_client(digits_root, tmp_path, seed, clients, frac):
    root, sizes = digits_root
    ds = {"name": "digit5", "root": str(root), "domains": DIGITS, "verify_md5": False}
    part = {"scheme": "domain", "generator": "rethinkfl_digits", "domain_fraction": frac}
    ours = _as_domain_local(
        _our_split(_experiment(tmp_path, ds, part, clients), tmp_path, seed),
        [sizes[n] for n in DIGITS],
        DIGITS,
    )
    ylens = {k: len(v) for k, v in their_digits_train_sets(root).items()}
    assert ylens == sizes
    selected = their_domains(seed, clients, DIGITS, office=False)
    theirs = their_digits_split(ylens, selected, dict.fromkeys(DIGITS, frac))
    assert [n for n, _ in ours] == [n for n, _ in theirs]
    for (n1, a), (n2, b) in zip(ours, theirs):
        assert n1 == n2 and a.tolist() == sorted(b.tolist())


def test_digits_train_order_and_labels_as_theirs(digits_root, tmp_path):
    """The split's indices name the same samples: our training set per domain is their
    dataset's order (labels equal sample for sample; SVHN and syn pixels too)."""
    from fedrcl_flwr.data.datasets import load_dataset

    root, sizes = digits_root
    b = load_dataset("digit5", root=str(root), domains=DIGITS, verify_md5=False)
    theirs = their_digits_train_sets(root)
    off = 0
    for name in DIGITS:
        y = np.asarray(theirs[name])
        assert b.train_labels[off : off + len(y)].tolist() == y.tolist(), name
        off += len(y)
    from scipy.io import loadmat

    x = np.transpose(loadmat(str(root / "train_32x32.mat"))["X"], (3, 0, 1, 2))
    s0 = sizes["mnist"] + sizes["usps"]
    ours = b.train.images[s0 : s0 + sizes["svhn"]].permute(0, 2, 3, 1).numpy()
    assert np.array_equal(ours, x)
    assert (b.test_domains == 3).sum() == 30  # syn/val is the test split


@pytest.fixture(scope="module")
def office_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("office")
    write_office(root)
    return root


@pytest.mark.parametrize("seed,clients,frac", [(0, 10, 0.2), (5, 6, 0.1)])
def test_office_split_client_for_client(office_root, tmp_path, seed, clients, frac):
    """Their class swap included (frac 0.1 leaves classes out of most draws)."""
    ds = {
        "name": "imagefolder",
        "root": str(office_root / "Office_Caltech_10"),
        "domains": OFFICE,
        "test_split": "rethinkfl",
        "image_size": 32,
    }
    part = {"scheme": "domain", "generator": "rethinkfl_office", "domain_fraction": frac}
    trains = {n: their_office_train(office_root, n) for n in OFFICE}
    sizes = [len(trains[n][1]) for n in OFFICE]
    ours = _as_domain_local(
        _our_split(_experiment(tmp_path, ds, part, clients), tmp_path, seed), sizes, OFFICE
    )
    selected = their_domains(seed, clients, OFFICE, office=True)
    theirs = their_office_split(office_root, selected, dict.fromkeys(OFFICE, frac))
    assert [n for n, _ in ours] == [n for n, _ in theirs]
    for (n1, a), (n2, b) in zip(ours, theirs):
        assert n1 == n2 and a.tolist() == sorted(b.tolist())
    for name, idx in theirs:  # every class present in every client (their swap)
        obj, tr, _ = trains[name]
        assert len(set(np.array(obj.targets)[np.array(tr)][idx].tolist())) == 10


def test_office_train_test_rule(office_root):
    """dataset.test_split rethinkfl: their ImageFolder_Custom's i % 10 rule, labels and
    decoded pixels (PIL bilinear to 32 as their Resize) sample for sample."""
    from PIL import Image

    from fedrcl_flwr.data.datasets import load_dataset

    b = load_dataset(
        "imagefolder",
        root=str(office_root / "Office_Caltech_10"),
        domains=OFFICE,
        test_split="rethinkfl",
        image_size=32,
    )
    ytr, yte, xte = [], [], []
    for name in OFFICE:
        obj, tr, te = their_office_train(office_root, name)
        ytr += [obj.targets[i] for i in tr]
        yte += [obj.targets[i] for i in te]
        for i in te:
            im = Image.open(obj.samples[i][0]).convert("RGB").resize((32, 32), Image.BILINEAR)
            xte.append(np.asarray(im))
    assert b.train_labels.tolist() == ytr and b.test_labels.tolist() == yte
    assert np.array_equal(b.test.images.permute(0, 2, 3, 1).numpy(), np.stack(xte))


def test_rethinkfl_generator_needs_domain_scheme(digits_root, tmp_path, capsys):
    root, _ = digits_root
    ds = {"name": "digit5", "root": str(root), "domains": DIGITS, "verify_md5": False}
    exp = _experiment(tmp_path, ds, {"scheme": "iid", "generator": "rethinkfl_digits"}, 4)
    assert main(["partition", str(exp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rethinkfl_digits" in err[0] and "domain" in err[0]
    exp = _experiment(
        tmp_path, ds, {"scheme": "domain", "generator": "rethinkfl_digits", "domain_fraction": 2}, 4
    )
    assert main(["partition", str(exp)]) == 2
    assert "partition.domain_fraction" in capsys.readouterr().err


# ------------------------------------------------------------------------ FPL's loss


class _TheirFPL:
    """models/fpl.py ``hierarchical_info_loss`` / ``calculate_infonce`` and the
    per-sample loop of ``_train_net`` (their names)."""

    def __init__(self, global_protos: dict, infoNCET: float):
        self.global_protos, self.infoNCET, self.device = global_protos, infoNCET, "cpu"

    def calculate_infonce(self, f_now, f_pos, f_neg):
        f_proto = torch.cat((f_pos, f_neg), dim=0)
        l = torch.cosine_similarity(f_now, f_proto, dim=1)  # noqa: E741 (their name)
        l = l / self.infoNCET  # noqa: E741
        exp_l = torch.exp(l).view(1, -1)
        pos_mask = [1 for _ in range(f_pos.shape[0])] + [0 for _ in range(f_neg.shape[0])]
        pos_mask = torch.tensor(pos_mask, dtype=exp_l.dtype).view(1, -1)
        pos_l = exp_l * pos_mask
        return -torch.log(pos_l.sum(1) / exp_l.sum(1))

    def hierarchical_info_loss(self, f_now, label, all_f, mean_f, keys):
        f_pos = [f for f, k in zip(all_f, keys) if k == label.item()][0]
        f_neg = torch.cat([f for f, k in zip(all_f, keys) if k != label.item()])
        xi = self.calculate_infonce(f_now, f_pos, f_neg)
        mean_f_pos = [m for m, k in zip(mean_f, keys) if k == label.item()][0].view(1, -1)
        return xi + nn.MSELoss()(f_now, mean_f_pos)

    def loss(self, f, labels):
        keys = np.array(list(self.global_protos.keys()))
        all_f, mean_f = [], []
        for k in keys:
            temp_f = torch.cat(self.global_protos[k], dim=0)
            all_f.append(temp_f)
            mean_f.append(torch.mean(temp_f, dim=0))
        i, loss_InfoNCE = 0, None
        for label in labels:
            if label.item() in self.global_protos.keys():
                li = self.hierarchical_info_loss(f[i].unsqueeze(0), label, all_f, mean_f, keys)
                loss_InfoNCE = li if loss_InfoNCE is None else loss_InfoNCE + li
            i += 1
        return loss_InfoNCE / i


@pytest.mark.parametrize("missing_class", [False, True])
def test_fpl_loss_equals_their_per_sample_loop(missing_class):
    from fedrcl_flwr.losses.baselines import fpl_loss

    g = torch.Generator().manual_seed(7)
    k, d, b = 5, 12, 16
    counts = [1, 3, 2, 1, 2]
    protos = {
        c: [torch.randn(1, d, generator=g, dtype=torch.float64) for _ in range(counts[c])]
        for c in range(k)
    }
    if missing_class:
        del protos[2]
    y = torch.randint(0, k, (b,), generator=g)
    y[0] = 2
    z = torch.randn(b, d, generator=g, dtype=torch.float64, requires_grad=True)
    z2 = z.detach().clone().requires_grad_(True)
    vecs = torch.cat([torch.cat(v) for v in protos.values()])
    labs = torch.tensor([c for c, v in protos.items() for _ in v])
    ours = fpl_loss(z, y, vecs, labs, k, tau=0.02, mean_over="batch")
    theirs = _TheirFPL(protos, 0.02).loss(z2, y)
    assert abs(ours.item() - theirs.item()) < 1e-10
    ours.backward()
    theirs.backward()
    assert torch.allclose(z.grad, z2.grad, atol=1e-10, rtol=0)
    valid = fpl_loss(z.detach(), y, vecs, labs, k, tau=0.02, mean_over="valid")
    n_valid = int(sum(int(c) in protos for c in y.tolist()))
    assert abs(valid.item() - ours.item() * b / n_valid) < 1e-10


def test_fpl_server_step_equals_their_proto_aggregation():
    """proto_aggregation: FINCH (finch-clust 0.2.1, their utils/finch.py's published
    version) with cosine, no early exit, the last partition; a cluster's mean per
    cluster, np.unique order; a class with one client keeps it."""
    from finch import FINCH

    from fedrcl_flwr.server.signal_exchange import SignalExchange
    from fedrcl_flwr.signals import SignalSet

    rng = np.random.default_rng(3)
    d, n_clients = 16, 9
    local = {i: {} for i in range(n_clients)}
    for i in range(n_clients):
        for c in range(4):
            if c == 3 and i != 4:
                continue  # class 3 from one client only
            centre = np.eye(d)[c * 3 + i % 3] * 4
            local[i][c] = torch.tensor((centre + rng.normal(size=d)).astype(np.float32)).view(1, -1)
    theirs: dict = {}
    for i in range(n_clients):
        for label, p in local[i].items():
            theirs.setdefault(label, []).append(p)
    for label, proto_list in theirs.items():
        if len(proto_list) > 1:
            arr = np.array([t.squeeze(0).detach().cpu().numpy().reshape(-1) for t in proto_list])
            c, _, _ = FINCH(arr, None, None, "cosine", ensure_early_exit=False, verbose=False)
            cl = np.array([c[j, -1] for j in range(c.shape[0])])
            theirs[label] = [
                torch.tensor(np.mean(arr[np.where(cl == u)], axis=0, keepdims=True))
                for u in np.unique(cl).tolist()
            ]
        else:
            theirs[label] = [proto_list[0].data]
    vecs = np.concatenate([p.numpy() for i in range(n_clients) for p in local[i].values()])
    labs = np.array([c for i in range(n_clients) for c in local[i]])
    ex = SignalExchange(
        {"global_mode": "finch_clusters", "finch_early_exit": False, "distance": "cosine"}
    )
    out = ex.compute_global(SignalSet(vecs, labs, np.ones(len(labs), np.int64)))
    assert sorted(Counter(out.labels.tolist()).items()) == sorted(
        (k, len(v)) for k, v in theirs.items()
    )
    assert max(len(v) for v in theirs.values()) > 1  # FINCH kept several clusters
    for label, protos in theirs.items():
        ours = out.vectors[out.labels == label]
        want = np.concatenate([p.numpy().reshape(1, -1) for p in protos])
        assert np.allclose(ours, want, atol=1e-6, rtol=0)


def _their_agg_func(agg_protos_label: dict) -> dict:
    """models/fpl.py ``agg_func`` over ``_train_net``'s dict of a client's features: a
    class's features summed one by one onto ``0 * first``, divided by their number."""
    out = {}
    for label, proto_list in agg_protos_label.items():
        if len(proto_list) > 1:
            proto = 0 * proto_list[0].data
            for i in proto_list:
                proto += i.data
            out[label] = proto / len(proto_list)
        else:
            out[label] = proto_list[0]
    return out


def test_fpl_official_prototypes_come_in_their_order_and_bits():
    """``variant: official``: a client's class means in order of first appearance (their
    ``agg_protos_label`` dict, filled sample by sample), equal to ``agg_func``'s bits;
    the server's global clusters class by class in order of first appearance over the
    clients in id order (their ``proto_aggregation`` over ``online_clients``), each
    cluster's mean equal to theirs to the bit."""
    from finch import FINCH

    from fedrcl_flwr.server.signal_exchange import SignalExchange
    from fedrcl_flwr.signals import SignalSet, class_cluster_signals

    g = torch.Generator().manual_seed(11)
    d, n_clients, n = 24, 6, 40
    feats = {i: torch.randn(n, d, generator=g) + i % 3 for i in range(n_clients)}
    labels = {i: torch.randint(0, 5, (n,), generator=g) for i in range(n_clients)}
    local_theirs, uploads = {}, []
    for i in range(n_clients):
        agg: dict = {}
        for f, y in zip(feats[i], labels[i]):
            agg.setdefault(y.item(), []).append(f)
        local_theirs[i] = _their_agg_func(agg)
        up = class_cluster_signals(
            feats[i].numpy(), labels[i].numpy(), mode="mean", class_order="first_seen"
        )
        assert up.labels.tolist() == list(local_theirs[i])  # their dict's order
        want = np.stack([local_theirs[i][c].numpy() for c in local_theirs[i]])
        assert np.array_equal(up.vectors, want)  # agg_func's bits
        uploads.append(up)
    theirs: dict = {}
    for i in range(n_clients):  # online_clients in id order
        for label, proto in local_theirs[i].items():
            theirs.setdefault(label, []).append(proto)
    for label, proto_list in theirs.items():
        arr = np.array([t.numpy().reshape(-1) for t in proto_list])
        c, _, _ = FINCH(arr, None, None, "cosine", ensure_early_exit=False, verbose=False)
        cl = np.array([c[j, -1] for j in range(c.shape[0])])
        theirs[label] = [
            np.mean(arr[np.where(cl == u)], axis=0, keepdims=True) for u in np.unique(cl).tolist()
        ]
    ex = SignalExchange(
        {"global_mode": "finch_clusters", "finch_early_exit": False, "class_order": "first_seen"}
    )
    out = ex.compute_global(SignalSet.concat(uploads))
    assert out.labels.tolist() == [k for k, v in theirs.items() for _ in v]
    assert list(theirs) != sorted(theirs)  # the order is not the sorted one
    assert np.array_equal(out.vectors, np.concatenate([p for v in theirs.values() for p in v]))


@pytest.mark.parametrize("mean_over", ["batch", "valid"])
def test_fpl_official_loss_is_their_per_sample_loop_to_the_bit(mean_over):
    """``fpl_loss_official`` in float32: the loss and the features' gradient equal to
    the bit those of their loop (``_TheirFPL``, keys in their dict's order, not sorted),
    a class held by one client and a class without prototypes included."""
    from fedrcl_flwr.losses.baselines import fpl_loss, fpl_loss_official

    g = torch.Generator().manual_seed(5)
    d, b = 64, 48
    order, counts = [3, 0, 7, 5, 1, 6, 2, 8, 4], [2, 3, 1, 2, 4, 2, 3, 1, 2]  # no class 9
    protos = {c: [torch.randn(1, d, generator=g) for _ in range(m)] for c, m in zip(order, counts)}
    y = torch.randint(0, 10, (b,), generator=g)
    y[:2] = 9
    z = torch.randn(b, d, generator=g, requires_grad=True)
    z2 = z.detach().clone().requires_grad_(True)
    vecs = torch.cat([torch.cat(v) for v in protos.values()])
    labs = torch.tensor([c for c, v in protos.items() for _ in v])
    ours = fpl_loss_official(z, y, vecs, labs, tau=0.02, mean_over=mean_over)
    theirs = _TheirFPL(protos, 0.02).loss(z2, y)
    if mean_over == "valid":
        theirs = theirs * b / int((y != 9).sum())
        assert abs(ours.item() - theirs.item()) < 1e-5 * abs(theirs.item())
        return
    assert ours.shape == () and torch.equal(ours, theirs.reshape(()))
    ours.backward()
    theirs.backward()
    assert torch.equal(z.grad, z2.grad)
    batched = fpl_loss(z.detach(), y, vecs, labs, 10, tau=0.02, mean_over="batch")
    assert abs(batched.item() - ours.item()) < 1e-5 * ours.item()  # one formula


def test_fpl_official_loss_without_a_known_class_is_zero():
    from fedrcl_flwr.losses.baselines import fpl_loss_official

    z = torch.randn(4, 8, requires_grad=True)
    out = fpl_loss_official(
        z, torch.tensor([5, 5, 6, 6]), torch.randn(3, 8), torch.tensor([0, 1, 1])
    )
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(z.grad, torch.zeros_like(z))


def test_fpl_official_variant_asks_the_server_for_their_order():
    from clients.fpl import FPLClient

    assert FPLClient.exchange_settings({"variant": "official"})["class_order"] == "first_seen"
    assert FPLClient.exchange_settings({})["class_order"] == "sorted"
    assert "official" in FPLClient.rules["variant"].text


# ---------------------------------------------------------------------------- ResNet-10


def test_resnet10_bn_shapes_and_width():
    from fedrcl_flwr.models import build_model

    m = build_model("resnet10_bn", num_classes=10, in_channels=3, image_size=32, params={"nf": 8})
    logits, feats = m(torch.randn(3, 3, 32, 32), return_features=True)
    assert logits.shape == (3, 10) and feats["penultimate"].shape == (3, 64)
    assert feats["layer1"].shape == (3, 8) and m.fc.in_features == 64
    # their resnet10(10, nf=64) without the unused encoder: 4 903 242 parameters
    full = build_model("resnet10_bn", num_classes=10, in_channels=3, image_size=32)
    assert sum(p.numel() for p in full.parameters()) == 4_903_242
    n_bn = sum(isinstance(x, nn.BatchNorm2d) for x in full.modules())
    assert n_bn == 1 + 4 * 2 + 3  # stem, two per block, three shortcuts


# ------------------------------------------------------------- FPL's prototype source


@pytest.mark.integration
def test_fpl_last_epoch_prototypes_are_the_last_epochs_features(tiny, tmp_path, monkeypatch):
    """proto_source last_epoch: the class means come from exactly one pass (the last of
    two local epochs) over the client's training samples, training-mode features of the
    augmented batches; after_training embeds the data once in eval mode."""
    import clients.fedproto as fedproto
    import clients.fpl as fpl
    from fedrcl_flwr.app.inprocess import run_inprocess

    seen: dict = {"last_epoch": [], "after_training": []}

    def spy(key, real):
        def f(feats, labels, **kw):
            seen[key].append((np.asarray(feats).copy(), np.asarray(labels).copy()))
            return real(feats, labels, **kw)

        return f

    monkeypatch.setattr(fpl, "class_cluster_signals", spy("last_epoch", fpl.class_cluster_signals))
    monkeypatch.setattr(
        fedproto, "class_cluster_signals", spy("after_training", fedproto.class_cluster_signals)
    )
    for source in ("last_epoch", "after_training"):
        cfg = tiny(
            federation={"rounds": 1, "clients_per_round": 2},
            client={
                "method": "fpl",
                "local_epochs": 2,
                "params": {"mean_over": "batch", "proto_source": source, "tau": 0.02},
            },
        )
        run_inprocess(cfg, tmp_path / source)
    assert len(seen["last_epoch"]) == 2 and len(seen["after_training"]) == 2
    for (fa, la), (fb, lb) in zip(seen["last_epoch"], seen["after_training"]):
        # one epoch's samples: the client's labels, each once
        assert sorted(la.tolist()) == sorted(lb.tolist())
        assert fa.shape == fb.shape
        assert not np.allclose(np.sort(fa, axis=0), np.sort(fb, axis=0))
