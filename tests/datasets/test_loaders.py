"""Data layer: the embedded synthetic dataset, the loaders (npz, torchvision, image
folders), normalisation / augmentation / hold-out, and the per-client batch streams."""

import hashlib
import time

import numpy as np
import pytest
import torch

from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.data.datasets import (
    DatasetError,
    ImageArrayDataset,
    iterate_batches,
    load_dataset,
)
from fedrcl_flwr.data.sources.synthetic import make_synthetic
from fedrcl_flwr.run.runtime import make_batches, sample_partitions

SMALL = {
    "num_train": 600,
    "num_test": 200,
    "num_classes": 4,
    "image_size": 16,
    "channels": 3,
    "subclusters": 2,
}


@pytest.fixture(scope="module")
def small_bundle():
    return load_dataset("synthetic", synthetic=SMALL, seed=0)


def _rows(x: np.ndarray) -> list:
    """One hash per image (to compare sets of images)."""
    return sorted(hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest() for a in x)


# --------------------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------------------


def _syn(**kw):
    args = dict(num_train=400, num_test=100, num_classes=4, image_size=16, subclusters=2)
    args.update(kw)
    return make_synthetic(**args)


def test_synthetic_is_deterministic_by_seed():
    a, b, c = _syn(seed=3), _syn(seed=3), _syn(seed=4)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and np.array_equal(u, v)
    assert not np.array_equal(a[0], c[0])  # train images
    assert not np.array_equal(a[3], c[3])  # test images
    assert not np.array_equal(a[1], c[1])  # label order


def test_synthetic_does_not_touch_global_rngs():
    torch.manual_seed(0)
    np.random.seed(0)
    before = (torch.rand(3), np.random.rand(3))
    torch.manual_seed(0)
    np.random.seed(0)
    _syn()
    after = (torch.rand(3), np.random.rand(3))
    assert torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1])


@pytest.mark.parametrize("channels", [1, 3])
def test_synthetic_shapes_dtypes_and_class_balance(channels):
    xtr, ytr, dtr, xte, yte, dte = _syn(
        num_train=400, num_test=120, num_classes=4, image_size=12, channels=channels
    )
    assert xtr.shape == (400, 12, 12, channels) and xtr.dtype == np.uint8
    assert xte.shape == (120, 12, 12, channels) and xte.dtype == np.uint8
    for a in (ytr, dtr, yte, dte):
        assert a.dtype == np.int64
    assert np.array_equal(np.bincount(ytr), [100] * 4)
    assert np.array_equal(np.bincount(yte), [30] * 4)
    assert not np.any(dtr) and not np.any(dte)  # one domain: all zero
    # labels come shuffled, not in blocks
    assert len(np.unique(ytr[:20])) > 1
    # images use the uint8 range, not a constant
    assert xtr.min() < 40 and xtr.max() > 215


def test_synthetic_domains_present_balanced_and_different():
    xtr, ytr, dtr, xte, yte, dte = _syn(num_train=1200, num_test=240, num_domains=3)
    assert set(np.unique(dtr)) == {0, 1, 2} and set(np.unique(dte)) == {0, 1, 2}
    # every domain holds every class in equal numbers
    for d in range(3):
        assert np.array_equal(np.bincount(ytr[dtr == d], minlength=4), [100] * 4)
    # each domain has its own look: per-channel mean and std differ
    sig = []
    for d in range(3):
        px = xtr[dtr == d].reshape(-1, 3).astype(np.float64)
        sig.append(np.concatenate([px.mean(0), px.std(0)]))
    for i in range(3):
        for j in range(i + 1, 3):
            assert np.linalg.norm(sig[i] - sig[j]) > 8.0, (i, j, sig)


def test_synthetic_full_size_generation_is_fast():
    t0 = time.perf_counter()
    xtr, ytr, dtr, xte, yte, dte = make_synthetic(
        num_train=20000, num_test=4000, image_size=32, channels=3, seed=0
    )
    elapsed = time.perf_counter() - t0
    assert xtr.shape == (20000, 32, 32, 3) and xte.shape == (4000, 32, 32, 3)
    assert elapsed < 30.0, f"generating 24k 32x32x3 images took {elapsed:.1f}s"


def _ncm_accuracy(xtr, ytr, xte, yte, k):
    a = xtr.reshape(len(xtr), -1).astype(np.float32) / 255
    b = xte.reshape(len(xte), -1).astype(np.float32) / 255
    mu = np.stack([a[ytr == c].mean(0) for c in range(k)])
    d = (b**2).sum(1)[:, None] - 2 * b @ mu.T + (mu**2).sum(1)[None]
    return float((d.argmin(1) == yte).mean())


def test_synthetic_is_learnable_but_not_trivial():
    k = 10
    xtr, ytr, _, xte, yte, _ = make_synthetic(
        num_train=2000, num_test=1000, num_classes=k, image_size=16, seed=0
    )
    acc = _ncm_accuracy(xtr, ytr, xte, yte, k)
    assert acc > 0.6, f"nearest-class-mean accuracy {acc:.3f} (chance 0.1)"
    # ... and the samples of a class are not copies of one image
    for c in range(k):
        xc = xtr[ytr == c].astype(np.float64) / 255
        assert xc.std(axis=0).mean() > 0.05
        assert len(_rows(xtr[ytr == c])) == len(set(_rows(xtr[ytr == c])))
    # train and test share the class structure but not the samples
    assert not set(_rows(xtr)) & set(_rows(xte))


def _pooled(x, f=4):
    t = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255
    return torch.nn.functional.avg_pool2d(t, f).flatten(1).double().numpy()


def _mean_within_class_distance(x, y, k):
    z = _pooled(x)  # average-pool away the pixel noise; the patterns are smooth
    out = []
    for c in range(k):
        zc = z[y == c]
        sq = (zc**2).sum(1)
        d2 = np.maximum(sq[:, None] + sq[None] - 2 * zc @ zc.T, 0)
        out.append(np.sqrt(d2[np.triu_indices(len(zc), 1)]).mean())
    return float(np.mean(out))


@pytest.mark.parametrize("seed", [0, 1])
def test_synthetic_subclusters_add_intra_class_spread(seed):
    # FedCCL's clustering needs intra-class structure: with 3 sub-cluster prototypes per
    # class the samples of a class spread clearly more than with a single prototype.
    kw = dict(num_train=1500, num_test=10, num_classes=5, image_size=16, seed=seed)
    one = _mean_within_class_distance(*make_synthetic(subclusters=1, **kw)[:2], 5)
    three = _mean_within_class_distance(*make_synthetic(subclusters=3, **kw)[:2], 5)
    assert three > 1.05 * one, (one, three)


def test_load_dataset_synthetic_bundle(small_bundle):
    b = small_bundle
    assert b.name == "synthetic" and b.num_classes == 4 and b.in_channels == 3
    assert b.image_size == 16 and len(b.train) == 600 and len(b.test) == 200
    assert b.train_domains is None and b.domain_names == []
    assert np.array_equal(b.train_labels, b.train.labels)
    x, y = b.train[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and isinstance(y, int)


def test_load_dataset_synthetic_domains_and_image_size():
    b = load_dataset(
        "synthetic", synthetic={**SMALL, "num_domains": 2}, image_size=8, augment=False
    )
    assert b.image_size == 8 and tuple(b.train.images.shape[1:]) == (3, 8, 8)
    assert b.domain_names == ["domain0", "domain1"]
    assert set(np.unique(b.train_domains)) == {0, 1} and len(b.train_domains) == 600
    assert len(b.test_domains) == 200
    assert b.train.augment is None


# --------------------------------------------------------------------------------------
# npz files
# --------------------------------------------------------------------------------------


def _save_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_npz_grayscale_uint8(tmp_path):
    rng = np.random.default_rng(0)
    xtr = rng.integers(0, 256, (30, 10, 10), dtype=np.uint8)
    xte = rng.integers(0, 256, (12, 10, 10), dtype=np.uint8)
    ytr, yte = np.arange(30) % 3, np.arange(12) % 3
    p = _save_npz(tmp_path / "g.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    b = load_dataset("npz", path=p, normalize=False)
    assert b.in_channels == 1 and b.image_size == 10 and b.num_classes == 3
    assert b.train.images.dtype == torch.uint8
    assert torch.equal(b.train.images[:, 0], torch.from_numpy(xtr))
    assert torch.equal(b.test.images[:, 0], torch.from_numpy(xte))
    assert np.array_equal(b.train_labels, ytr) and b.train_labels.dtype == np.int64
    # normalize=False: inputs are just pixel / 255
    x, _ = b.test.get_batch(np.arange(12))
    assert torch.allclose(x[:, 0], torch.from_numpy(xte).float() / 255)


def test_npz_float01_nhwc_is_scaled_to_uint8(tmp_path):
    rng = np.random.default_rng(1)
    xtr = rng.random((20, 8, 8, 3)).astype(np.float32)
    xte = rng.random((6, 8, 8, 3)).astype(np.float64)
    p = _save_npz(
        tmp_path / "f.npz",
        x_train=xtr,
        y_train=np.arange(20) % 2,
        x_test=xte,
        y_test=np.arange(6) % 2,
    )
    b = load_dataset("npz", path=p)
    assert b.in_channels == 3 and b.image_size == 8
    want = np.rint(xtr.astype(np.float64) * 255).astype(np.uint8).transpose(0, 3, 1, 2)
    assert np.array_equal(b.train.images.numpy(), want)


def test_npz_nchw_and_domains(tmp_path):
    rng = np.random.default_rng(2)
    xtr = rng.integers(0, 256, (16, 3, 9, 9), dtype=np.uint8)  # channels first
    p = _save_npz(
        tmp_path / "c.npz",
        x_train=xtr,
        y_train=np.arange(16) % 2,
        x_test=xtr[:4],
        y_test=np.arange(4) % 2,
        d_train=np.arange(16) % 2,
        d_test=np.arange(4) % 2,
    )
    b = load_dataset("npz", path=p)
    assert np.array_equal(b.train.images.numpy(), xtr)
    assert np.array_equal(b.train_domains, np.arange(16) % 2)


def test_npz_different_sizes_need_image_size(tmp_path):
    rng = np.random.default_rng(3)
    p = _save_npz(
        tmp_path / "s.npz",
        x_train=rng.integers(0, 256, (10, 20, 20, 3)),
        y_train=np.arange(10) % 2,
        x_test=rng.integers(0, 256, (4, 24, 24, 3)),
        y_test=np.arange(4) % 2,
    )
    with pytest.raises(DatasetError, match="differ; set dataset.image_size"):
        load_dataset("npz", path=p)
    b = load_dataset("npz", path=p, image_size=16)
    assert tuple(b.train.images.shape) == (10, 3, 16, 16)
    assert tuple(b.test.images.shape) == (4, 3, 16, 16)
    assert b.image_size == 16


def test_npz_resize_keeps_content():
    # a constant image stays constant after resizing (antialiased bilinear)
    from fedrcl_flwr.data.sources.raw import resize_u8 as _resize_u8

    x = np.full((2, 20, 20, 3), 77, np.uint8)
    assert np.all(_resize_u8(x, 8) == 77)


def test_npz_errors(tmp_path):
    with pytest.raises(DatasetError, match=r"does not exist \(dataset.path\)"):
        load_dataset("npz", path=str(tmp_path / "nope.npz"))
    with pytest.raises(DatasetError, match="dataset.path is required"):
        load_dataset("npz", path=None)
    x = np.zeros((5, 4, 4), np.uint8)
    p = _save_npz(tmp_path / "k.npz", x_train=x, y_train=np.zeros(5))
    with pytest.raises(DatasetError, match="missing array.*x_test, y_test"):
        load_dataset("npz", path=p)
    p = _save_npz(tmp_path / "l.npz", x_train=x, y_train=np.zeros(4), x_test=x, y_test=np.zeros(5))
    with pytest.raises(DatasetError, match="x_train has 5 images but y_train has 4 labels"):
        load_dataset("npz", path=p)
    p = _save_npz(tmp_path / "n.npz", x_train=x, y_train=-np.ones(5), x_test=x, y_test=np.zeros(5))
    with pytest.raises(DatasetError, match="negative labels"):
        load_dataset("npz", path=p)
    p = _save_npz(
        tmp_path / "d.npz",
        x_train=x,
        y_train=np.zeros(5),
        x_test=x,
        y_test=np.zeros(5),
        d_train=np.zeros(7),
    )
    with pytest.raises(DatasetError, match="d_train has 7 domain ids but y_train has 5"):
        load_dataset("npz", path=p)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(DatasetError, match="not a readable .npz"):
        load_dataset("npz", path=str(tmp_path / "junk.npz"))
    p = _save_npz(
        tmp_path / "e.npz",
        x_train=np.zeros((0, 4, 4), np.uint8),
        y_train=np.zeros(0),
        x_test=x,
        y_test=np.zeros(5),
    )
    with pytest.raises(DatasetError, match="no training images"):
        load_dataset("npz", path=p)
    assert issubclass(DatasetError, ConfigError)


def test_unknown_dataset_name():
    with pytest.raises(DatasetError, match="unknown dataset 'imagenet'"):
        load_dataset("imagenet")


# --------------------------------------------------------------------------------------
# torchvision datasets: never downloaded unless asked, clear error when missing
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["cifar10", "cifar100", "mnist", "fmnist", "svhn", "usps", "stl10"]
)
def test_missing_torchvision_dataset_says_where_and_how(name, tmp_path, no_network):
    root = tmp_path / "empty_root"
    root.mkdir()
    with pytest.raises(DatasetError) as err:
        load_dataset(name, root=str(root), download=False)
    msg = str(err.value)
    assert str(root) in msg
    assert "dataset.download: true" in msg
    assert f"'{name}' not found" in msg
    assert "\n" not in msg


def test_missing_digit5_and_tinyimagenet(tmp_path, no_network):
    with pytest.raises(
        DatasetError,
        match="Digit-5 domain 'synthdigits' not found.*cannot be downloaded automatically",
    ):
        load_dataset("digit5", root=str(tmp_path), domains=["synthdigits"])
    with pytest.raises(DatasetError, match="'tinyimagenet' not found under"):
        load_dataset("tinyimagenet", root=str(tmp_path))


def test_digit5_from_local_npz_domains(tmp_path, no_network):
    rng = np.random.default_rng(0)
    for name in ("synthdigits", "mnistm"):
        np.savez(
            tmp_path / f"{name}.npz",
            x_train=rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
            y_train=np.arange(20) % 10,
            x_test=rng.integers(0, 256, (10, 28, 28), dtype=np.uint8),
            y_test=np.arange(10) % 10,
        )
    b = load_dataset("digit5", root=str(tmp_path), domains=["synthdigits", "mnistm"])
    assert tuple(b.train.images.shape) == (40, 3, 32, 32)  # resized, grey -> RGB
    assert b.domain_names == ["synthdigits", "mnistm"]
    assert np.array_equal(np.bincount(b.train_domains), [20, 20])
    assert np.array_equal(np.bincount(b.test_domains), [10, 10])


# --------------------------------------------------------------------------------------
# Image folders (trees generated in tmp_path)
# --------------------------------------------------------------------------------------

COLORS = {"cat": (220, 30, 30), "dog": (30, 30, 220)}


def _write_images(folder, color, n, size=12, start=0):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        a = np.zeros((size, size, 3), np.uint8)
        a[:] = color
        a[0, 0] = (i * 10, i * 10, i * 10)  # each file is distinct
        Image.fromarray(a).save(folder / f"img{start + i:03d}.png")


def _tree(root, n=5, split=False, shade=0, size=12):
    for cname, col in COLORS.items():
        col = tuple(min(255, c + shade) for c in col)
        if split:
            _write_images(root / "train" / cname, col, n, size)
            _write_images(root / "test" / cname, col, 2, size, start=100)
        else:
            _write_images(root / cname, col, n, size)
    (root / "notes.txt").write_text("not an image")


def test_imagefolder_without_split_holds_out_test_fraction(tmp_path):
    _tree(tmp_path, n=5)
    b = load_dataset(
        "imagefolder", root=str(tmp_path), image_size=8, test_fraction=0.2, normalize=False
    )
    assert b.num_classes == 2 and b.in_channels == 3 and b.image_size == 8
    # 5 per class, round(0.2 * 5) = 1 per class for testing
    assert np.array_equal(np.bincount(b.train_labels), [4, 4])
    assert np.array_equal(np.bincount(b.test_labels), [1, 1])
    assert b.train_domains is None and b.domain_names == []
    # classes in sorted folder order: cat (red) = 0, dog (blue) = 1
    imgs = b.train.images.float()
    red = imgs[b.train_labels == 0].mean(dim=(0, 2, 3))
    blue = imgs[b.train_labels == 1].mean(dim=(0, 2, 3))
    assert red[0] > 150 and red[2] < 80 and blue[2] > 150 and blue[0] < 80
    train_test = _rows(b.train.images.numpy()) + _rows(b.test.images.numpy())
    assert len(set(train_test)) == 10  # disjoint, and all ten images used


def test_imagefolder_holdout_is_seeded(tmp_path):
    _tree(tmp_path, n=12)

    def held_out(seed):
        b = load_dataset(
            "imagefolder",
            root=str(tmp_path),
            image_size=8,
            test_fraction=0.25,
            seed=seed,
            normalize=False,
        )
        assert np.array_equal(np.bincount(b.test_labels), [3, 3])
        return set(_rows(b.test.images.numpy()))

    first = held_out(0)
    assert held_out(0) == first and held_out(0) == first
    assert any(held_out(s) != first for s in (1, 2))


def test_imagefolder_default_size(tmp_path):
    _tree(tmp_path, n=3)
    b = load_dataset("imagefolder", root=str(tmp_path), test_fraction=0.34)
    assert b.image_size == 64  # image folders are resized to 64 unless image_size is set


def test_imagefolder_with_train_test_split(tmp_path):
    _tree(tmp_path, n=3, split=True)
    b = load_dataset("imagefolder", root=str(tmp_path), image_size=12)
    assert np.array_equal(np.bincount(b.train_labels), [3, 3])
    assert np.array_equal(np.bincount(b.test_labels), [2, 2])
    assert b.image_size == 12


def test_imagefolder_with_domains(tmp_path):
    _tree(tmp_path / "d1", n=4, shade=0)
    _tree(tmp_path / "d2", n=6, shade=35, split=True)
    b = load_dataset(
        "imagefolder",
        root=str(tmp_path),
        domains=["d1", "d2"],
        image_size=8,
        test_fraction=0.25,
        normalize=False,
    )
    assert b.domain_names == ["d1", "d2"]
    assert b.num_classes == 2
    # d1: 4 per class, 1 held out; d2: its own train (6) / test (2) folders
    assert np.array_equal(np.bincount(b.train_domains), [6, 12])
    assert np.array_equal(np.bincount(b.test_domains), [2, 4])
    assert len(b.train_domains) == len(b.train)
    # the domain ids point at the right images (d2 is brighter)
    g = b.train.images[:, 1].float().mean(dim=(1, 2)).numpy()
    assert g[b.train_domains == 0].max() < g[b.train_domains == 1].min()


def test_imagefolder_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset("imagefolder", root=str(tmp_path / "missing"))
    _tree(tmp_path / "d1", n=2)
    with pytest.raises(DatasetError, match="domain folder .*d9 does not exist"):
        load_dataset("imagefolder", root=str(tmp_path), domains=["d1", "d9"])
    _write_images(tmp_path / "d3" / "bird", (0, 200, 0), 2)
    with pytest.raises(DatasetError, match="every domain needs the same classes"):
        load_dataset("imagefolder", root=str(tmp_path), domains=["d1", "d3"])
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(DatasetError, match="no images found"):
        load_dataset("imagefolder", root=str(tmp_path / "empty"))


# --------------------------------------------------------------------------------------
# Hold-out, normalisation, augmentation, batch iteration
# --------------------------------------------------------------------------------------


def test_val_fraction_is_a_stratified_disjoint_holdout():
    syn = {**SMALL, "num_train": 800}
    full = load_dataset("synthetic", synthetic=syn, seed=0)
    b = load_dataset("synthetic", synthetic=syn, seed=0, val_fraction=0.1)
    assert b.val is not None and full.val is None
    assert len(b.val) == 80 and len(b.train) == 720
    assert np.array_equal(np.bincount(b.val.labels), [20] * 4)
    assert np.array_equal(np.bincount(b.train_labels), [180] * 4)
    assert b.val.augment is None
    # train + val are exactly the full training set, without overlap
    tr, va = _rows(b.train.images.numpy()), _rows(b.val.images.numpy())
    assert not set(tr) & set(va)
    assert sorted(tr + va) == _rows(full.train.images.numpy())
    # domains are cut along with the images
    d = load_dataset("synthetic", synthetic={**syn, "num_domains": 2}, val_fraction=0.25)
    assert len(d.train_domains) == len(d.train) == 600


def test_val_fraction_is_seeded():
    a = load_dataset("synthetic", synthetic=SMALL, seed=0, val_fraction=0.2)
    b = load_dataset("synthetic", synthetic=SMALL, seed=0, val_fraction=0.2)
    assert torch.equal(a.val.images, b.val.images)


def test_normalisation_gives_zero_mean_unit_std_on_train(small_bundle):
    x, _ = small_bundle.train.plain().get_batch(np.arange(len(small_bundle.train)))
    mean, std = x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3))
    assert torch.allclose(mean, torch.zeros(3), atol=1e-3)
    assert torch.allclose(std, torch.ones(3), atol=1e-2)
    # the test set uses the training statistics (close, not exact)
    xt, _ = small_bundle.test.get_batch(np.arange(len(small_bundle.test)))
    assert xt.mean(dim=(0, 2, 3)).abs().max() < 0.2
    # normalize=False: plain pixel / 255
    raw = load_dataset("synthetic", synthetic=SMALL, normalize=False, augment=False)
    x, _ = raw.train.get_batch(np.arange(5))
    assert torch.allclose(x, raw.train.images[:5].float() / 255)


def test_constant_channel_does_not_divide_by_zero(tmp_path):
    x = np.zeros((6, 8, 8, 3), np.uint8)
    x[..., 0] = np.arange(6)[:, None, None] * 40
    p = _save_npz(
        tmp_path / "c.npz", x_train=x, y_train=np.arange(6) % 2, x_test=x, y_test=np.arange(6) % 2
    )
    b = load_dataset("npz", path=p, augment=False)
    xb, _ = b.train.get_batch(np.arange(6))
    assert torch.isfinite(xb).all()


def test_augmentation_is_seeded_and_plain_is_not_augmented(small_bundle):
    ds = small_bundle.train
    assert ds.augment is not None and ds.augment.crop_pad == 2 and ds.augment.flip
    idx = np.arange(64)
    a, ya = ds.get_batch(idx, generator=torch.Generator().manual_seed(7))
    b, yb = ds.get_batch(idx, generator=torch.Generator().manual_seed(7))
    c, _ = ds.get_batch(idx, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and torch.equal(ya, yb)
    assert not torch.equal(a, c)
    plain = ds.plain()
    assert plain.augment is None and plain.images is ds.images  # no copy of the data
    p1, yp = plain.get_batch(idx, generator=torch.Generator().manual_seed(7))
    p2, _ = plain.get_batch(idx)
    assert torch.equal(p1, p2) and torch.equal(yp, ya)
    assert torch.allclose(p1, (ds.images[:64].float() / 255 - ds.mean) / ds.std)
    assert not torch.equal(a, p1)  # augmentation changed something
    # ... but only by crops (zero padding 2) and flips: every augmented image is one of
    # the 5 x 5 x 2 shifted / flipped copies of its plain image
    padded = torch.nn.functional.pad(p1, (2, 2, 2, 2))
    h, w = p1.shape[2:]
    cands = [padded[:, :, oy : oy + h, ox : ox + w] for oy in range(5) for ox in range(5)]
    cands = torch.stack(cands + [c.flip(3) for c in cands], 1)  # (B, 50, C, H, W)
    match = (cands == a[:, None]).flatten(2).all(2)
    assert match.any(1).all()
    assert match[:, 12].sum() < len(idx)  # not all un-shifted, un-flipped
    # the test split is never augmented
    assert small_bundle.test.augment is None


def test_npz_is_not_augmented_unless_asked(tmp_path):
    """Your own arrays (digits, text, ...) get no flip or crop by default; the
    dataset keys opt in. Image folders (natural images) keep their crop + flip."""
    from fedrcl_flwr.augment import AugmentSpec
    from fedrcl_flwr.config import DatasetConfig
    from fedrcl_flwr.data.cache import store
    from fedrcl_flwr.data.datasets import augment_spec

    x = np.random.default_rng(0).integers(0, 256, (8, 8, 8), dtype=np.uint8)
    p = _save_npz(
        tmp_path / "d.npz", x_train=x, y_train=np.arange(8) % 2, x_test=x, y_test=np.arange(8) % 2
    )
    assert load_dataset("npz", path=p).train.augment is None
    bundle, _ = store.load(DatasetConfig(name="npz", path=p, cache_dir=str(tmp_path / "c")), 0)
    assert bundle.train.augment is None  # what a run trains on
    opted = load_dataset("npz", path=p, crop_pad=2, flip=True)
    assert opted.train.augment == AugmentSpec(2, True)
    assert augment_spec("npz", 8, True, rotation=10) == AugmentSpec(0, False, 10.0)
    assert augment_spec("imagefolder", 64, True) == AugmentSpec(8, True)
    assert augment_spec("cifar10", 32, True, flip=False) == AugmentSpec(4, False)
    assert augment_spec("cifar10", 32, False, flip=True) is None  # augment: false wins


def test_flip_only_augmentation():
    from fedrcl_flwr.augment import AugmentSpec

    imgs = torch.arange(2 * 1 * 2 * 3, dtype=torch.uint8).view(2, 1, 2, 3).repeat(50, 1, 1, 1)
    ds = ImageArrayDataset(imgs, np.zeros(100), [0.0], [1.0], AugmentSpec(0, True))
    x, _ = ds.get_batch(np.arange(100), generator=torch.Generator().manual_seed(0))
    base = imgs.float() / 255
    flipped = (x == base.flip(3)).flatten(1).all(1)
    same = (x == base).flatten(1).all(1)
    assert torch.all(flipped | same)
    assert 20 < int(flipped.sum()) < 80  # about half of them


def test_iterate_batches_in_order_and_unaugmented(small_bundle):
    ds = small_bundle.train
    idx = np.array([5, 3, 99, 0, 7, 42, 1], dtype=np.int64)
    batches = list(iterate_batches(ds, idx, batch_size=3))
    assert [len(y) for _, y in batches] == [3, 3, 1]
    xs = torch.cat([x for x, _ in batches])
    ys = torch.cat([y for _, y in batches])
    assert np.array_equal(ys.numpy(), small_bundle.train_labels[idx])
    want, _ = ds.plain().get_batch(idx)
    assert torch.equal(xs, want)
    assert list(iterate_batches(ds, np.array([], dtype=np.int64), 4)) == []


def test_iterate_batches_on_a_plain_torch_dataset():
    class Tiny(torch.utils.data.Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return torch.full((1, 2, 2), float(i)), i

    out = list(iterate_batches(Tiny(), [4, 2, 0], 2))
    assert [y.tolist() for _, y in out] == [[4, 2], [0]]
    assert out[0][0][:, 0, 0, 0].tolist() == [4.0, 2.0]


# --------------------------------------------------------------------------------------
# runtime: per-client batch streams and client sampling
# --------------------------------------------------------------------------------------


def _epoch(batches, epoch):
    return [(x, y) for x, y in batches(epoch)]


def test_make_batches_is_seeded_and_covers_each_index_once(small_bundle):
    ds = small_bundle.train
    idx = np.arange(3, 600, 4)  # 150 indices
    b1 = make_batches(ds, idx, batch_size=32, seed=11)
    b2 = make_batches(ds, idx, batch_size=32, seed=11)
    e1, e2 = _epoch(b1, 0), _epoch(b2, 0)
    assert [len(y) for _, y in e1] == [32, 32, 32, 32, 22]
    for (xa, ya), (xb, yb) in zip(e1, e2):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # one epoch = every index exactly once: the labels' multiset matches, and each
    # sample's un-augmented image occurs once (augmentation only moves pixels around)
    ys = torch.cat([y for _, y in e1]).numpy()
    assert np.array_equal(np.sort(ys), np.sort(small_bundle.train_labels[idx]))
    # different epochs and different seeds give different orders / augmentations
    e_next = _epoch(b1, 1)
    assert not torch.equal(torch.cat([y for _, y in e1]), torch.cat([y for _, y in e_next]))
    assert not torch.equal(e1[0][0], e_next[0][0])
    e_other = _epoch(make_batches(ds, idx, 32, seed=12), 0)
    assert not torch.equal(e1[0][0], e_other[0][0])
    # re-running an epoch replays it exactly (no hidden state between epochs)
    again = _epoch(b1, 0)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(e1, again))


def test_make_batches_order_is_a_permutation_per_epoch():
    # a dataset that reports which indices it was asked for
    class Probe:
        def __init__(self):
            self.asked = []

        def get_batch(self, chunk, generator=None):
            self.asked.append(np.asarray(chunk).copy())
            return torch.as_tensor(chunk), torch.as_tensor(chunk)

    idx = np.arange(100, 200)
    orders = []
    for epoch in range(3):
        probe = Probe()
        list(make_batches(probe, idx, 16, seed=0)(epoch))
        order = np.concatenate(probe.asked)
        assert np.array_equal(np.sort(order), idx)  # each index exactly once
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[1], orders[2])
    probe = Probe()
    list(make_batches(probe, idx, 16, seed=0)(0))
    assert np.array_equal(np.concatenate(probe.asked), orders[0])


def test_make_batches_on_a_dataset_without_get_batch():
    class Tiny(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return torch.tensor([float(i)]), i

    ys = torch.cat([y for _, y in make_batches(Tiny(), np.arange(10), 4, seed=0)(0)])
    assert sorted(ys.tolist()) == list(range(10))


def test_sample_partitions_depends_only_on_its_arguments():
    a = sample_partitions(0, 3, 100, 5)
    np.random.seed(123)
    torch.manual_seed(123)
    np.random.rand(7)
    b = sample_partitions(0, 3, 100, 5)
    assert a == b
    assert len(a) == 5 and a == sorted(set(a)) and all(0 <= i < 100 for i in a)
    assert all(isinstance(i, int) for i in a)
    rounds = [tuple(sample_partitions(0, r, 100, 5)) for r in range(1, 21)]
    assert len(set(rounds)) >= 19  # different rounds, different clients
    assert sample_partitions(1, 3, 100, 5) != a
    assert sample_partitions(0, 3, 10, 10) == list(range(10))
    # over many rounds every client gets picked
    seen = set().union(*[sample_partitions(0, r, 20, 2) for r in range(200)])
    assert seen == set(range(20))
    with pytest.raises(ValueError):
        sample_partitions(0, 1, 10, 11)
    with pytest.raises(ValueError):
        sample_partitions(0, 1, 10, 0)
