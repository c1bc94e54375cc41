"""The real-dataset loaders on tiny files written in each dataset's real on-disk format
(a few images per class), loaded through the same code path as a user's data
(``load_dataset`` -> torchvision's own classes / the file readers). Each test checks
shapes, labels, pixel values (a red pixel stays red: channel order and orientation) and
the normalisation. None of them touches the network (the ``no_network`` fixture).

torchvision verifies the MD5 of every CIFAR, SVHN and STL-10 file against the official
release when loading. The tests load the tiny files two ways: (1) by default, with the
class's expected MD5s set (monkeypatch) to those of the written files, so torchvision's
own check runs and passes, and (2) with ``verify_md5=False`` (``dataset.verify_md5:
false``), the loader's switch for files that are not the official release. Without
either, the loader says which file fails the check.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import BLUE, GREEN, RED, cifar_rows, images, write_cifar10, write_pickle

from fedrcl_flwr.data.datasets import DatasetError, load_dataset

ROOT = Path(__file__).resolve().parents[2]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _check_bundle(b, x_train, y_train, x_test, y_test):
    """Pixels, labels, order, channel order and normalisation of a loaded bundle."""
    assert np.array_equal(b.train_labels, y_train)
    assert np.array_equal(b.test_labels, y_test)
    got_tr = b.train.images.permute(0, 2, 3, 1).numpy()
    got_te = b.test.images.permute(0, 2, 3, 1).numpy()
    assert got_tr.shape == x_train.shape and got_te.shape == x_test.shape
    assert np.array_equal(got_tr, x_train)
    assert np.array_equal(got_te, x_test)
    # normalisation: the training set's per-channel mean / std (computed here directly)
    mean = (x_train / 255.0).mean(axis=(0, 1, 2))
    std = (x_train / 255.0).std(axis=(0, 1, 2))
    np.testing.assert_allclose(b.train.mean.flatten().numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(b.train.std.flatten().numpy(), std, rtol=1e-5)
    x0, y0 = b.train.plain()[0]
    assert y0 == y_train[0]
    expect = (
        torch.from_numpy(x_train[0]).permute(2, 0, 1).float() / 255.0
        - torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    ) / torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    torch.testing.assert_close(x0, expect)
    if x_train.shape[-1] == 3:  # a red pixel is red after loading: channel 0 at its max
        assert torch.equal(
            b.train.images[:, :, 0, 3], torch.tensor(RED, dtype=torch.uint8).expand(len(y_train), 3)
        )
        assert torch.equal(
            b.train.images[:, :, 3, 0],
            torch.tensor(GREEN, dtype=torch.uint8).expand(len(y_train), 3),
        )


# --------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100: python pickles (cifar-10-batches-py / cifar-100-python)
# --------------------------------------------------------------------------------------


def write_cifar100(root: Path, seed=0):
    """cifar-100-python/train, test, meta with fine and coarse labels."""
    d = root / "cifar-100-python"
    d.mkdir(parents=True)
    y = np.tile(np.arange(100), 2)
    x = images(len(y), 32, 3, seed)
    yt = np.arange(100)[::-1].copy()
    xt = images(len(yt), 32, 3, seed + 1)
    for name, xx, yy in (("train", x, y), ("test", xt, yt)):
        write_pickle(
            d / name,
            {
                "filenames": [f"{name}{i}.png" for i in range(len(yy))],
                "batch_label": f"{name}ing batch 1 of 1",
                "fine_labels": yy.tolist(),
                "coarse_labels": (yy // 5).tolist(),
                "data": cifar_rows(xx),
            },
        )
    write_pickle(
        d / "meta",
        {
            "fine_label_names": [f"f{k}" for k in range(100)],
            "coarse_label_names": [f"c{k}" for k in range(20)],
        },
    )
    return x, y, xt, yt


def accept_md5(monkeypatch, cls, folder: Path) -> None:
    """Set ``cls``'s expected MD5s to those of the files written in ``folder``, so that
    torchvision's own integrity check runs on them and passes."""
    for key in ("train_list", "test_list"):
        if hasattr(cls, key) and key in vars(cls):
            monkeypatch.setattr(cls, key, [[f, _md5(folder / f)] for f, _ in getattr(cls, key)])
    if isinstance(vars(cls).get("meta"), dict):
        monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": _md5(folder / cls.meta["filename"])})
    if isinstance(vars(cls).get("split_list"), dict):
        monkeypatch.setattr(
            cls,
            "split_list",
            {
                k: [v[0], v[1], _md5(folder / v[1]) if (folder / v[1]).exists() else v[2]]
                for k, v in cls.split_list.items()
            },
        )


@pytest.mark.parametrize("verify", [True, False], ids=["md5-accepted", "verify_md5-off"])
def test_cifar10_pickles(tmp_path, monkeypatch, no_network, verify):
    import torchvision.datasets as tvd

    x, y, xt, yt = write_cifar10(tmp_path)
    if verify:
        accept_md5(monkeypatch, tvd.CIFAR10, tmp_path / "cifar-10-batches-py")
    b = load_dataset("cifar10", root=str(tmp_path), verify_md5=verify)
    assert (b.num_classes, b.in_channels, b.image_size) == (10, 3, 32)
    assert len(b.train_labels) == 50 and len(b.test_labels) == 20
    _check_bundle(b, x, y, xt, yt)
    assert b.train.augment is not None and b.train.augment.crop_pad == 4  # CIFAR aug


@pytest.mark.parametrize("verify", [True, False], ids=["md5-accepted", "verify_md5-off"])
def test_cifar100_pickles_use_fine_labels(tmp_path, monkeypatch, no_network, verify):
    import torchvision.datasets as tvd

    x, y, xt, yt = write_cifar100(tmp_path)
    if verify:
        accept_md5(monkeypatch, tvd.CIFAR100, tmp_path / "cifar-100-python")
    b = load_dataset("cifar100", root=str(tmp_path), verify_md5=verify)
    assert b.num_classes == 100
    _check_bundle(b, x, y, xt, yt)


def test_md5_mismatch_names_the_file_and_the_switch(tmp_path, no_network):
    write_cifar10(tmp_path)
    with pytest.raises(DatasetError) as err:
        load_dataset("cifar10", root=str(tmp_path))
    msg = str(err.value)
    assert "fails torchvision's MD5 check" in msg and "dataset.verify_md5: false" in msg
    assert str(tmp_path / "cifar-10-batches-py") in msg and "\n" not in msg
    # a missing file is reported as missing, with its path
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DatasetError, match=r"'cifar10' not found under .*no .*test_batch"):
        load_dataset("cifar10", root=str(tmp_path), verify_md5=False)


def test_undecodable_file_is_one_clear_error(tmp_path, no_network):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(
        DatasetError,
        match=r"torchvision.datasets.CIFAR10 cannot read the "
        r"files in .*cifar-10-batches-py",
    ):
        load_dataset("cifar10", root=str(tmp_path), verify_md5=False)


# --------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST: idx files, as distributed (.gz) or unpacked
# --------------------------------------------------------------------------------------


def _idx(data: np.ndarray) -> bytes:
    """IDX format: magic (0, 0, 0x08 = unsigned byte, ndim), big-endian int32 dims, data."""
    return (
        struct.pack(">BBBB", 0, 0, 0x08, data.ndim)
        + struct.pack(f">{data.ndim}I", *data.shape)
        + data.astype(np.uint8).tobytes()
    )


def write_idx(raw: Path, gz: bool, seed=0):
    raw.mkdir(parents=True)
    y = np.tile(np.arange(10), 3)
    x = images(len(y), 28, 1, seed)[..., 0]
    yt = np.arange(10)[::-1].copy()
    xt = images(len(yt), 28, 1, seed + 1)[..., 0]
    for prefix, xx, yy in (("train", x, y), ("t10k", xt, yt)):
        for kind, arr in (("images-idx3-ubyte", xx), ("labels-idx1-ubyte", yy)):
            path = raw / f"{prefix}-{kind}"
            if gz:
                with gzip.open(f"{path}.gz", "wb") as f:
                    f.write(_idx(arr))
            else:
                path.write_bytes(_idx(arr))
    return x[..., None], y, xt[..., None], yt


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fmnist", "FashionMNIST")])
@pytest.mark.parametrize("gz", [True, False], ids=["gz", "unpacked"])
def test_mnist_idx_files(tmp_path, no_network, name, folder, gz):
    x, y, xt, yt = write_idx(tmp_path / folder / "raw", gz)
    b = load_dataset(name, root=str(tmp_path))
    assert (b.num_classes, b.in_channels, b.image_size) == (10, 1, 28)
    _check_bundle(b, x, y, xt, yt)


# --------------------------------------------------------------------------------------
# SVHN: MATLAB .mat (X: 32 x 32 x 3 x N, y: N x 1 with 10 for the digit 0)
# --------------------------------------------------------------------------------------


def write_svhn(folder: Path, seed=0):
    from scipy.io import savemat

    folder.mkdir(parents=True)
    out = []
    for split, n_per in (("train", 3), ("test", 1)):
        digits = np.tile(np.arange(10), n_per)
        x = images(len(digits), 32, 3, seed + len(split))
        mat_y = np.where(digits == 0, 10, digits).astype(np.uint8)[:, None]
        savemat(folder / f"{split}_32x32.mat", {"X": x.transpose(1, 2, 3, 0), "y": mat_y})
        out += [x, digits]
    return out


@pytest.mark.parametrize("verify", [True, False], ids=["md5-accepted", "verify_md5-off"])
def test_svhn_mat(tmp_path, monkeypatch, no_network, verify):
    import torchvision.datasets as tvd

    x, y, xt, yt = write_svhn(tmp_path / "svhn")
    if verify:
        accept_md5(monkeypatch, tvd.SVHN, tmp_path / "svhn")
    b = load_dataset("svhn", root=str(tmp_path), verify_md5=verify)
    assert b.num_classes == 10 and b.train_labels.min() == 0  # label 10 is the digit 0
    _check_bundle(b, x, y, xt, yt)


# --------------------------------------------------------------------------------------
# USPS: libsvm text, bz2 (label 1..10 = digit + 1, 256 values in [-1, 1])
# --------------------------------------------------------------------------------------


def write_usps(folder: Path, seed=0):
    folder.mkdir(parents=True)
    out = []
    for fname, n_per in (("usps.bz2", 3), ("usps.t.bz2", 1)):
        digits = np.tile(np.arange(10), n_per)
        x = images(len(digits), 16, 1, seed + n_per)[..., 0]
        vals = x.astype(np.float64) / 255.0 * 2.0 - 1.0
        lines = [
            f"{d + 1} " + " ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(row.ravel()))
            for d, row in zip(digits, vals)
        ]
        with bz2.open(folder / fname, "wt") as f:
            f.write("\n".join(lines) + "\n")
        # the decoding the format defines (torchvision's): uint8((v + 1) / 2 * 255) in
        # float32, values as written with 6 decimals -- within one grey level of x
        v32 = np.asarray(
            [[float(f"{v:.6f}") for v in row.ravel()] for row in vals], np.float32
        ).reshape(-1, 16, 16)
        decoded = ((v32 + 1) / 2 * 255).astype(np.uint8)
        assert np.abs(decoded.astype(int) - x).max() <= 1
        out += [decoded[..., None], digits]
    return out


def test_usps_bz2_libsvm(tmp_path, no_network):
    x, y, xt, yt = write_usps(tmp_path / "usps")
    b = load_dataset("usps", root=str(tmp_path))
    assert (b.num_classes, b.in_channels, b.image_size) == (10, 1, 16)
    _check_bundle(b, x, y, xt, yt)


# --------------------------------------------------------------------------------------
# STL-10: stl10_binary/*.bin (uint8, each image 3 x 96 x 96 in column-major order;
# labels 1..10)
# --------------------------------------------------------------------------------------


def _stl_bytes(x: np.ndarray) -> bytes:
    # per image: the red, green and blue planes, each stored column by column
    return np.ascontiguousarray(x.transpose(0, 3, 2, 1)).tobytes()


def write_stl10(root: Path, seed=0):
    d = root / "stl10_binary"
    d.mkdir(parents=True)
    y = np.arange(10)
    x = images(10, 96, 3, seed)
    yt = np.arange(10)[::-1].copy()
    xt = images(10, 96, 3, seed + 1)
    (d / "train_X.bin").write_bytes(_stl_bytes(x))
    (d / "train_y.bin").write_bytes((y + 1).astype(np.uint8).tobytes())
    (d / "test_X.bin").write_bytes(_stl_bytes(xt))
    (d / "test_y.bin").write_bytes((yt + 1).astype(np.uint8).tobytes())
    (d / "unlabeled_X.bin").write_bytes(_stl_bytes(images(2, 96, 3, seed + 2)))
    (d / "class_names.txt").write_text("\n".join(f"c{k}" for k in range(10)) + "\n")
    (d / "fold_indices.txt").write_text(" ".join(map(str, range(10))) + "\n")
    return x, y, xt, yt


@pytest.mark.parametrize("verify", [True, False], ids=["md5-accepted", "verify_md5-off"])
def test_stl10_binaries(tmp_path, monkeypatch, no_network, verify):
    import torchvision.datasets as tvd

    x, y, xt, yt = write_stl10(tmp_path)
    if verify:
        accept_md5(monkeypatch, tvd.STL10, tmp_path / "stl10_binary")
    b = load_dataset("stl10", root=str(tmp_path), verify_md5=verify)
    assert (b.num_classes, b.image_size) == (10, 96)
    _check_bundle(b, x, y, xt, yt)


# --------------------------------------------------------------------------------------
# Tiny-ImageNet: tiny-imagenet-200/{wnids.txt, train/<wnid>/images/*.JPEG,
# val/images/*.JPEG + val/val_annotations.txt}
# --------------------------------------------------------------------------------------

TINY_COLORS = {"n01443537": RED, "n01629819": GREEN, "n01641577": BLUE}


def write_tinyimagenet(root: Path):
    from PIL import Image

    base = root / "tiny-imagenet-200"
    (base / "val" / "images").mkdir(parents=True)
    (base / "test" / "images").mkdir(parents=True)
    wnids = list(TINY_COLORS)[::-1]  # wnids.txt is not sorted; labels follow sorted wnids
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (base / "words.txt").write_text("".join(f"{w}\tthing {w}\n" for w in wnids))
    for w, col in TINY_COLORS.items():
        img_dir = base / "train" / w / "images"
        img_dir.mkdir(parents=True)
        boxes = []
        for i in range(3):
            Image.new("RGB", (64, 64), col).save(img_dir / f"{w}_{i}.JPEG", quality=95)
            boxes.append(f"{w}_{i}.JPEG\t0\t0\t63\t63")
        (base / "train" / w / f"{w}_boxes.txt").write_text("\n".join(boxes) + "\n")
    # a greyscale JPEG (real Tiny-ImageNet has some): decoded to three equal channels
    Image.new("L", (64, 64), 128).save(base / "train" / "n01443537" / "images" / "n01443537_9.JPEG")
    ann, val_labels = [], []
    order = ["n01641577", "n01443537", "n01629819", "n01443537"]
    for i, w in enumerate(order):
        Image.new("RGB", (64, 64), TINY_COLORS[w]).save(
            base / "val" / "images" / f"val_{i}.JPEG", quality=95
        )
        ann.append(f"val_{i}.JPEG\t{w}\t0\t0\t63\t63")
        val_labels.append(sorted(TINY_COLORS).index(w))
    (base / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")
    Image.new("RGB", (64, 64), RED).save(base / "test" / "images" / "test_0.JPEG")
    return np.asarray(val_labels)


def test_tinyimagenet_tree(tmp_path, no_network):
    val_labels = write_tinyimagenet(tmp_path)
    b = load_dataset("tinyimagenet", root=str(tmp_path))
    assert (b.num_classes, b.in_channels, b.image_size) == (3, 3, 64)
    assert np.array_equal(b.train_labels, [0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert np.array_equal(b.test_labels, val_labels)
    # class k's images carry its colour (JPEG: within a few levels); labels follow the
    # sorted wnids, so n01443537 (red) is class 0
    cols = [np.asarray(c) for c in (RED, GREEN, BLUE)]
    imgs = b.train.images.permute(0, 2, 3, 1).numpy().astype(int)
    for img, lab in zip(imgs, b.train_labels):
        if np.ptp(img) < 8 and abs(img.mean() - 128) < 4:  # the greyscale one
            continue
        assert np.abs(img - cols[lab]).max() <= 8, lab
    grey = [img for img in imgs if np.ptp(img) < 8 and abs(img.mean() - 128) < 4]
    assert len(grey) == 1 and np.array_equal(grey[0][..., 0], grey[0][..., 2])
    timgs = b.test.images.permute(0, 2, 3, 1).numpy().astype(int)
    for img, lab in zip(timgs, b.test_labels):
        assert np.abs(img - cols[lab]).max() <= 8
    x = imgs.astype(np.float64) / 255.0
    np.testing.assert_allclose(b.train.mean.flatten().numpy(), x.mean(axis=(0, 1, 2)), rtol=1e-5)


# --------------------------------------------------------------------------------------
# Image folder with domains (PACS / Office / DomainNet layout)
# --------------------------------------------------------------------------------------


def test_imagefolder_with_domains_keeps_pixels(tmp_path, no_network):
    from PIL import Image

    rng = np.random.default_rng(0)
    written = {}
    for d in ("photo", "sketch"):
        for c in ("dog", "horse"):
            folder = tmp_path / d / c
            folder.mkdir(parents=True)
            for i in range(5):
                a = rng.integers(0, 256, (8, 8, 3), np.uint8)
                a[0, 3], a[3, 0] = RED, GREEN
                Image.fromarray(a).save(folder / f"{i}.png")
                written[(d, c, i)] = a
    b = load_dataset(
        "imagefolder",
        root=str(tmp_path),
        domains=["photo", "sketch"],
        image_size=8,
        test_fraction=0.2,
        seed=0,
    )
    assert b.domain_names == ["photo", "sketch"] and b.num_classes == 2
    assert len(b.train_labels) == 16 and len(b.test_labels) == 4
    assert np.array_equal(np.bincount(b.train_domains), [8, 8])
    every = {a.tobytes(): (d, c) for (d, c, _), a in written.items()}
    for imgs, labels, doms in (
        (b.train.images, b.train_labels, b.train_domains),
        (b.test.images, b.test_labels, b.test_domains),
    ):
        for img, lab, dom in zip(imgs.permute(0, 2, 3, 1).numpy(), labels, doms):
            d, c = every[img.tobytes()]  # byte-identical to a written PNG
            assert (["photo", "sketch"][dom], ["dog", "horse"][lab]) == (d, c)
    assert torch.all(b.train.images[:, 0, 0, 3] == 255) and torch.all(
        b.train.images[:, 1:, 0, 3] == 0
    )


# --------------------------------------------------------------------------------------
# Digit-5: MNIST (idx.gz), SVHN (.mat), USPS (bz2) via torchvision + SynthDigits (npz)
# + MNIST-M (image folders), all at 32x32 RGB
# --------------------------------------------------------------------------------------


def test_digit5_all_five_real_formats(tmp_path, monkeypatch, no_network):
    from PIL import Image

    mx, my, mxt, myt = write_idx(tmp_path / "MNIST" / "raw", gz=True)
    sx, sy, sxt, syt = write_svhn(tmp_path / "svhn")
    ux, uy, uxt, uyt = write_usps(tmp_path / "usps")
    rng = np.random.default_rng(5)
    syn = {
        "x_train": rng.integers(0, 256, (20, 32, 32, 3), np.uint8),
        "y_train": np.arange(20) % 10,
        "x_test": rng.integers(0, 256, (10, 32, 32, 3), np.uint8),
        "y_test": np.arange(10),
    }
    syn["x_train"][:, 0, 3] = RED
    np.savez(tmp_path / "synthdigits.npz", **syn)
    for split, n in (("train", 2), ("test", 1)):
        for k in range(10):
            folder = tmp_path / "mnistm" / split / str(k)
            folder.mkdir(parents=True)
            for i in range(n):
                a = np.zeros((32, 32, 3), np.uint8)
                a[:] = (k * 20, 100, 200)
                a[0, 3] = RED
                Image.fromarray(a).save(folder / f"{i}.png")
    b = load_dataset("digit5", root=str(tmp_path), verify_md5=False)
    assert b.domain_names == ["mnist", "svhn", "usps", "synthdigits", "mnistm"]
    assert (b.num_classes, b.in_channels, b.image_size) == (10, 3, 32)
    counts = [len(my), len(sy), len(uy), 20, 20]
    assert np.array_equal(np.bincount(b.train_domains), counts)
    assert np.array_equal(np.bincount(b.test_domains), [len(myt), len(syt), len(uyt), 10, 10])
    starts = np.cumsum([0] + counts)
    assert np.array_equal(
        b.train_labels, np.concatenate([my, sy, uy, syn["y_train"], np.repeat(np.arange(10), 2)])
    )
    imgs = b.train.images
    # SVHN and SynthDigits are 32x32 RGB already: unchanged, red pixel stays red
    assert np.array_equal(imgs[starts[1] : starts[2]].permute(0, 2, 3, 1).numpy(), sx)
    assert np.array_equal(imgs[starts[3] : starts[4]].permute(0, 2, 3, 1).numpy(), syn["x_train"])
    assert torch.equal(
        imgs[starts[4] :, :, 0, 3], torch.tensor(RED, dtype=torch.uint8).expand(20, 3)
    )
    # MNIST / USPS: grey, resized to 32, repeated to three equal channels
    for lo, hi in ((starts[0], starts[1]), (starts[2], starts[3])):
        g = imgs[lo:hi]
        assert torch.equal(g[:, 0], g[:, 1]) and torch.equal(g[:, 0], g[:, 2])
    # the resize is the loader's antialiased bilinear: mean brightness is kept
    assert abs(imgs[: starts[1], 0].float().mean().item() - float(mx.mean())) < 2.0


# (`fedrcl-flwr run` on these CIFAR-10 files through Flower's worker processes:
# tests/strategies/test_privacy.py::test_simulation_with_secagg_client_dp_and_trackers)
