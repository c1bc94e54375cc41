"""FedUV (sonhamin/FedUV @ dd2e3c5) against an independent transliteration of its code.

Transliterated here from their files, not from ours: ``algs/feduv.py`` (``UVReg``: the std
hinge on the softmax, the Gaussian-potential uniformity on the projector output, the loss
``CE + std_coeff·std + unif_coeff·unif``), ``utils/dataloader.py`` (``partition_data``:
``noniid`` / ``homo`` on NumPy's global generator after ``train_fl.py``'s ``np.random.seed``)
read on torchvision's ``CIFAR10`` as their ``load_cifar10_data`` reads it, and
``train_fl.py``'s learning rate (``CosineAnnealingLR`` on a dummy optimiser, read with
``get_last_lr()`` before each round and stepped after it).
"""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.losses import univarfl as U
from fedrcl_flwr.training import round_lr

# ------------------------------------------------------------- their code, transliterated


class _TheirUVReg(nn.Module):
    """``algs/feduv.py: UVReg`` (std_coeff / unif_coeff as their argparse defaults)."""

    def __init__(self, n_classes, std_coeff=2.5, unif_coeff=0.5):
        super().__init__()
        self.std_coeff, self.unif_coeff = std_coeff, unif_coeff
        self.soft = nn.Softmax(dim=1)
        tester = torch.eye(n_classes)
        self.batch_gamma = tester.std(dim=0).mean().item()

    def forward(self, X, Y, pro1):
        pdist_x = torch.pdist(pro1, p=2).pow(2)
        sigma_unif_x = torch.median(pdist_x[pdist_x != 0])
        unif_loss = pdist_x.mul(-1 / sigma_unif_x).exp().mean()
        logsoft_out = self.soft(X)
        logsoft_out_std = logsoft_out.std(dim=0)
        std_loss = torch.mean(F.relu(self.batch_gamma - logsoft_out_std))
        return self.std_coeff * std_loss + self.unif_coeff * unif_loss, std_loss, unif_loss


def _their_local_loss(out, target, pro1, n_classes):
    """``train_net_feduv``'s step: ``loss, _ = UVReg(out, one_hot(target), pro1)``, then
    ``loss += CrossEntropyLoss()(out, target)``."""
    loss_ce = nn.CrossEntropyLoss()(out, target)
    onehot = F.one_hot(target, num_classes=n_classes).float()
    loss, std, unif = _TheirUVReg(n_classes)(out, onehot, pro1)
    return loss + loss_ce, std, unif


def _their_partition_data(y_train, partition, n_parties, beta, seed):
    """``train_fl.py: main`` seeds (``np.random.seed``, ``random.seed``,
    ``torch.manual_seed``), draws the round's clients with ``random.sample`` (Python's
    generator, not NumPy's), then ``utils/dataloader.py: partition_data``."""
    np.random.seed(seed)
    random.seed(seed)
    n_train = y_train.shape[0]
    if partition == "homo" or partition == "iid":
        idxs = np.random.permutation(n_train)
        batch_idxs = np.array_split(idxs, n_parties)
        return {i: batch_idxs[i] for i in range(n_parties)}
    min_size = 0
    min_require_size = 10
    K = 10
    N = y_train.shape[0]
    net_dataidx_map = {}
    while min_size < min_require_size:
        idx_batch = [[] for _ in range(n_parties)]
        for k in range(K):
            idx_k = np.where(y_train == k)[0]
            np.random.shuffle(idx_k)
            proportions = np.random.dirichlet(np.repeat(beta, n_parties))
            proportions = np.array(
                [p * (len(idx_j) < N / n_parties) for p, idx_j in zip(proportions, idx_batch)]
            )
            proportions = proportions / proportions.sum()
            proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            idx_batch = [
                idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))
            ]
            min_size = min([len(idx_j) for idx_j in idx_batch])
    for j in range(n_parties):
        np.random.shuffle(idx_batch[j])
        net_dataidx_map[j] = idx_batch[j]
    return net_dataidx_map


def _their_lrs(lr, rounds):
    """``train_fl.py``: ``CosineAnnealingLR(SGD(..., lr), comm_round)``; ``cur_lr =
    scheduler.get_last_lr()[0]`` at the start of each round, ``scheduler.step()`` after."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, rounds)
    out = []
    for _ in range(rounds):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


# ------------------------------------------------------------------------------ helpers


def _their_y_train(root: Path) -> np.ndarray:
    """``load_cifar10_data``: ``np.array(CIFAR10(datadir, train=True).targets)`` (torchvision's
    class with the official MD5s dropped: it then only checks that the files exist)."""
    from torchvision.datasets import CIFAR10

    class _OwnFiles(CIFAR10):
        train_list = [[name, None] for name, _ in CIFAR10.train_list]
        test_list = [[name, None] for name, _ in CIFAR10.test_list]
        meta = {**CIFAR10.meta, "md5": None}

    return np.array(_OwnFiles(str(root), train=True, download=False).targets)


def _write_cifar10(root: Path, labels: np.ndarray, n_test: int = 20):
    """cifar-10-batches-py as distributed (five training pickles, test, meta)."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    n = len(labels)
    x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    for b, chunk in enumerate(np.array_split(np.arange(n), 5), start=1):
        with open(d / f"data_batch_{b}", "wb") as f:
            pickle.dump({"labels": [int(v) for v in labels[chunk]], "data": x[chunk]}, f)
    with open(d / "test_batch", "wb") as f:
        t = rng.integers(0, 10, n_test)
        pickle.dump({"labels": [int(v) for v in t], "data": x[:n_test]}, f)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)


def _experiment(tmp_path, root, partition, clients, seed):
    exp = {
        "name": "feduv_split",
        "seed": seed,
        "dataset": {
            "name": "cifar10",
            "root": str(root),
            "verify_md5": False,
            "cache_dir": str(tmp_path / "cache"),
        },
        "partition": {"generator": "feduv", **partition},
        "federation": {"num_clients": clients, "rounds": 1, "clients_per_round": 1},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


# -------------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    "n,clients,alpha,seed", [(600, 10, 0.5, 42), (500, 10, 0.05, 0), (700, 20, 1.0, 3)]
)
def test_cli_split_is_their_partition_data(tmp_path, capsys, n, clients, alpha, seed):
    labels = np.random.default_rng(n + clients).integers(0, 10, n)
    root = tmp_path / "data"
    _write_cifar10(root, labels)
    y_train = _their_y_train(root)
    assert np.array_equal(y_train, labels)
    theirs = _their_partition_data(y_train, "noniid", clients, alpha, seed)
    part = {"scheme": "dirichlet", "alpha": alpha, "balanced": False, "min_size": 10}
    exp = _experiment(tmp_path, root, part, clients, seed)
    rc = main(["partition", str(exp), "--save", str(tmp_path / "split.json")])
    assert rc == 0, capsys.readouterr().err
    ours = json.loads((tmp_path / "split.json").read_text())
    assert sorted(ours, key=int) == [str(c) for c in range(clients)]
    for c in range(clients):
        assert ours[str(c)] == [int(i) for i in theirs[c]]  # same indices, same order
    # the FedRCL authors' unbalanced function (lists shuffled inside every try) and the
    # project's generator give other splits on the same seed
    for other in ("fedrcl", "project"):
        out = tmp_path / f"{other}.json"
        args = ["partition", str(exp), "--set", f"partition.generator={other}", "--save"]
        assert main([*args, str(out)]) == 0
        got = json.loads(out.read_text())
        assert any(got[str(c)] != ours[str(c)] for c in range(clients)), other


def test_cli_iid_split_is_their_homo_partition(tmp_path, capsys):
    labels = np.random.default_rng(1).integers(0, 10, 403)
    root = tmp_path / "data"
    _write_cifar10(root, labels)
    y_train = _their_y_train(root)
    theirs = _their_partition_data(y_train, "iid", 10, 0.5, 7)
    exp = _experiment(tmp_path, root, {"scheme": "iid"}, 10, 7)
    assert main(["partition", str(exp), "--save", str(tmp_path / "s.json")]) == 0
    ours = json.loads((tmp_path / "s.json").read_text())
    assert [ours[str(c)] for c in range(10)] == [theirs[c].tolist() for c in range(10)]
    assert sum(len(v) for v in ours.values()) == 403  # array_split: every sample used


@pytest.mark.parametrize("kw", [{"scheme": "dirichlet", "balanced": True}, {"scheme": "shards"}])
def test_feduv_generator_has_only_their_two_splits(tmp_path, capsys, kw):
    exp = {
        "name": "g",
        "dataset": {"name": "synthetic", "synthetic": {"num_train": 200, "num_test": 50}},
        "partition": {"generator": "feduv", **kw},
        "federation": {"num_clients": 4, "rounds": 1, "clients_per_round": 1},
    }
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(exp))
    assert main(["partition", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "feduv has FedUV's two splits only" in err[0], err


@pytest.mark.parametrize("seed,n,d,k", [(0, 16, 32, 10), (1, 64, 256, 10), (2, 9, 8, 100)])
def test_loss_values_and_gradients_are_theirs(seed, n, d, k):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, generator=g) * 3
    feats = torch.relu(torch.randn(n, d, generator=g))
    target = torch.randint(0, k, (n,), generator=g)
    a_logits, a_feats = logits.clone().requires_grad_(), feats.clone().requires_grad_()
    theirs, t_std, t_unif = _their_local_loss(a_logits, target, a_feats, k)
    theirs.backward()
    b_logits, b_feats = logits.clone().requires_grad_(), feats.clone().requires_grad_()
    # the univarfl client with variant feduv: CE + lam·std + mu·unif; FedUV's std_coeff
    # 2.5 and unif_coeff 0.5 are fixed (lam defaults to D/4, 2.5 only for D = 10)
    std = U.feduv_std_loss(b_logits)
    unif = U.feduv_uniformity_loss(b_feats)
    ours = F.cross_entropy(b_logits, target) + 2.5 * std + 0.5 * unif
    ours.backward()
    # the same operations in the same order: the same float32 values, not just close ones
    # (a lockstep run with their code stays bit-identical only so)
    assert torch.equal(std, t_std) and torch.equal(unif, t_unif)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(b_logits.grad, a_logits.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(b_feats.grad, a_feats.grad, rtol=1e-5, atol=1e-7)
    assert a_feats.grad.abs().sum() > 0 and a_logits.grad.abs().sum() > 0


def test_gamma_is_theirs():
    for k in (2, 10, 100):
        assert U.feduv_gamma(k, dtype=torch.float32).item() == _TheirUVReg(k).batch_gamma


@pytest.mark.parametrize("lr,rounds", [(0.01, 100), (0.1, 7)])
def test_cosine_schedule_is_their_cosine_annealing(lr, rounds):
    theirs = _their_lrs(lr, rounds)
    ours = [round_lr(lr, 1.0, t, "cosine", rounds) for t in range(1, rounds + 1)]
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-15)
    assert ours[0] == lr and ours[-1] < 0.05 * lr  # annealed to (1 + cos(π(T−1)/T)) / 2


def test_cosine_with_a_round_decay_is_one_line_exit_2(tmp_path, capsys):
    exp = {
        "name": "c",
        "dataset": {"name": "synthetic", "synthetic": {"num_train": 200, "num_test": 50}},
        "federation": {"num_clients": 4, "rounds": 1, "clients_per_round": 1},
        "client": {"lr_schedule": "cosine", "lr_decay": 0.998},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(exp))
    assert main(["partition", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'client.lr_schedule' cosine" in err[0] and str(path) in err[0], err
